//! `neardup backup` and `neardup restore` on real processes: a single node and a
//! three-node cluster are backed up while clients write to them, the backups are restored
//! into fresh servers, and everything is checked against brute force over the acknowledged
//! writes: every document acknowledged before the backup began is there (in the version
//! acknowledged, unless a write during the backup changed it), no document is invented,
//! the restored server holds exactly what the backup holds (ids, clusters, timestamps and
//! sketches included), and queries are exact. Damaged backups and restores into servers
//! that hold data are refused, leaving the target untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_cli::cmd::backup::read_backup;
use neardup_client::{BackupDoc, Client, ClientOptions, doc, sketch_of_text, sketched_doc};
use neardup_core::util::SplitMix64;
use neardup_tests::cluster::{Member, add_node};
use neardup_tests::{Node, brute_ids, query_ids};
use serde_json::Value;

/// Runs the binary; its JSON output, or its stderr on failure.
fn cli(args: &[&str]) -> Result<Value, String> {
    let out = neardup_tests::run(args);
    if out.status.success() {
        serde_json::from_slice(&out.stdout).map_err(|e| format!("not JSON ({e}): {out:?}"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `neardup backup` of the server at `addr` into `to`, on a blocking thread.
async fn backup(addr: &str, to: &Path) -> Result<Value, String> {
    let (addr, to) = (addr.to_string(), to.to_str().unwrap().to_string());
    tokio::task::spawn_blocking(move || cli(&["backup", "--server", &addr, "--to", &to]))
        .await
        .unwrap()
}

/// `neardup restore` into the server at `addr` from `from` (and `extra` flags).
async fn restore(addr: &str, from: &Path, extra: &[&str]) -> Result<Value, String> {
    let mut args: Vec<String> =
        ["restore", "--server", addr, "--from", from.to_str().unwrap()].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || cli(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

/// `neardup serve` with its data and log under `dir` (made first), once SERVING.
async fn node(dir: &Path) -> Node {
    std::fs::create_dir_all(dir).unwrap();
    Node::serve_in(dir, &[]).await
}

async fn client(addr: &str) -> Client {
    let options = ClientOptions { timeout: Duration::from_secs(60), ..Default::default() };
    Client::connect_with(addr, options).await.unwrap()
}

/// What the clients wrote.
#[derive(Default)]
struct Writes {
    /// Acknowledged before the backup began: id to fingerprint.
    before: BTreeMap<String, u64>,
    /// Ids a write during the backup changed (replaced or deleted).
    touched: BTreeSet<String>,
    /// Every fingerprint ever sent for an id (acknowledged or not).
    sent: BTreeMap<String, BTreeSet<u64>>,
    /// Write calls acknowledged during the backup.
    acked_during: u64,
}

impl Writes {
    fn send(&mut self, id: &str, fp: u64) {
        self.sent.entry(id.to_string()).or_default().insert(fp);
    }
}

/// Stores `n` documents `pre-I` through `c` (every 9th with a sketch), then near-duplicates
/// of some of them through CheckAndInsert, so that clusters join; all acknowledged.
async fn fill(c: &Client, n: usize, writes: &Mutex<Writes>) {
    let mut rng = SplitMix64::new(11);
    let sketch = sketch_of_text("the same few words in every sketched document").unwrap();
    let docs: Vec<_> = (0..n)
        .map(|i| {
            let (id, fp) = (format!("pre-{i}"), rng.next_u64());
            if i % 9 == 0 {
                sketched_doc(id, fp, sketch.clone(), i as i64)
            } else {
                doc(id, fp, i as i64)
            }
        })
        .collect();
    c.insert_all(&docs, 5_000).await.unwrap();
    {
        let mut w = writes.lock().unwrap();
        for d in &docs {
            let Some(neardup_proto::v1::document::Content::Fingerprint(fp)) = d.content else {
                unreachable!()
            };
            w.send(&d.id, fp);
            w.before.insert(d.id.clone(), fp);
        }
    }
    for i in 0..40 {
        let base = writes.lock().unwrap().before[&format!("pre-{}", i * 13)];
        let (id, fp) = (format!("near-{i}"), base ^ (1 << (i % 64)));
        writes.lock().unwrap().send(&id, fp);
        c.check_and_insert(doc(&id, fp, 1_000_000 + i), Some(3), 10, false).await.unwrap();
        writes.lock().unwrap().before.insert(id, fp);
    }
}

/// Writes through `c` until `stop` (at most 400 rounds): new documents, replacements and
/// deletes of documents stored before. Counts its rounds in `rounds`.
async fn write_during(
    c: Client,
    n: usize,
    writes: Arc<Mutex<Writes>>,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
) {
    let mut rng = SplitMix64::new(99);
    for r in 0..400u64 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut docs = Vec::new();
        for j in 0..40 {
            docs.push(doc(format!("w-{r}-{j}"), rng.next_u64(), 2_000_000 + r as i64));
        }
        let dels: Vec<String> =
            (0..3).map(|_| format!("pre-{}", rng.next_u64() as usize % n)).collect();
        {
            let mut w = writes.lock().unwrap();
            for d in &docs {
                let Some(neardup_proto::v1::document::Content::Fingerprint(fp)) = d.content else {
                    unreachable!()
                };
                w.send(&d.id, fp);
            }
            for _ in 0..3 {
                let id = format!("pre-{}", rng.next_u64() as usize % n);
                let fp = rng.next_u64();
                w.send(&id, fp);
                w.touched.insert(id.clone());
                docs.push(doc(id, fp, 3_000_000 + r as i64));
            }
            w.touched.extend(dels.iter().cloned());
        }
        let ok = c.insert(docs).await.is_ok() & c.delete(dels, false).await.is_ok();
        if ok {
            writes.lock().unwrap().acked_during += 1;
        }
        rounds.fetch_add(1, Ordering::Relaxed);
    }
}

/// Backs up `source` while a client writes through `writer`; returns the backup's JSON.
async fn backup_under_writes(
    source: &str,
    writer: &str,
    n: usize,
    writes: &Arc<Mutex<Writes>>,
    to: &Path,
) -> Value {
    let (stop, rounds) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let task = tokio::spawn(write_during(
        client(writer).await,
        n,
        writes.clone(),
        stop.clone(),
        rounds.clone(),
    ));
    // The backup begins once writes are under way (bounded wait).
    let limit = Instant::now() + Duration::from_secs(30);
    while rounds.load(Ordering::Relaxed) < 3 && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let out = backup(source, to).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    task.await.unwrap();
    assert!(writes.lock().unwrap().acked_during > 0, "no write was acknowledged meanwhile");
    out
}

/// A backup's documents by id, for comparison.
fn by_name(docs: Vec<BackupDoc>) -> BTreeMap<String, BackupDoc> {
    let mut out = BTreeMap::new();
    for d in docs {
        let name = d.name.clone();
        assert!(out.insert(name.clone(), d).is_none(), "{name} twice in a backup");
    }
    out
}

/// The checks every restore must pass: `restored` (a backup of the restored server) holds
/// exactly what `original` (the backup restored) holds; everything acknowledged before the
/// backup and not touched since is in it with its fingerprint; nothing in it was never
/// sent; queries through `c` are exact against brute force over it.
async fn check_restored(
    original: &BTreeMap<String, BackupDoc>,
    restored: &BTreeMap<String, BackupDoc>,
    writes: &Writes,
    clients: &[Client],
) {
    assert_eq!(original.len(), restored.len(), "documents restored");
    for (name, d) in original {
        assert_eq!(restored.get(name), Some(d), "document {name} as restored");
    }
    let mut kept = 0;
    for (name, fp) in &writes.before {
        if writes.touched.contains(name) {
            continue;
        }
        kept += 1;
        let d = restored.get(name).unwrap_or_else(|| panic!("{name}, acknowledged, is lost"));
        assert_eq!(d.fingerprint, *fp, "{name}'s fingerprint");
    }
    assert!(kept > 0);
    for (name, d) in restored {
        let sent = writes.sent.get(name).unwrap_or_else(|| panic!("{name} was never written"));
        assert!(sent.contains(&d.fingerprint), "{name} with a fingerprint never written");
    }
    // Clusters that joined and sketches are kept.
    assert!(restored.values().any(|d| !d.sketch.is_empty()));
    assert!(restored.values().filter(|d| d.name.starts_with("near-")).any(|d| d.cluster != d.id));
    let fps: BTreeMap<String, u64> =
        restored.iter().map(|(n, d)| (n.clone(), d.fingerprint)).collect();
    let mut rng = SplitMix64::new(5);
    let mut queries: Vec<u64> = fps
        .values()
        .step_by((fps.len() / 150).max(1))
        .map(|&fp| fp ^ (1 << (rng.next_u64() % 64)))
        .collect();
    queries.extend((0..20).map(|_| rng.next_u64()));
    for (i, q) in queries.iter().enumerate() {
        let c = &clients[i % clients.len()];
        for k in [0, 3] {
            assert_eq!(query_ids(c, *q, k).await, brute_ids(&fps, *q, k), "query {q:#x} k={k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_backed_up_under_writes_is_restored_exactly_into_a_fresh_node() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(&dir.path().join("a")).await;
    let n = 20_000;
    let writes = Arc::new(Mutex::new(Writes::default()));
    fill(&a.client().await, n, &writes).await;
    let saved = dir.path().join("backup");
    let out = backup_under_writes(&a.addr, &a.addr, n, &writes, &saved).await;
    assert_eq!(out["kind"], "node");
    // A backup goes only into a new or empty directory.
    let again = backup(&a.addr, &saved).await.unwrap_err();
    assert!(again.contains("is not empty"), "{again}");

    let (manifest, docs) = read_backup(&saved).unwrap();
    assert!(manifest.seq > 0);
    let original = by_name(docs);
    assert_eq!(out["documents"].as_u64(), Some(original.len() as u64));

    let mut b = node(&dir.path().join("b")).await;
    let r = restore(&b.addr, &saved, &[]).await.unwrap();
    assert_eq!(r["restored"].as_u64(), Some(original.len() as u64));
    // Acknowledged means durable: a kill -9 right after loses nothing.
    b.kill9();
    let b = node(&dir.path().join("b")).await;
    let check = dir.path().join("check");
    backup(&b.addr, &check).await.unwrap();
    let restored = by_name(read_backup(&check).unwrap().1);
    let writes = std::mem::take(&mut *writes.lock().unwrap());
    check_restored(&original, &restored, &writes, &[b.client().await]).await;

    // A restore into a node that holds documents is refused, unless resumed; resumed, it
    // changes nothing.
    let refused = restore(&b.addr, &saved, &[]).await.unwrap_err();
    assert!(refused.contains("FAILED_PRECONDITION") && refused.contains("--resume"), "{refused}");
    restore(&b.addr, &saved, &["--resume"]).await.unwrap();
    let bc = b.client().await;
    assert_eq!(bc.stats().await.unwrap().documents, original.len() as u64);
    // New documents get new ids: none replaces a restored one.
    let mut rng = SplitMix64::new(3);
    let news: Vec<_> = (0..100).map(|i| doc(format!("new-{i}"), rng.next_u64(), 9)).collect();
    bc.insert_all(&news, 100).await.unwrap();
    assert_eq!(bc.stats().await.unwrap().documents, original.len() as u64 + 100);

    // A damaged backup, or one without its manifest, is refused before anything is sent.
    let c = node(&dir.path().join("c")).await;
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    for e in std::fs::read_dir(&saved).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.join(e.file_name())).unwrap();
    }
    let frames = bad.join(&manifest.files[0].name);
    let mut bytes = std::fs::read(&frames).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&frames, &bytes).unwrap();
    let e = restore(&c.addr, &bad, &[]).await.unwrap_err();
    assert!(e.contains("is damaged"), "{e}");
    std::fs::remove_file(bad.join("BACKUP.json")).unwrap();
    let e = restore(&c.addr, &bad, &[]).await.unwrap_err();
    assert!(e.contains("holds no BACKUP.json"), "{e}");
    assert_eq!(c.client().await.stats().await.unwrap().documents, 0);
}

/// `n` nodes on loopback, formed, every unit placed on two nodes.
async fn form(dir: &Path, n: u64) -> Vec<Member> {
    std::fs::create_dir_all(dir).unwrap();
    let mut members: Vec<Member> = (1..=n).map(|id| Member::on_loopback(id, dir)).collect();
    members[0].start_first(&["--bootstrap"]).await;
    members[0].wait_status("a leader", |s| s.leader == 1).await;
    let via = members[0].internal.clone();
    for m in members.iter_mut().skip(1) {
        m.start_first(&["--join", &via]).await;
        let limit = Instant::now() + Duration::from_secs(120);
        while add_node(&via, m).await.is_err() {
            assert!(Instant::now() < limit, "node {} not added:\n{}", m.id, m.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    for m in &members {
        let limit = Instant::now() + Duration::from_secs(120);
        while m.public_health().await != Some(serving) {
            assert!(Instant::now() < limit, "node {} never SERVING:\n{}", m.id, m.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    members[0]
        .wait_status("every unit on two nodes", |s| {
            s.replicas == 2
                && !s.partitions.is_empty()
                && s.partitions.iter().all(|p| p.nodes.len() == 2)
                && s.tablets.iter().all(|t| t.nodes.len() == 2)
        })
        .await;
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_backed_up_under_writes_is_restored_exactly_into_a_fresh_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let old = form(&dir.path().join("old"), 3).await;
    let n = 5_000;
    let writes = Arc::new(Mutex::new(Writes::default()));
    fill(&client(&old[0].public).await, n, &writes).await;
    let saved = dir.path().join("backup");
    // Through node 1, while a client writes through node 2.
    let out = backup_under_writes(&old[0].public, &old[1].public, n, &writes, &saved).await;
    assert_eq!(out["kind"], "cluster");
    let (manifest, docs) = read_backup(&saved).unwrap();
    let original = by_name(docs);
    assert_eq!(manifest.partitions as usize, old[0].status().await.unwrap().partitions.len());

    let new = form(&dir.path().join("new"), 3).await;
    let r = restore(&new[2].public, &saved, &[]).await.unwrap();
    assert_eq!(r["restored"].as_u64(), Some(original.len() as u64));
    let check = dir.path().join("check");
    backup(&new[1].public, &check).await.unwrap();
    let restored = by_name(read_backup(&check).unwrap().1);
    let mut clients = Vec::new();
    for m in &new {
        clients.push(client(&m.public).await);
    }
    let writes = std::mem::take(&mut *writes.lock().unwrap());
    check_restored(&original, &restored, &writes, &clients).await;

    let refused = restore(&new[0].public, &saved, &[]).await.unwrap_err();
    assert!(refused.contains("FAILED_PRECONDITION") && refused.contains("--resume"), "{refused}");
    // New documents, through every node, get gids past the restored ones: none replaces
    // a restored document, and all are found.
    let mut rng = SplitMix64::new(3);
    let news: Vec<_> = (0..90).map(|i| doc(format!("new-{i}"), rng.next_u64(), 9)).collect();
    for (i, part) in news.chunks(30).enumerate() {
        clients[i].insert_all(part, 30).await.unwrap();
    }
    assert_eq!(clients[0].stats().await.unwrap().documents, original.len() as u64 + 90);
    let after = dir.path().join("after");
    backup(&new[0].public, &after).await.unwrap();
    let after = by_name(read_backup(&after).unwrap().1);
    for (name, d) in &original {
        assert_eq!(after.get(name), Some(d), "{name} after new writes");
    }
    let restored_ids: BTreeSet<u64> = original.values().map(|d| d.id).collect();
    for d in news {
        let got = &after[&d.id];
        assert!(!restored_ids.contains(&got.id), "{} took a restored gid", d.id);
    }
}
