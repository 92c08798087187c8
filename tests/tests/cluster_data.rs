//! The data path's torture test: client tasks stream inserts, deletes, queries and
//! CheckAndInsert through random nodes while nodes are killed with `kill -9` and restarted,
//! or cut off from the others; every answer, also those taken during the faults, is checked
//! against a model of the acknowledged set ([`neardup_tests::checker`]), and at the end every
//! acknowledged document must be found through every node.
//!
//! - `single_node_kill9_torture`: one `neardup serve` (no cluster), killed and restarted;
//!   always runs.
//! - `three_nodes_kill9_torture`, `three_nodes_partition_torture`,
//!   `python_client_through_each_of_three_nodes`: a cluster of 3 (bootstrap and 2 joins,
//!   every tablet and partition on 2 nodes), called through any node.
//! - `grow_from_one_node_to_four_then_remove_one_and_kill_one`: one node grown to four with
//!   each join's moves interrupted, then one node removed and one lost.
//!
//! Kills and partitions per test: `NEARDUP_TORTURE_FAULTS` (default 6). A violation names
//! the id's writes and the read's start (ticks of the model's clock);
//! `NEARDUP_TORTURE_KEEP=DIR` keeps a failed test's node logs and data under DIR. Every loop
//! is bounded in count and time; nothing asserts on time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, Target};
use neardup_core::util::SplitMix64;
use neardup_proto::admin::StatusResponse;
use neardup_proto::v1::{
    CheckAndInsertRequest, DeleteRequest, Document, InsertRequest, QueryBatchRequest, QueryRequest,
    QueryTarget, document, query_target,
};
use neardup_tests::checker::{Model, Version};
use neardup_tests::cluster::{Member, Netns, add_node};
use neardup_tests::{Node, skip_without};

/// Faults (kills or partitions) per test: `NEARDUP_TORTURE_FAULTS`, default 6.
fn faults() -> usize {
    std::env::var("NEARDUP_TORTURE_FAULTS").ok().and_then(|v| v.parse().ok()).unwrap_or(6)
}

/// Client tasks per test.
const TASKS: usize = 4;
/// Ids each task owns (only it writes them, so its writes to an id are sequential).
const IDS_PER_TASK: u64 = 150;
/// Operations per task at most (a safety net; the test stops them earlier).
const MAX_OPS: usize = 20_000;
/// Distance of every query and admission.
const K: u32 = 3;
/// Deadline of each call: a node that is down fails fast, one that hangs times out.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// What the client tasks share.
struct Shared {
    model: Mutex<Model>,
    violations: Mutex<Vec<String>>,
    /// Timestamps: one increasing clock, so a later write to an id has the larger one.
    clock: AtomicI64,
    checked: AtomicU64,
    failed_calls: AtomicU64,
    acked_writes: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn new() -> Arc<Shared> {
        Arc::new(Shared {
            model: Mutex::new(Model::new()),
            violations: Mutex::new(Vec::new()),
            clock: AtomicI64::new(1),
            checked: AtomicU64::new(0),
            failed_calls: AtomicU64::new(0),
            acked_writes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    fn violation(&self, what: String) {
        let mut v = self.violations.lock().unwrap();
        if v.len() < 20 {
            eprintln!("VIOLATION: {what}");
        }
        v.push(what);
    }

    fn report(&self) -> String {
        let model = self.model.lock().unwrap();
        format!(
            "{} answers checked, {} writes acknowledged, {} calls failed; {} ids, {} certainly \
             present, {} uncertain",
            self.checked.load(Ordering::Relaxed),
            self.acked_writes.load(Ordering::Relaxed),
            self.failed_calls.load(Ordering::Relaxed),
            model.ids(),
            model.certain().len(),
            model.uncertain().len()
        )
    }
}

fn fp_doc(id: &str, v: Version) -> Document {
    Document {
        id: id.into(),
        content: Some(document::Content::Fingerprint(v.fp)),
        timestamp_ms: v.ts_ms,
        sketch: Vec::new(),
    }
}

fn target(fp: u64) -> QueryTarget {
    QueryTarget { target: Some(query_target::Target::Fingerprint(fp)), sketch: Vec::new() }
}

fn timed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// One client task: random operations through random nodes until told to stop.
async fn client_task(addrs: Vec<String>, shared: Arc<Shared>, task: usize) {
    let options = ClientOptions { timeout: CALL_TIMEOUT, attempts: 1, ..Default::default() };
    let mut clients = Vec::new();
    for a in &addrs {
        clients.push(Client::connect_with(a, options.clone()).await.unwrap().raw());
    }
    let mut rng = SplitMix64::new(0x5eed_0000 + task as u64);
    // The fingerprint this task last wrote for each of its ids (to aim queries near them).
    let mut last_fp: Vec<u64> = (0..IDS_PER_TASK).map(|_| rng.next_u64()).collect();
    let id_of = |i: u64| format!("https://torture/{task}/{i}");
    let end = Instant::now() + Duration::from_secs(300);
    let mut failed = false;
    for _ in 0..MAX_OPS {
        if shared.stop.load(Ordering::Relaxed) || Instant::now() > end {
            return;
        }
        if failed {
            tokio::time::sleep(BACKOFF).await;
        }
        let node = rng.below(clients.len() as u64) as usize;
        let (mut rpc, via) = (clients[node].clone(), &addrs[node]);
        let near = |rng: &mut SplitMix64, last: &[u64]| {
            let fp = last[rng.below(IDS_PER_TASK) as usize];
            let flips = rng.below(K as u64 + 2) as u32;
            rng.flip_bits(fp, flips)
        };
        failed = !match rng.below(100) {
            // Insert: a stream of 1 or 2 messages of up to 10 documents.
            0..40 => {
                let mut docs = Vec::new();
                let mut pending = Vec::new();
                for _ in 0..1 + rng.below(20) {
                    let i = rng.below(IDS_PER_TASK);
                    if docs.iter().any(|d: &Document| d.id == id_of(i)) {
                        continue;
                    }
                    // Near-duplicates of other documents half the time.
                    let fp =
                        if rng.below(2) == 0 { near(&mut rng, &last_fp) } else { rng.next_u64() };
                    last_fp[i as usize] = fp;
                    let v = Version { fp, ts_ms: shared.clock.fetch_add(1, Ordering::Relaxed) };
                    docs.push(fp_doc(&id_of(i), v));
                    pending.push(shared.model.lock().unwrap().begin_put(&id_of(i), v));
                }
                let msgs: Vec<InsertRequest> =
                    docs.chunks(10).map(|c| InsertRequest { documents: c.to_vec() }).collect();
                let ok = rpc.insert_stream(timed(tokio_stream::iter(msgs))).await.is_ok();
                let mut model = shared.model.lock().unwrap();
                for p in pending {
                    if ok { model.ack(p) } else { model.fail(p) }
                }
                record(&shared, ok, docs.len())
            }
            // Delete a few.
            40..50 => {
                let mut ids: Vec<String> =
                    (0..1 + rng.below(3)).map(|_| id_of(rng.below(IDS_PER_TASK))).collect();
                ids.sort();
                ids.dedup();
                let pending: Vec<_> = {
                    let mut model = shared.model.lock().unwrap();
                    ids.iter().map(|id| model.begin_delete(id)).collect()
                };
                let req = DeleteRequest { ids: ids.clone(), must_exist: false };
                let ok = rpc.delete(timed(req)).await.is_ok();
                let mut model = shared.model.lock().unwrap();
                for p in pending {
                    if ok { model.ack(p) } else { model.fail(p) }
                }
                record(&shared, ok, ids.len())
            }
            // Query near a document of this task, or anywhere.
            50..75 => {
                let q = if rng.below(4) < 3 { near(&mut rng, &last_fp) } else { rng.next_u64() };
                let limit = if rng.below(4) == 0 { 2 } else { 100 };
                let start = shared.model.lock().unwrap().begin_read();
                let req = QueryRequest {
                    target: Some(target(q)),
                    k: Some(K),
                    limit,
                    ..Default::default()
                };
                match rpc.query(timed(req)).await {
                    Ok(r) => {
                        let result = r.into_inner().result.unwrap_or_default();
                        let c = shared.model.lock().unwrap().check_query(
                            start,
                            q,
                            K,
                            limit as usize,
                            &result,
                        );
                        checked(&shared, c.map(|_| ()), || {
                            format!("query {q:#x} (limit {limit}, {start}) through {via}")
                        });
                        true
                    }
                    Err(_) => record(&shared, false, 0),
                }
            }
            // QueryBatch: one message of a few queries, each answer checked.
            75..85 => {
                let qs: Vec<u64> =
                    (0..1 + rng.below(8))
                        .map(|_| {
                            if rng.below(4) < 3 { near(&mut rng, &last_fp) } else { rng.next_u64() }
                        })
                        .collect();
                let msg = QueryBatchRequest {
                    queries: qs.iter().map(|&q| target(q)).collect(),
                    k: Some(K),
                    limit: 100,
                };
                let start = shared.model.lock().unwrap().begin_read();
                let answer = async {
                    let mut stream =
                        rpc.query_batch(timed(tokio_stream::iter([msg]))).await?.into_inner();
                    let mut results = Vec::new();
                    while let Some(m) = stream.message().await? {
                        results.extend(m.results);
                    }
                    Ok::<_, tonic::Status>(results)
                };
                match answer.await {
                    Ok(results) if results.len() == qs.len() => {
                        for (q, r) in qs.iter().zip(&results) {
                            let c = shared.model.lock().unwrap().check_query(start, *q, K, 100, r);
                            checked(&shared, c.map(|_| ()), || {
                                format!("QueryBatch query {q:#x} ({start}) through {via}")
                            });
                        }
                        true
                    }
                    Ok(results) => {
                        shared.violation(format!(
                            "QueryBatch through {via}: {} answers for {} queries",
                            results.len(),
                            qs.len()
                        ));
                        true
                    }
                    Err(_) => record(&shared, false, 0),
                }
            }
            // CheckAndInsert, verification off.
            _ => {
                let i = rng.below(IDS_PER_TASK);
                let fp = near(&mut rng, &last_fp);
                last_fp[i as usize] = fp;
                let id = id_of(i);
                let v = Version { fp, ts_ms: shared.clock.fetch_add(1, Ordering::Relaxed) };
                let (start, p) = {
                    let mut model = shared.model.lock().unwrap();
                    (model.begin_read(), model.begin_put(&id, v))
                };
                let req = CheckAndInsertRequest {
                    document: Some(fp_doc(&id, v)),
                    k: Some(K),
                    limit: 100,
                    verify_jaccard: Some(0.0),
                    ..Default::default()
                };
                match rpc.check_and_insert(timed(req)).await {
                    Ok(r) => {
                        let r = r.into_inner();
                        let mut model = shared.model.lock().unwrap();
                        let c = model.check_admission(start, &id, fp, K, 100, &r);
                        model.ack(p);
                        drop(model);
                        if !r.inserted {
                            shared.violation(format!("admission of {id} not stored: {r:?}"));
                        }
                        checked(&shared, c.map(|_| ()), || {
                            format!("admission of {id} ({fp:#x}, {start}) through {via}")
                        });
                        record(&shared, true, 1)
                    }
                    Err(_) => {
                        shared.model.lock().unwrap().fail(p);
                        record(&shared, false, 0)
                    }
                }
            }
        };
    }
}

/// Counts a call's outcome; returns `ok`.
fn record(shared: &Shared, ok: bool, writes: usize) -> bool {
    if ok {
        shared.acked_writes.fetch_add(writes as u64, Ordering::Relaxed);
    } else {
        shared.failed_calls.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// How long a killed or cut-off node stays away at least: past the cluster's failure
/// timeout (2 s by default).
const DOWN_FOR: Duration = Duration::from_secs(3);

/// After a failed call the task waits a little, so a dead node is not hammered.
const BACKOFF: Duration = Duration::from_millis(50);

fn checked(
    shared: &Shared,
    r: Result<(), neardup_tests::checker::Violation>,
    what: impl FnOnce() -> String,
) {
    shared.checked.fetch_add(1, Ordering::Relaxed);
    if let Err(v) = r {
        // The id's writes, so that a report says what the answer should have seen.
        let history = v.id().map(|id| shared.model.lock().unwrap().history(id));
        shared.violation(format!("{}: {v}; {}", what(), history.unwrap_or_default()));
    }
}

/// Starts the client tasks.
fn start_clients(addrs: &[String], shared: &Arc<Shared>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..TASKS).map(|t| tokio::spawn(client_task(addrs.to_vec(), shared.clone(), t))).collect()
}

/// Stops the client tasks and waits for them.
async fn stop_clients(shared: &Shared, tasks: Vec<tokio::task::JoinHandle<()>>) {
    shared.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
}

/// Lets the clients run until `more` further answers were checked or writes acknowledged
/// (bounded: 20 s, a safety net).
async fn let_run(shared: &Shared, more: u64) {
    let progress =
        || shared.checked.load(Ordering::Relaxed) + shared.acked_writes.load(Ordering::Relaxed);
    let target = progress() + more;
    let limit = Instant::now() + Duration::from_secs(20);
    while progress() < target && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Through every address: every certainly-present document is found (a query of its
/// fingerprint at k = 0), and near queries are exact; each answer checked.
async fn final_check(addrs: &[String], shared: &Shared) {
    let certain = shared.model.lock().unwrap().certain();
    assert!(!certain.is_empty(), "nothing was acknowledged: {}", shared.report());
    let options = ClientOptions { timeout: Duration::from_secs(30), ..Default::default() };
    let mut rng = SplitMix64::new(certain.len() as u64);
    let near: Vec<u64> = (0..300)
        .map(|_| {
            let fp = certain[rng.below(certain.len() as u64) as usize].1.fp;
            let flips = rng.below(4) as u32;
            rng.flip_bits(fp, flips)
        })
        .collect();
    for addr in addrs {
        let c = Client::connect_with(addr, options.clone()).await.unwrap();
        for (queries, k) in
            [(certain.iter().map(|(_, v)| v.fp).collect::<Vec<_>>(), 0), (near.clone(), K)]
        {
            let targets: Vec<Target> = queries.iter().map(|&q| Target::Fingerprint(q)).collect();
            let start = shared.model.lock().unwrap().begin_read();
            // A node just restarted or healed may refuse for a moment (bounded: 40 tries).
            let mut answers = Err(String::new());
            for _ in 0..40 {
                answers =
                    c.query_all(&targets, Some(k), 1000, 500).await.map_err(|e| e.to_string());
                if answers.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let answers = answers.unwrap_or_else(|e| panic!("final queries through {addr}: {e}"));
            let mut model = shared.model.lock().unwrap();
            for (q, r) in queries.iter().zip(&answers) {
                shared.checked.fetch_add(1, Ordering::Relaxed);
                if let Err(v) = model.check_query(start, *q, k, 1000, r) {
                    shared.violation(format!("final check through {addr}, {q:#x} at k={k}: {v}"));
                }
            }
        }
    }
}

/// What the nodes' logs (`node-*.log` in `dir`) said about faults and catching up: the last
/// warnings, errors, map changes and fills of each, for a failure's report.
fn log_excerpts(dir: &Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    let keys = ["WARN", "ERROR", "filled", "Node", "marked", "epoch"];
    let mut out = String::new();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> =
            text.lines().filter(|l| keys.iter().any(|k| l.contains(k))).collect();
        out.push_str(&format!(
            "--- {} (last {} of {} lines)\n",
            log.display(),
            lines.len().min(60),
            lines.len()
        ));
        for l in &lines[lines.len().saturating_sub(60)..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Fails with the violations, if any (with the nodes' log excerpts from `dir`).
/// With `NEARDUP_TORTURE_KEEP=DIR`, a failed run's node logs and data are copied under DIR
/// (the test's own directory goes with it).
fn keep_logs(dir: &Path) {
    let Some(to) = std::env::var_os("NEARDUP_TORTURE_KEEP") else { return };
    let to = Path::new(&to).join(dir.file_name().unwrap_or_default());
    match std::process::Command::new("cp").arg("-r").arg(dir).arg(&to).status() {
        Ok(s) if s.success() => eprintln!("logs and data kept in {}", to.display()),
        r => eprintln!("could not keep {} in {}: {r:?}", dir.display(), to.display()),
    }
}

fn verdict(shared: &Shared, dir: &Path) {
    let report = shared.report();
    eprintln!("{report}");
    assert!(shared.checked.load(Ordering::Relaxed) > 0, "no answer was checked: {report}");
    let v = shared.violations.lock().unwrap();
    let kinds: Vec<String> = ["missing", "extra", "wrong distance", "out of order", "admission"]
        .iter()
        .map(|k| format!("{k}: {}", v.iter().filter(|x| x.contains(&format!(": {k}"))).count()))
        .collect();
    eprintln!("violations by kind: {}", kinds.join(", "));
    if !v.is_empty() {
        eprintln!("{}", log_excerpts(dir));
        keep_logs(dir);
    }
    assert!(
        v.is_empty(),
        "{} violations (first 20):\n{}\n{report}",
        v.len(),
        v[..v.len().min(20)].join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_kill9_torture() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--data",
        data.to_str().unwrap(),
        "--set",
        "index.buffer_docs=256",
        "--set",
        "storage.checkpoint_ops=2000",
        "--set",
        "storage.idle_flush_ms=50",
    ];
    let port = neardup_tests::free_port();
    let mut node = Node::start_on(&args, port, dir.path());
    node.serving().await;
    let addrs = vec![node.addr.clone()];
    let shared = Shared::new();
    let tasks = start_clients(&addrs, &shared);
    for round in 0..faults() {
        let_run(&shared, 1500).await;
        node.kill9();
        // Clients meet the dead node for a moment (their calls fail: uncertain writes).
        tokio::time::sleep(Duration::from_millis(100)).await;
        node = Node::start_on(&args, port, dir.path());
        node.serving().await;
        eprintln!("round {round}: {}", shared.report());
    }
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
    node.terminate();
}

/// Starts node 1 with `--bootstrap` and nodes 2..=n with `--join` (and an AddNode of the
/// test's own, idempotent), each with `args`; waits until each serves its public API.
async fn form(dir: &Path, n: u64, args: &[&str]) -> Vec<Member> {
    let mut members: Vec<Member> = (1..=n).map(|id| Member::on_loopback(id, dir)).collect();
    for m in &mut members {
        m.args = args.iter().map(|a| a.to_string()).collect();
    }
    form_members(&mut members).await;
    members
}

async fn form_members(members: &mut [Member]) {
    members[0].start_first(&["--bootstrap"]).await;
    if members[0].netns.is_none() {
        members[0].wait_status("a leader", |s| s.leader == 1).await;
    }
    let via = members[0].internal.clone();
    for m in members.iter_mut().skip(1) {
        m.start_first(&["--join", &via]).await;
        if m.netns.is_none() {
            let limit = Instant::now() + Duration::from_secs(120);
            while add_node(&via, m).await.is_err() {
                assert!(Instant::now() < limit, "node {} not added:\n{}", m.id, m.log_text());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    for m in members.iter() {
        wait_public_serving(m).await;
    }
}

/// Waits (up to two minutes, a safety net) until the map of some running member has every
/// node active and every unit on 2 serving replicas with none filling: the cluster is level
/// again after a fault. With `lost`, that node is down and marked lost, and no unit holds
/// it. Says what it saw otherwise.
async fn level(members: &[Member], lost: Option<u64>) -> Result<(), String> {
    level_on(members, lost, 2).await
}

/// Every unit of the map `s` shows: its serving replicas and its filling ones.
fn units(s: &StatusResponse) -> impl Iterator<Item = (&Vec<u64>, &Vec<u64>)> {
    let tablets = s.tablets.iter().map(|t| (&t.nodes, &t.filling));
    tablets.chain(s.partitions.iter().map(|p| (&p.nodes, &p.filling)))
}

/// [`level`] with every unit on `replicas` serving replicas.
async fn level_on(members: &[Member], lost: Option<u64>, replicas: usize) -> Result<(), String> {
    let limit = Instant::now() + Duration::from_secs(120);
    let mut last = String::from("no status");
    while Instant::now() < limit {
        for m in members.iter().filter(|m| Some(m.id) != lost) {
            let Ok(s) = m.status().await else { continue };
            let active = neardup_proto::admin::NodeState::Active as i32;
            let wrong: Vec<u64> = s
                .nodes
                .iter()
                .filter(|n| if Some(n.id) == lost { !n.lost } else { n.state != active })
                .map(|n| n.id)
                .collect();
            let uneven = units(&s)
                .filter(|(n, f)| {
                    n.len() != replicas || !f.is_empty() || lost.is_some_and(|l| n.contains(&l))
                })
                .count();
            if wrong.is_empty() && uneven == 0 && !s.partitions.is_empty() {
                return Ok(());
            }
            last = format!(
                "node {} at epoch {}: nodes not as expected {wrong:?}, {uneven} units without \
                 {replicas} serving replicas, with filling ones or on the lost node",
                m.id, s.epoch
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("not level after 120 s: {last}"))
}

/// Waits (up to two minutes, a safety net) until the member's public API says SERVING.
async fn wait_public_serving(m: &Member) {
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let limit = Instant::now() + Duration::from_secs(120);
    while m.public_health().await != Some(serving) {
        assert!(Instant::now() < limit, "node {} never SERVING:\n{}", m.id, m.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three nodes formed (each with `args`) and placed, and the client tasks writing and
/// reading through all.
async fn three_with_clients(
    dir: &Path,
    args: &[&str],
) -> (Vec<Member>, Vec<String>, Arc<Shared>, Tasks) {
    let members = form(dir, 3, args).await;
    let addrs: Vec<String> = members.iter().map(|m| m.public.clone()).collect();
    let shared = Shared::new();
    if let Err(e) = level(&members, None).await {
        shared.violation(e);
    }
    let tasks = start_clients(&addrs, &shared);
    (members, addrs, shared, tasks)
}

type Tasks = Vec<tokio::task::JoinHandle<()>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_kill9_torture() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, addrs, shared, tasks) = three_with_clients(dir.path(), &[]).await;
    let mut rng = SplitMix64::new(7);
    for round in 0..faults() {
        let_run(&shared, 1500).await;
        let victim = rng.below(3) as usize;
        members[victim].kill9();
        // Writes go on through the other two while it is down, past the cluster's failure
        // timeout (2 s by default), so the node is marked Down and comes back as filling.
        let_run(&shared, 800).await;
        tokio::time::sleep(DOWN_FOR).await;
        members[victim].start(&[]);
        wait_public_serving(&members[victim]).await;
        eprintln!("round {round}: killed node {}; {}", victim + 1, shared.report());
    }
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
}

/// Two faults that overlap: node A is killed and stays down while writes go on (it misses
/// them); then node B hangs (SIGSTOP) just before A starts again, so the units A shares
/// with B have no serving replica up to fill from, and B is marked down in turn. A must not
/// serve what it missed, and no write may be acknowledged by a filling replica alone (B,
/// back, would lack it and serve at once). B then goes on; once the cluster is level, and
/// at the end, every answer is checked against the acknowledged writes. Copies go in pages
/// of 64 entries, those of 2 puts or more in bulk (one run a page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_faults_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Copies in small pages, so that writes land between the pages of a fill; most pages go
    // in bulk, the last of a tablet often not.
    let pages = ["--set", "cluster.copy_page_entries=64", "--set", "index.buffer_docs=2"];
    let (mut members, addrs, shared, tasks) = three_with_clients(dir.path(), &pages).await;
    for round in 0..faults().min(3) {
        let_run(&shared, 1500).await;
        let (a, b) = (round % 3, (round + 1) % 3);
        members[a].kill9();
        let_run(&shared, 800).await;
        tokio::time::sleep(DOWN_FOR).await;
        members[b].pause();
        members[a].start(&[]);
        let_run(&shared, 300).await;
        tokio::time::sleep(DOWN_FOR).await;
        members[b].resume();
        wait_public_serving(&members[a]).await;
        if let Err(e) = level(&members, None).await {
            shared.violation(e);
        }
        eprintln!(
            "round {round}: killed node {}, hung node {} meanwhile; {}",
            a + 1,
            b + 1,
            shared.report()
        );
    }
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
}

/// Nodes marked lost after 4 s down, copies in pages of 64 entries (so writes land between
/// them), pages of 2 puts or more in bulk.
const LOST_PAGED: [&str; 6] = [
    "--set",
    "cluster.rebuild_after_ms=4000",
    "--set",
    "cluster.copy_page_entries=64",
    "--set",
    "index.buffer_docs=2",
];

/// A node killed and kept down past `cluster.rebuild_after_ms` (4 s here) is marked lost:
/// every unit it held is rebuilt on the other two from the surviving replicas (in pages of
/// 64 entries, so writes land between them; pages of 2 puts or more in bulk), while clients
/// write and read, until the cluster is level on two nodes, as `neardup cluster status`
/// shows. Started again, the node is placed like a new one, and the cluster is level on
/// three. Every answer throughout is checked against the acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_is_rebuilt_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, addrs, shared, tasks) = three_with_clients(dir.path(), &LOST_PAGED).await;
    let_run(&shared, 1500).await;
    members[2].kill9();
    if let Err(e) = level(&members, Some(3)).await {
        shared.violation(format!("rebuild: {e}"));
    }
    let status = members[0].status_cli().unwrap();
    assert_eq!(status["nodes"][2]["lost"], true, "{status}");
    let r = &status["redundancy"];
    assert_eq!(r["fully_replicated"], r["units"], "{status}");
    assert_eq!(r["replicas_filling"], 0, "{status}");
    eprintln!("rebuilt without node 3: {}; {}", r, shared.report());
    let_run(&shared, 1000).await;
    members[2].start(&[]);
    wait_public_serving(&members[2]).await;
    if let Err(e) = level(&members, None).await {
        shared.violation(format!("node 3 back: {e}"));
    }
    let held = members[0].status().await.unwrap();
    let on_3 = held.partitions.iter().filter(|p| p.nodes.contains(&3)).count();
    assert!(on_3 > 0, "node 3 back holds no partition");
    eprintln!("node 3 back, {on_3} partitions on it; {}", shared.report());
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
}

/// Restarts the client tasks on `addrs` (the same ids, model and clock).
async fn clients_on(shared: &Arc<Shared>, tasks: Tasks, addrs: &[String]) -> Tasks {
    stop_clients(shared, tasks).await;
    shared.stop.store(false, Ordering::Relaxed);
    start_clients(addrs, shared)
}

/// Starts `m` with `--join` through `via`, adds it (idempotent, retried for up to two
/// minutes) and waits until it serves its public API.
async fn join(m: &mut Member, via: &str) {
    m.start_first(&["--join", via]).await;
    let limit = Instant::now() + Duration::from_secs(120);
    while add_node(via, m).await.is_err() {
        assert!(Instant::now() < limit, "node {} not added:\n{}", m.id, m.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_public_serving(m).await;
}

/// Waits (up to 60 s) until the map `m` sees has units moving to `node`: some filling on it
/// and, with `flipped`, some already served by it too (the move is between its flips).
/// The status seen then, or None when it was not seen in time (the moves were done first).
async fn moving_to(m: &Member, node: u64, flipped: bool) -> Option<StatusResponse> {
    let limit = Instant::now() + Duration::from_secs(60);
    while Instant::now() < limit {
        if let Ok(s) = m.status().await {
            let filling = units(&s).any(|(_, f)| f.contains(&node));
            if filling && (!flipped || units(&s).any(|(n, _)| n.contains(&node))) {
                return Some(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Tablet and partition replicas per node, as `s` places them.
fn replicas_per_node(s: &StatusResponse) -> BTreeMap<u64, (usize, usize)> {
    let mut per: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for n in s.tablets.iter().flat_map(|t| &t.nodes) {
        per.entry(*n).or_default().0 += 1;
    }
    for n in s.partitions.iter().flat_map(|p| &p.nodes) {
        per.entry(*n).or_default().1 += 1;
    }
    per
}

/// Waits (up to 60 s, a safety net) until no member holds documents of a partition the map
/// does not place on it (`NodeStats` over the internal API, each node's documents per
/// partition, against the map of the first member's status), and every partition the map
/// places on a member has documents there when any member has some: the nodes that gave a
/// partition away dropped their copy, and the ones it moved to hold it. Replicas' counts are
/// not compared: a write that failed halfway may leave a partition's replicas holding
/// different documents of the ids it wrote (reads answer each id once, whichever they
/// find). The caller stops writes first. Gives the partitions holding documents on each
/// node; says what it saw otherwise.
async fn copies_dropped(members: &[&Member]) -> Result<BTreeMap<u64, usize>, String> {
    use neardup_proto::internal::NodeStatsRequest;
    use neardup_proto::internal::data_client::DataClient;
    let limit = Instant::now() + Duration::from_secs(60);
    let mut last = String::from("no answer");
    'wait: while Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(s) = members[0].status().await else { continue };
        let mut held: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
        for m in members {
            let Ok(mut c) = DataClient::connect(format!("http://{}", m.internal)).await else {
                continue 'wait;
            };
            let Ok(r) = c.node_stats(NodeStatsRequest { epoch: 0 }).await else { continue 'wait };
            let parts = r.into_inner().partitions;
            let mine = parts.iter().filter(|p| p.documents > 0).map(|p| (p.partition, p.documents));
            held.insert(m.id, mine.collect());
        }
        let mut wrong = Vec::new();
        for p in &s.partitions {
            let stored = held.values().any(|h| h.contains_key(&p.index));
            for (id, h) in &held {
                let placed = p.nodes.contains(id) || p.filling.contains(id);
                match h.get(&p.index) {
                    Some(n) if !placed => {
                        wrong.push(format!("node {id} keeps {n} of partition {}", p.index))
                    }
                    None if placed && stored => {
                        wrong.push(format!("node {id} holds none of partition {}", p.index))
                    }
                    _ => {}
                }
            }
        }
        let per_node: BTreeMap<u64, usize> = held.iter().map(|(id, h)| (*id, h.len())).collect();
        if per_node.values().sum::<usize>() == 0 {
            wrong.push("no node holds any document".into());
        }
        if wrong.is_empty() {
            return Ok(per_node);
        }
        last = wrong.join("; ");
    }
    Err(format!("copies not dropped after 60 s: {last}"))
}

/// The cluster grows from one node to four while clients write and read through the nodes
/// that serve, and each join's moves are interrupted: node 2's by killing it (the target)
/// while it fills, node 3's by killing it once some of its units flipped and others still
/// fill, node 4's by killing a source (a serving replica of a unit it fills) for longer than
/// the failure timeout. At four nodes every node holds its share, and no node keeps a copy
/// it gave away. Then node 2 is removed
/// (`neardup cluster remove`: drained, its units moved, then removed), and node 3 is killed
/// and kept down until it is marked lost and its units are rebuilt on nodes 1 and 4. Every
/// answer throughout, and at the end through the two left, is checked against the
/// acknowledged writes. Copies go in pages of 64 entries, those of 2 puts or more in bulk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_from_one_node_to_four_then_remove_one_and_kill_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut members: Vec<Member> = (1..=4).map(|id| Member::on_loopback(id, dir.path())).collect();
    for m in &mut members {
        m.args = LOST_PAGED.iter().map(|a| a.to_string()).collect();
    }
    form_members(&mut members[..1]).await;
    let shared = Shared::new();
    if let Err(e) = level_on(&members[..1], None, 1).await {
        shared.violation(format!("one node: {e}"));
    }
    let publics = |ms: &[Member]| ms.iter().map(|m| m.public.clone()).collect::<Vec<_>>();
    let mut tasks = start_clients(&publics(&members[..1]), &shared);
    let_run(&shared, 1500).await;
    let via = members[0].internal.clone();
    for i in 1..4 {
        let id = members[i].id;
        join(&mut members[i], &via).await;
        let interrupted = match i {
            1 | 2 => match moving_to(&members[0], id, i == 2).await {
                Some(_) => {
                    members[i].kill9();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    members[i].start(&[]);
                    wait_public_serving(&members[i]).await;
                    format!("killed node {id} (the target) while it filled")
                }
                None => "its moves were done before they could be interrupted".into(),
            },
            _ => {
                let source = moving_to(&members[0], id, false).await.and_then(|s| {
                    units(&s)
                        .filter(|(_, f)| f.contains(&id))
                        .find_map(|(n, _)| n.iter().copied().find(|&n| n != 1))
                });
                match source {
                    Some(source) => {
                        let k = source as usize - 1;
                        members[k].kill9();
                        let_run(&shared, 300).await;
                        tokio::time::sleep(DOWN_FOR).await;
                        members[k].start(&[]);
                        wait_public_serving(&members[k]).await;
                        format!("killed node {source} (a source) while node {id} filled")
                    }
                    None => "its moves were done before they could be interrupted".into(),
                }
            }
        };
        tasks = clients_on(&shared, tasks, &publics(&members[..=i])).await;
        if let Err(e) = level_on(&members[..=i], None, 2).await {
            shared.violation(format!("node {id} joined: {e}"));
        }
        eprintln!("node {id} joined, {interrupted}; {}", shared.report());
        let_run(&shared, 1000).await;
    }
    let per = replicas_per_node(&members[0].status().await.unwrap());
    let spread = |f: fn(&(usize, usize)) -> usize| {
        per.values().map(f).max().unwrap_or(0) - per.values().map(f).min().unwrap_or(0)
    };
    assert!(per.len() == 4 && spread(|p| p.0) <= 1 && spread(|p| p.1) <= 1, "shares: {per:?}");
    eprintln!("four nodes, (tablet, partition) replicas per node: {per:?}");
    // The nodes that gave units away dropped their copies (writes paused meanwhile).
    stop_clients(&shared, tasks).await;
    match copies_dropped(&members.iter().collect::<Vec<_>>()).await {
        Ok(per) => eprintln!("copies dropped; partitions with documents per node: {per:?}"),
        Err(e) => shared.violation(e),
    }
    shared.stop.store(false, Ordering::Relaxed);
    tasks = start_clients(&publics(&members), &shared);
    // Node 2 removed: drained first, its units moved to the others.
    let limit = Instant::now() + Duration::from_secs(120);
    while let Err(e) = members[0].cli(&["cluster", "remove", "2", "--addr", &via]) {
        assert!(Instant::now() < limit, "node 2 not removed: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    members[0].wait_status("node 2 removed", |s| s.nodes.iter().all(|n| n.id != 2)).await;
    members[1].kill9();
    let rest = [&members[0], &members[2], &members[3]].map(|m| m.public.clone());
    tasks = clients_on(&shared, tasks, &rest).await;
    if let Err(e) = level_on(&members, None, 2).await {
        shared.violation(format!("node 2 removed: {e}"));
    }
    eprintln!("node 2 removed; {}", shared.report());
    let_run(&shared, 1000).await;
    // Node 3 lost: its units rebuilt on nodes 1 and 4.
    members[2].kill9();
    let last = [&members[0], &members[3]].map(|m| m.public.clone());
    tasks = clients_on(&shared, tasks, &last).await;
    if let Err(e) = level_on(&members, Some(3), 2).await {
        shared.violation(format!("node 3 lost: {e}"));
    }
    eprintln!("node 3 lost and rebuilt; {}", shared.report());
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&last, &shared).await;
    verdict(&shared, dir.path());
}

/// Each table's tablets in `s`, in order, cover every permuted value once.
fn tiled(s: &StatusResponse) -> Result<(), String> {
    let tables = s.design.as_ref().map_or(0, |d| d.tables);
    for table in 0..tables {
        let ranges: Vec<(u64, u64)> =
            s.tablets.iter().filter(|t| t.table == table).map(|t| (t.start, t.end)).collect();
        let joined = ranges.windows(2).all(|w| w[0].1.checked_add(1) == Some(w[1].0));
        let ends =
            ranges.first().map(|r| r.0) == Some(0) && ranges.last().map(|r| r.1) == Some(u64::MAX);
        if !joined || !ends {
            return Err(format!("table {table}'s tablets do not tile its values: {ranges:x?}"));
        }
    }
    Ok(())
}

/// Tablets split while clients write and read through three nodes (`cluster.split_entries`
/// at 60 entries): each split is one map change on the same nodes, and placement then
/// spreads the new tablets over the nodes, moving them online. `neardup cluster rebalance`
/// answers with the epoch it applied at. Once level, each table's tablets still tile its
/// values, every node holds as many tablet replicas as the others (within one), and every
/// answer throughout, and at the end through each node, is exact against the
/// acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tablets_split_as_they_grow_and_placement_spreads_them() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--set", "cluster.split_entries=60", "--set", "cluster.copy_page_entries=64"];
    let (members, addrs, shared, tasks) = three_with_clients(dir.path(), &args).await;
    let first = members[0].status().await.unwrap().tablets.len();
    // A split a tablet past 60 entries, looked for every 5 s: wait up to 90 s for 20.
    let limit = Instant::now() + Duration::from_secs(90);
    let mut tablets = first;
    while tablets < first + 20 && Instant::now() < limit {
        let_run(&shared, 300).await;
        tablets = members[0].status().await.map_or(tablets, |s| s.tablets.len());
    }
    assert!(tablets >= first + 20, "{tablets} tablets from {first}: too few splits");
    let change = members[1]
        .cli(&["cluster", "rebalance", "--addr", &members[1].internal, "--timeout-ms", "5000"])
        .unwrap();
    assert!(change["epoch"].as_u64().unwrap() > 0 && change["filling"].is_u64(), "{change}");
    let_run(&shared, 1000).await;
    stop_clients(&shared, tasks).await;
    // Level, and no split in a whole check interval since: the splits and their moves are
    // over (the tablets no longer grow).
    let limit = Instant::now() + Duration::from_secs(120);
    let s = loop {
        if let Err(e) = level(&members, None).await {
            shared.violation(format!("after the splits: {e}"));
        }
        let before = members[2].status().await.unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        let s = members[2].status().await.unwrap();
        let settled = units(&s).all(|(n, f)| n.len() == 2 && f.is_empty());
        if (s.tablets.len() == before.tablets.len() && settled) || Instant::now() > limit {
            break s;
        }
    };
    if let Err(e) = tiled(&s) {
        shared.violation(e);
    }
    let per = replicas_per_node(&s);
    let counts: Vec<usize> = per.values().map(|c| c.0).collect();
    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(per.len() == 3 && hi - lo <= 1, "tablet replicas per node: {per:?}");
    eprintln!(
        "{} tablets from {first}, replicas per node {per:?}; {}",
        s.tablets.len(),
        shared.report()
    );
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
}

/// A rolling upgrade: each node in turn stopped (SIGTERM) and started again on its data as a
/// newer version (the hidden `--report-version`), while clients write and read through all
/// three. The others go on answering while each is down, every answer is checked against the
/// acknowledged writes, and at the end every node reports the new version. As an operator
/// does, the next node goes down only once the cluster is level again (every unit on two
/// serving replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_keeps_the_cluster_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, addrs, shared, tasks) = three_with_clients(dir.path(), &[]).await;
    let newer = format!("{}+upgraded", env!("CARGO_PKG_VERSION"));
    let progress =
        |s: &Shared| s.checked.load(Ordering::Relaxed) + s.acked_writes.load(Ordering::Relaxed);
    for i in 0..members.len() {
        let_run(&shared, 1000).await;
        let m = &mut members[i];
        m.terminate();
        let before = progress(&shared);
        let_run(&shared, 500).await;
        assert!(
            progress(&shared) > before,
            "nothing answered while node {} was down: {}",
            m.id,
            shared.report()
        );
        m.start(&["--report-version", &newer]);
        wait_public_serving(m).await;
        if let Err(e) = level(&members, None).await {
            shared.violation(e);
        }
        eprintln!("node {} upgraded; {}", members[i].id, shared.report());
    }
    let_run(&shared, 1000).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
    for addr in &addrs {
        let c = Client::connect(addr).await.unwrap();
        assert_eq!(c.stats().await.unwrap().version, newer, "{addr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_partition_torture() {
    let net = match Netns::create_with_clients(3) {
        Ok(n) => n,
        Err(why) => {
            skip_without(&format!("network namespaces (ip netns): {why}"));
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let mut members = net.members(dir.path());
    form_members(&mut members).await;
    let addrs: Vec<String> = members.iter().map(|m| m.public.clone()).collect();
    let shared = Shared::new();
    let tasks = start_clients(&addrs, &shared);
    for round in 0..faults() {
        let_run(&shared, 1500).await;
        // The clients still reach the node cut off: it must not answer from stale data.
        let victim = round % 3;
        net.cut(victim).unwrap();
        let_run(&shared, 1500).await;
        tokio::time::sleep(DOWN_FOR).await;
        net.heal(victim).unwrap();
        eprintln!("round {round}: cut node {} off and healed; {}", victim + 1, shared.report());
    }
    let_run(&shared, 1500).await;
    stop_clients(&shared, tasks).await;
    final_check(&addrs, &shared).await;
    verdict(&shared, dir.path());
    for m in members.iter_mut() {
        m.kill9();
    }
    drop(members);
    drop(net);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_through_each_of_three_nodes() {
    if !neardup_tests::has_python_grpc() {
        skip_without("python3 with grpcio and grpcio-tools: the Python client is not checked");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let stubs = dir.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    let generated = std::process::Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(root.join("proto"))
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg("neardup/v1/neardup.proto")
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let members = form(dir.path(), 3, &[]).await;
    level(&members, None).await.unwrap();
    let script = root.join("tests/python/cluster_client_test.py");
    let addrs: Vec<String> = members.iter().map(|m| m.public.clone()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .args(&addrs)
            .env("PYTHONPATH", &stubs)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("python cluster client: all checks passed"),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(members);
}
