//! `neardup-bench service --tls`: what TLS on the public API costs.
//!
//! Two `neardup serve` processes hold the same documents: one plaintext, one with TLS
//! (a CA and a server certificate for 127.0.0.1 made by `neardup cert`, rustls with the ring
//! provider). Each round measures both, in turns whose order alternates from round to round,
//! so that the machine's other work falls on both alike:
//! - QueryBatch throughput: `--batch-queries` queries over `--batch-streams` streams, each on
//!   a connection of its own (made before the clock starts);
//! - unary Query latency: `--tls-unary-calls` calls one after another on one connection
//!   (closed loop: every call waits for the one before), p50 and p99.
//!
//! Both servers are measured through the same Rust client, so the difference is TLS alone.
//! The report gives each round's figures, the medians over the rounds, and the ratios:
//! QueryBatch with TLS against plaintext, and the unary p50 added by TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, ClientTls};
use serde_json::{Value, json};

use crate::fingerprint::median;
use crate::free_port;
use crate::latency::Latencies;
use crate::service::{ServerProcess, ServiceArgs, insert_range, query_batch_streams, settle};

/// One server of the comparison and its clients.
struct Side {
    name: &'static str,
    /// The process, stopped when this is dropped.
    _server: ServerProcess,
    /// One client (connection) per QueryBatch stream; the first also makes the unary calls.
    clients: Vec<Client>,
}

/// Runs the comparison; the report as one JSON object.
pub(crate) async fn run(
    args: &ServiceArgs,
    base: &Path,
    fps: Arc<Vec<u64>>,
    queries: Arc<Vec<u64>>,
) -> Result<Value, String> {
    let pki = base.join("pki");
    make_pki(&args.neardup(), &pki)?;
    let ca_pem = std::fs::read(pki.join("ca.pem")).map_err(|e| e.to_string())?;
    let tls_sets = [
        format!("tls.cert_file={}", pki.join("server.pem").display()),
        format!("tls.key_file={}", pki.join("server.key").display()),
    ];
    let mut sides = Vec::new();
    for (name, sets, tls) in [
        ("plaintext", &[][..], None),
        ("tls", &tls_sets[..], Some(ClientTls { ca_pem: ca_pem.clone(), domain: None })),
    ] {
        let server = ServerProcess::start_with(&base.join(name), free_port()?, args, sets)?;
        let options =
            ClientOptions { timeout: Duration::from_secs(600), tls, ..ClientOptions::default() };
        let mut clients = Vec::new();
        for _ in 0..args.batch_streams.clamp(1, 4) {
            clients.push(
                Client::connect_with(&server.addr, options.clone())
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        wait_answering(&clients[0], Duration::from_secs(60)).await?;
        eprintln!("{name}: inserting {} documents", args.n);
        let c = &clients[0];
        insert_range(c, fps.clone(), 0..args.n, args.insert_streams, args.insert_batch, 0, false)
            .await?;
        sides.push(Side { name, _server: server, clients });
    }
    for side in &sides {
        settle(&side.clients[0], Duration::from_secs(600)).await?;
    }

    let mut rounds = Vec::new();
    let (mut batch, mut p50, mut p99) =
        ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for round in 0..args.tls_rounds.max(1) {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut figures = serde_json::Map::new();
        for i in order {
            let side = &sides[i];
            let qps = query_batch(side, args, &queries).await?;
            let lat = unary(side, args, &queries, round).await?;
            let (a, b) = (lat.percentile_us(0.5), lat.percentile_us(0.99));
            eprintln!(
                "round {round} {}: QueryBatch {qps:.0} q/s, unary p50 {a:.1} us, p99 {b:.1} us",
                side.name
            );
            batch[i].push(qps);
            p50[i].push(a);
            p99[i].push(b);
            figures.insert(
                side.name.into(),
                json!({ "query_batch_qps": qps, "unary_p50_us": a, "unary_p99_us": b }),
            );
        }
        rounds.push(Value::Object(figures));
    }
    let m = |v: &mut Vec<f64>| median(v);
    let (batch_plain, batch_tls) = (m(&mut batch[0]), m(&mut batch[1]));
    let (p50_plain, p50_tls) = (m(&mut p50[0]), m(&mut p50[1]));
    let (p99_plain, p99_tls) = (m(&mut p99[0]), m(&mut p99[1]));
    let batch_ratio = batch_tls / batch_plain;
    let added_p50 = p50_tls - p50_plain;
    eprintln!(
        "medians over {} rounds: QueryBatch TLS/plaintext {batch_ratio:.3} ({batch_tls:.0} vs \
         {batch_plain:.0} q/s, cost {:.1}%); unary p50 {p50_tls:.1} vs {p50_plain:.1} us \
         (TLS adds {added_p50:.1} us); p99 {p99_tls:.1} vs {p99_plain:.1} us",
        rounds.len(),
        (1.0 - batch_ratio) * 100.0
    );
    drop(sides);
    Ok(json!({
        "n": args.n,
        "k": args.k,
        "design": args.design,
        "rounds": rounds,
        "median": {
            "plaintext": { "query_batch_qps": batch_plain, "unary_p50_us": p50_plain,
                           "unary_p99_us": p99_plain },
            "tls": { "query_batch_qps": batch_tls, "unary_p50_us": p50_tls,
                     "unary_p99_us": p99_tls },
        },
        "query_batch_tls_over_plaintext": batch_ratio,
        "query_batch_tls_cost_percent": (1.0 - batch_ratio) * 100.0,
        "unary_p50_added_by_tls_us": added_p50,
    }))
}

/// A CA and a server certificate for 127.0.0.1 in `dir`, made by `neardup cert`.
fn make_pki(neardup: &Path, dir: &Path) -> Result<(), String> {
    let out = dir.to_str().ok_or("the data path is not UTF-8")?;
    let runs: [&[&str]; 2] = [
        &["cert", "ca", "--out", out],
        &["cert", "issue", "--ca", out, "--name", "server", "--host", "127.0.0.1", "--out", out],
    ];
    for argv in runs {
        let r = std::process::Command::new(neardup)
            .args(argv)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", neardup.display()))?;
        if !r.status.success() {
            return Err(format!(
                "neardup {}: {}",
                argv.join(" "),
                String::from_utf8_lossy(&r.stderr)
            ));
        }
    }
    Ok(())
}

/// Waits until `client`'s server answers Stats.
async fn wait_answering(client: &Client, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match client.stats().await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the server did not answer in time: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// QueryBatch throughput of `side`: `--batch-queries` queries over its streams.
async fn query_batch(
    side: &Side,
    args: &ServiceArgs,
    queries: &Arc<Vec<u64>>,
) -> Result<f64, String> {
    let streams = side.clients.len();
    let t = Instant::now();
    let (answered, _) =
        query_batch_streams(&side.clients, streams, queries, args.batch_queries / streams, args)
            .await?;
    Ok(answered as f64 / t.elapsed().as_secs_f64())
}

/// Unary Query latencies of `side`: `--tls-unary-calls` calls in a row on one connection.
async fn unary(
    side: &Side,
    args: &ServiceArgs,
    queries: &Arc<Vec<u64>>,
    round: usize,
) -> Result<Latencies, String> {
    let c = &side.clients[0];
    let mut lat = Latencies::default();
    let offset = round * args.tls_unary_calls;
    for i in 0..args.tls_unary_calls {
        let q = queries[(offset + i) % queries.len()];
        let t = Instant::now();
        c.query(q, Some(args.k), 100).await.map_err(|e| e.to_string())?;
        lat.record(t.elapsed().as_nanos() as u64);
    }
    Ok(lat)
}
