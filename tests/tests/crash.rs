//! `kill -9` during streaming inserts, then a restart: every acknowledged document is
//! present, and queries are exact (compared with a brute-force scan of what is stored).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use neardup_client::{Client, Document, Target, doc};
use neardup_core::util::SplitMix64;
use neardup_proto::v1::InsertRequest;
use neardup_tests::Node;

/// Every document sent (id -> fingerprint), and the acknowledged ids.
#[derive(Default)]
struct Sent {
    fps: BTreeMap<String, u64>,
    acked: BTreeSet<String>,
}

/// Sends streams of 4 batches of 250 documents until the server fails; records what each
/// acknowledged stream carried.
async fn writer(client: Client, sent: Arc<Mutex<Sent>>, name: String, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for stream_no in 0.. {
        let batches: Vec<Vec<Document>> = (0..4)
            .map(|b| {
                (0..250)
                    .map(|i| doc(format!("{name}/{stream_no}/{b}/{i}"), rng.next_u64(), stream_no))
                    .collect()
            })
            .collect();
        {
            let mut s = sent.lock().unwrap();
            for d in batches.iter().flatten() {
                if let Some(neardup_proto::v1::document::Content::Fingerprint(fp)) = d.content {
                    s.fps.insert(d.id.clone(), fp);
                }
            }
        }
        let msgs: Vec<InsertRequest> =
            batches.iter().map(|b| InsertRequest { documents: b.clone() }).collect();
        match client.raw().insert_stream(tokio_stream::iter(msgs)).await {
            Ok(_) => {
                let mut s = sent.lock().unwrap();
                s.acked.extend(batches.iter().flatten().map(|d| d.id.clone()));
            }
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_streaming_inserts_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Small buffers, frequent checkpoints and document snapshots: the crash lands among
    // flushes, merges, checkpoints and log truncation.
    let args = [
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--set",
        "index.buffer_docs=512",
        "--set",
        "storage.checkpoint_ops=3000",
        "--set",
        "storage.snapshot_log_mb=1",
        "--set",
        "storage.idle_flush_ms=50",
    ];
    let sent = Arc::new(Mutex::new(Sent::default()));
    for life in 0..3u64 {
        let mut node = Node::start(&args, dir.path());
        node.serving().await;
        let client = node.client().await;
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let name = format!("https://crash/{life}/{w}");
                tokio::spawn(writer(client.clone(), sent.clone(), name, life * 10 + w))
            })
            .collect();
        // Let some streams complete, then crash while others are under way.
        let target = sent.lock().unwrap().acked.len() + 6_000;
        while sent.lock().unwrap().acked.len() < target {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        node.kill9();
        for w in writers {
            w.await.unwrap();
        }
        verify(&args, dir.path(), &sent).await;
    }
}

/// Restarts, then checks every acknowledged document and exact answers.
async fn verify(args: &[&str], logs: &std::path::Path, sent: &Mutex<Sent>) {
    let mut node = Node::start(args, logs);
    node.serving().await;
    let c = node.client().await;
    let (fps, acked) = {
        let s = sent.lock().unwrap();
        (s.fps.clone(), s.acked.clone())
    };
    // What is stored: every acknowledged document must be; an unacknowledged one may be.
    let ids: Vec<&String> = fps.keys().collect();
    let targets: Vec<Target> = ids.iter().map(|id| Target::Fingerprint(fps[*id])).collect();
    let found = c.query_all(&targets, Some(0), 100, 1000).await.unwrap();
    let mut stored: Vec<(String, u64)> = Vec::new();
    for (id, r) in ids.iter().zip(&found) {
        if r.matches.iter().any(|m| &m.id == *id) {
            stored.push(((*id).clone(), fps[*id]));
        } else {
            assert!(!acked.contains(*id), "acknowledged document {id} is missing after kill -9");
        }
    }
    assert!(stored.len() >= acked.len());
    eprintln!("sent {}, acknowledged {}, stored {}", fps.len(), acked.len(), stored.len());
    assert_eq!(c.stats().await.unwrap().documents as usize, stored.len(), "nothing else stored");
    // Exact answers: near and random queries against a brute-force scan of what is stored.
    let mut rng = SplitMix64::new(stored.len() as u64);
    let queries: Vec<u64> = (0..400)
        .map(|i| {
            if i % 2 == 0 {
                let n = rng.below(4) as u32;
                let fp = stored[rng.below(stored.len() as u64) as usize].1;
                rng.flip_bits(fp, n)
            } else {
                rng.next_u64()
            }
        })
        .collect();
    let targets: Vec<Target> = queries.iter().map(|&q| Target::Fingerprint(q)).collect();
    let answers = c.query_all(&targets, Some(3), 10_000, 100).await.unwrap();
    for (q, r) in queries.iter().zip(answers) {
        let got: BTreeSet<(String, u32)> =
            r.matches.iter().map(|m| (m.id.clone(), m.distance)).collect();
        let want: BTreeSet<(String, u32)> = stored
            .iter()
            .filter(|(_, fp)| (fp ^ q).count_ones() <= 3)
            .map(|(id, fp)| (id.clone(), (fp ^ q).count_ones()))
            .collect();
        assert_eq!(got, want, "query {q:#x}");
        assert!(r.matches.windows(2).all(|w| w[0].distance <= w[1].distance), "ordered");
    }
    node.terminate();
}
