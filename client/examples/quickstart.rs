//! Store two pages, find a near-duplicate, and ask the crawl frontier's question.
//! Run against a server: `cargo run -p neardup-client --example quickstart`.
use neardup_client::{Client, ClientError, doc, text_doc};

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let server = std::env::var("NEARDUP_SERVER").unwrap_or("http://127.0.0.1:50051".into());
    let client = Client::connect(&server).await?;

    let fp = 0x5EED_0000_0000_0000;
    client.insert(vec![doc("https://example.org/rust/1", fp, 1_700_000_000_000)]).await?;
    let hits = client.query(fp ^ 0b111, Some(3), 10).await?; // 3 bits away
    println!("found {} at distance {}", hits.matches[0].id, hits.matches[0].distance);

    // Admission: is this page a near-duplicate of anything seen? Stored either way.
    let page = "Rust is a language empowering everyone to build reliable software.";
    let first = text_doc("https://example.org/rust/2", page, 1_700_000_001_000);
    let again = text_doc("https://example.org/rust/3", page, 1_700_000_002_000);
    let a = client.check_and_insert(first, None, 10, false).await?;
    let b = client.check_and_insert(again, None, 10, false).await?;
    println!("rust/2 duplicate: {}", a.duplicate);
    println!("rust/3 duplicate: {}, original: {}", b.duplicate, b.original_id);
    Ok(())
}
