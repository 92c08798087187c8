//! Verified admission over gRPC: CheckAndInsert and Query with and without sketches, checked
//! against a brute-force model of what was stored (Hamming distance of fingerprints, sketch
//! estimates, exact Jaccard similarity); bad sketches refused with nothing changed; and
//! `kill -9` keeping every acknowledged sketch.

use std::collections::BTreeMap;

use neardup_client::{
    Client, Document, Target, Verification, doc, fingerprint_and_sketch, sketched_doc, text_doc,
    text_doc_with_sketch,
};
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::sketch::{self, Sketch};
use neardup_core::util::{SplitMix64, hamming};
use neardup_proto::v1::{CheckAndInsertRequest, InsertRequest, QueryRequest, QueryTarget};
use neardup_tests::Node;
use tonic::Code;

const WORDS: &[&str] = &[
    "crawl",
    "frontier",
    "page",
    "near",
    "duplicate",
    "text",
    "index",
    "table",
    "shingle",
    "simhash",
    "fingerprint",
    "server",
    "shard",
    "router",
    "sketch",
    "verify",
    "jaccard",
    "estimate",
    "bound",
    "sigma",
    "record",
    "log",
    "store",
    "recover",
    "kill",
    "restart",
    "query",
    "answer",
    "match",
    "cluster",
    "original",
    "timestamp",
    "order",
    "batch",
    "stream",
    "limit",
    "design",
    "permute",
    "block",
    "huffman",
    "xor",
    "merge",
    "run",
    "buffer",
    "disk",
];

/// A random text of `n` words (numbered words, so shingles are mostly distinct).
fn base_text(r: &mut SplitMix64, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| format!("{}{}", WORDS[r.below(WORDS.len() as u64) as usize], r.below(40)))
        .collect()
}

/// `words` with `edits` random words replaced.
fn edited(r: &mut SplitMix64, words: &[String], edits: usize) -> String {
    let mut w = words.to_vec();
    for _ in 0..edits {
        let i = r.below(w.len() as u64) as usize;
        w[i] = format!("changed{}", r.below(1000));
    }
    w.join(" ")
}

/// What the model knows of a stored document.
#[derive(Clone)]
struct Stored {
    fp: u64,
    sketch: Option<Sketch>,
    shingles: Vec<u64>,
}

fn exact_jaccard(a: &[u64], b: &[u64]) -> f64 {
    let set: std::collections::HashSet<u64> = a.iter().copied().collect();
    let inter = b.iter().filter(|x| set.contains(x)).count();
    inter as f64 / (a.len() + b.len() - inter) as f64
}

/// The matches the service must return for a query `(fp, sketch)` over `stored`, as
/// `(id, verified, agreements)`, by the documented rule.
fn expected(
    stored: &BTreeMap<String, Stored>,
    fp: u64,
    sketch: Option<&Sketch>,
    k: u32,
    j: f64,
    candidate_k: u32,
    skip: &str,
) -> BTreeMap<String, Option<f64>> {
    let mut out = BTreeMap::new();
    for (id, d) in stored {
        if id == skip {
            continue;
        }
        let dist = hamming(fp, d.fp);
        let verified = match (sketch, &d.sketch) {
            (Some(q), Some(s)) if j > 0.0 => Some(q.jaccard(s)),
            _ => None,
        };
        match verified {
            Some(est) if est >= j && dist <= candidate_k => {
                out.insert(id.clone(), Some(est));
            }
            Some(_) => {}
            None if dist <= k => {
                out.insert(id.clone(), None);
            }
            None => {}
        }
    }
    out
}

fn got(matches: &[neardup_client::Match]) -> BTreeMap<String, Option<f64>> {
    matches.iter().map(|m| (m.id.clone(), m.verified.then_some(m.jaccard))).collect()
}

/// Corpus: clusters of a base text and copies with 0 to 40 of 120 words changed, so pairs
/// span Jaccard similarities from 1 down to about 0.3, many within k = 3 of each other.
fn corpus(seed: u64, clusters: usize) -> Vec<String> {
    let mut r = SplitMix64::new(seed);
    let mut texts = Vec::new();
    for c in 0..clusters {
        // Short documents keep their shingle sets in their sketches (compared exactly), long
        // ones only their bins (estimated): both kinds.
        let base = base_text(&mut r, if c % 3 == 2 { 420 } else { 120 });
        texts.push(base.join(" "));
        for _ in 0..6 {
            let edits = [0usize, 0, 1, 1, 2, 3, 5, 8, 20][r.below(9) as usize];
            texts.push(edited(&mut r, &base, edits));
        }
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_check_and_insert_matches_brute_force_with_and_without_sketches() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::serve_in(dir.path(), &[]).await;
    let client = node.client().await;
    let mut f = Fingerprinter::new(FingerprintConfig::default()).unwrap();
    let texts = corpus(19, 40);
    let mut stored: BTreeMap<String, Stored> = BTreeMap::new();
    let (k, j, candidate_k) = (3u32, 0.9f64, 3u32);
    let verify = Verification { jaccard: Some(j), candidate_k: Some(candidate_k) };
    let (mut verified_kept, mut verified_dropped, mut unverified, mut within_bound) =
        (0usize, 0usize, 0usize, 0usize);
    let mut exact = 0usize;
    for (i, text) in texts.iter().enumerate() {
        let id = format!("https://v/{i}");
        let (fp, sk) = fingerprint_and_sketch(text).unwrap();
        let sketch = Sketch::from_bytes(&sk).unwrap();
        let shingles = f.word_shingles(text, 3).unwrap();
        // Every third document goes by fingerprint alone (as an old client would), every
        // third by text (the server sketches it), the rest by fingerprint and sketch.
        let (document, has_sketch): (Document, bool) = match i % 3 {
            0 => (doc(&id, fp, i as i64), false),
            1 => (text_doc(&id, text.clone(), i as i64), true),
            _ => (sketched_doc(&id, fp, sk.clone(), i as i64), true),
        };
        let q = has_sketch.then_some(&sketch);
        let want = expected(&stored, fp, q, k, j, candidate_k, &id);
        let r = client.check_and_insert_verified(document, Some(k), verify, 1000, false).await;
        let r = r.unwrap();
        assert_eq!(r.fingerprint, fp);
        assert_eq!(got(&r.matches), want, "document {i}");
        assert_eq!(r.duplicate, !want.is_empty(), "document {i}");
        for m in &r.matches {
            let other = &stored[&m.id];
            if m.verified {
                verified_kept += 1;
                // The similarity is the documented one: exact between two kept sets, else
                // within 4.5 sigma of the truth for the union's size.
                let truth = exact_jaccard(&shingles, &other.shingles);
                let union = (shingles.len() + other.shingles.len()) as f64 / (1.0 + truth);
                let bound = if sketch.exact_with(other.sketch.as_ref().unwrap()) {
                    exact += 1;
                    1e-9
                } else {
                    4.5 * sketch::std_dev_for(truth, union as usize).max(1e-9)
                };
                if (m.jaccard - truth).abs() <= bound {
                    within_bound += 1;
                }
            } else {
                unverified += 1;
            }
        }
        verified_dropped += stored
            .iter()
            .filter(|(_, d)| has_sketch && d.sketch.is_some() && hamming(fp, d.fp) <= candidate_k)
            .count()
            - r.matches.iter().filter(|m| m.verified).count();
        stored.insert(id, Stored { fp, sketch: has_sketch.then_some(sketch), shingles });
    }
    eprintln!(
        "{verified_kept} verified ({exact} exactly), {verified_dropped} refused, {unverified} \
         unverified matches"
    );
    // The corpus exercised every branch, and the estimates kept their bound.
    assert!(verified_kept > 20, "{verified_kept} verified matches");
    assert!(exact > 10 && verified_kept - exact > 10, "{exact} of {verified_kept} exact");
    assert!(verified_dropped > 5, "{verified_dropped} candidates refused by verification");
    assert!(unverified > 20, "{unverified} unverified matches");
    assert_eq!(within_bound, verified_kept);

    // Query, verified and not, by text and by fingerprint and sketch, against the model.
    let mut r = SplitMix64::new(5);
    for _ in 0..30 {
        let text = &texts[r.below(texts.len() as u64) as usize];
        let (fp, sk) = fingerprint_and_sketch(text).unwrap();
        let sketch = Sketch::from_bytes(&sk).unwrap();
        let by_text =
            client.query_verified(Target::Text(text.clone()), Vec::new(), Some(k), verify, 1000);
        let by_text = by_text.await.unwrap();
        assert_eq!(got(&by_text.matches), expected(&stored, fp, Some(&sketch), k, j, 3, ""));
        let by_fp =
            client.query_verified(Target::Fingerprint(fp), sk.clone(), Some(k), verify, 1000);
        assert_eq!(got(&by_fp.await.unwrap().matches), got(&by_text.matches));
        // A candidate k below k: sketched candidates beyond it are refused, not kept by k.
        let narrow = Verification { jaccard: Some(j), candidate_k: Some(1) };
        let narrow =
            client.query_verified(Target::Text(text.clone()), Vec::new(), Some(k), narrow, 1000);
        assert_eq!(
            got(&narrow.await.unwrap().matches),
            expected(&stored, fp, Some(&sketch), k, j, 1, "")
        );
        // Without a sketch, or with verification off: plain distance k.
        let plain = client.query(fp, Some(k), 1000).await.unwrap();
        assert_eq!(got(&plain.matches), expected(&stored, fp, None, k, j, 3, ""));
        let off = Verification { jaccard: Some(0.0), candidate_k: None };
        let off = client.query_verified(Target::Text(text.clone()), Vec::new(), Some(k), off, 1000);
        assert_eq!(got(&off.await.unwrap().matches), got(&plain.matches));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sketches_are_invalid_argument_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::serve_in(dir.path(), &[]).await;
    let client = node.client().await;
    let text = "the quick brown fox jumps over the lazy dog again and again";
    let (fp, good) = fingerprint_and_sketch(text).unwrap();
    client.insert(vec![sketched_doc("kept", fp, good.clone(), 1)]).await.unwrap();
    let mut short = good.clone();
    short.pop();
    let mut long = good.clone();
    long.push(0);
    let mut version = good.clone();
    version[0] = 3;
    let mut length = good.clone();
    length[1] = 63;
    // The text is short: its sketch keeps its set (version 2), whose values must ascend and
    // whose size must be there.
    assert_eq!(good[0], 2, "a short text's sketch keeps its set");
    let mut unordered = good.clone();
    let at = sketch::ENCODED_BYTES + 2;
    unordered[at..at + 8].rotate_left(4);
    let no_set = good[..sketch::ENCODED_BYTES].to_vec();
    let other = neardup_client::sketch_of_text("an entirely different text here").unwrap();
    let mut rpc = client.raw();
    for (what, bad) in [
        ("short", short),
        ("long", long),
        ("version", version),
        ("length byte", length),
        ("set order", unordered),
        ("set size", no_set),
    ] {
        let docs = vec![
            sketched_doc("new-1", fp, good.clone(), 2),
            sketched_doc("new-2", fp, bad.clone(), 2),
        ];
        let e = client.insert(docs).await.unwrap_err();
        assert_eq!(e.code(), Some(Code::InvalidArgument), "insert, {what}: {e}");
        let req = CheckAndInsertRequest {
            document: Some(sketched_doc("new-3", fp, bad.clone(), 2)),
            ..Default::default()
        };
        let e = rpc.check_and_insert(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "check, {what}: {e:?}");
        let req = QueryRequest {
            target: Some(QueryTarget { sketch: bad.clone(), ..Target::Fingerprint(fp).into() }),
            ..Default::default()
        };
        let e = rpc.query(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "query, {what}: {e:?}");
        // A stream whose second message is bad: the first may be stored (documented), the
        // bad one is refused.
        let msgs = vec![InsertRequest { documents: vec![sketched_doc("new-4", fp, bad, 2)] }];
        let e = rpc.insert_stream(tokio_stream::iter(msgs)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "stream, {what}: {e:?}");
    }
    // A text with a sketch that is not its own.
    let mut d = text_doc_with_sketch("new-5", text, 3).unwrap();
    d.sketch = other;
    let e = client.insert(vec![d]).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument));
    // A threshold out of range, a candidate k above the design.
    for v in [
        Verification { jaccard: Some(1.5), candidate_k: None },
        Verification { jaccard: Some(-0.1), candidate_k: None },
        // The default design, 8c2, answers k <= 6.
        Verification { jaccard: Some(0.9), candidate_k: Some(7) },
    ] {
        let e = client
            .check_and_insert_verified(
                sketched_doc("new-6", fp, good.clone(), 4),
                None,
                v,
                0,
                false,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(Code::InvalidArgument), "{v:?}");
    }
    // Nothing changed: one document, and it still verifies against itself.
    assert_eq!(client.stats().await.unwrap().documents, 1);
    let r = client
        .query_verified(Target::Fingerprint(fp), good, None, Verification::default(), 10)
        .await
        .unwrap();
    assert_eq!(r.matches.len(), 1);
    assert!(r.matches[0].verified && r.matches[0].jaccard == 1.0);
}

/// Writes `n` sketched documents one CheckAndInsert at a time, each acknowledged before the
/// next; returns their texts by id.
async fn admit_all(client: &Client, prefix: &str, n: usize, seed: u64) -> BTreeMap<String, String> {
    let mut r = SplitMix64::new(seed);
    let mut out = BTreeMap::new();
    for i in 0..n {
        let id = format!("{prefix}/{i}");
        let text = base_text(&mut r, 30).join(" ");
        let d = text_doc_with_sketch(&id, text.clone(), i as i64).unwrap();
        // Verification off: every document is stored whatever its neighbours.
        let off = Verification { jaccard: Some(0.0), candidate_k: None };
        let a = client.check_and_insert_verified(d, Some(0), off, 1, false).await.unwrap();
        assert!(a.inserted);
        out.insert(id, text);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_keeps_every_acknowledged_sketch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Frequent checkpoints and document snapshots, so some sketches are covered by a
    // snapshot (and their log records truncated) and some only by the log.
    let args = [
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--set",
        "index.buffer_docs=64",
        "--set",
        "storage.checkpoint_ops=100",
        "--set",
        "storage.snapshot_log_mb=0",
        "--set",
        "storage.idle_flush_ms=20",
    ];
    let mut all = BTreeMap::new();
    for life in 0..3u64 {
        let mut node = Node::start(&args, dir.path());
        node.serving().await;
        let client = node.client().await;
        all.extend(admit_all(&client, &format!("life{life}"), 150, life).await);
        // Bulk inserts too, acknowledged as a whole.
        let docs: Vec<Document> = (0..100)
            .map(|i| {
                let text =
                    format!("bulk {life} {i} alpha beta gamma delta {}", i * 7 + life as usize);
                let id = format!("bulk{life}/{i}");
                all.insert(id.clone(), text.clone());
                text_doc_with_sketch(id, text, 0).unwrap()
            })
            .collect();
        client.insert(docs).await.unwrap();
        node.kill9();
    }
    let mut node = Node::start(&args, dir.path());
    node.serving().await;
    let client = node.client().await;
    assert_eq!(client.stats().await.unwrap().documents, all.len() as u64);
    for (id, text) in &all {
        let r = client
            .query_verified(
                Target::Text(text.clone()),
                Vec::new(),
                Some(0),
                Verification::default(),
                100,
            )
            .await
            .unwrap();
        let own = r.matches.iter().find(|m| &m.id == id);
        let own = own.unwrap_or_else(|| panic!("{id} lost: {:?}", r.matches));
        assert!(own.verified && own.jaccard == 1.0, "{id}: sketch lost: {own:?}");
    }
    node.terminate();
}
