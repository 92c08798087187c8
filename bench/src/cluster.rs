//! `neardup-bench cluster`: the cluster's data path measured on real processes on loopback,
//! with one node measured in the same run as the baseline.
//!
//! It starts 3 `neardup serve` nodes (the binary given with `--neardup`): node 1 with
//! `--bootstrap`, nodes 2 and 3 with `--join`, and waits until each serves its public API.
//! Every call goes **through a router**: the public listener of node 1, which routes each
//! probe, write and resolve to the nodes holding the tablets and partitions (two replicas of
//! each). Then, for the cluster and for a single `neardup serve` started after it (same
//! design, same documents):
//! 1. durable inserts of `--docs` generated documents (unary Insert batches, several in
//!    flight; a batch refused with UNAVAILABLE, as during a leader election, is sent again
//!    and counted), then background merges settle; with the servers' CPU time per
//!    document (utime + stime of every node process: until the last batch is acknowledged,
//!    and until the merges settle), which a shared machine's noise moves far less than the
//!    rate;
//! 2. bytes per document: `Stats.index_bytes` (the index in memory: tables, runs, buffers),
//!    `Stats.document_bytes` (the document table in memory: names, timestamps, clusters)
//!    and `Stats.disk_bytes` (disk) of the whole cluster (any node's `Stats` sums every
//!    node's own), each divided by the documents loaded;
//! 3. unary Query latency at each `--rates` value, open loop, with the same-run floors of
//!    `neardup-bench service` (a gRPC Health check and a loopback TCP echo, interleaved
//!    one-second slices);
//! 4. QueryBatch throughput over several streams, and the servers' CPU time per query;
//! 5. the cluster only: unary queries at `--kill-rate` for `--kill-seconds` while node 3 is
//!    killed with `kill -9` one second in, and a writer sending one-document inserts every
//!    10 ms: the time from the kill until writes succeed again (0 when none failed).
//!
//! 6. the cluster only: node 3 killed again and kept down past `--rebuild-after-ms` (the
//!    nodes' `cluster.rebuild_after_ms`), so the leader marks it lost and its units are
//!    rebuilt on nodes 1 and 2 from the surviving replicas: the time from the kill until it
//!    is marked lost, then until every unit has two serving replicas on nodes 1 and 2 with
//!    none filling, and the rebuild rate: the in-memory bytes of node 3's replicas
//!    (`Stats.index_bytes` times its share of the tablet replicas, plus
//!    `Stats.document_bytes` times its share of the partition replicas) over that time.
//!    Unary queries at `--kill-rate` run for `--kill-seconds` from the mark (while the
//!    rebuild runs, when it lasts that long), then as long again once it is done, the
//!    baseline on the same nodes: `--server-set cluster.copy_rate_mb=N` shows what a cap
//!    on the copies buys. Node 3 is then started again: the time until placement has
//!    settled on three nodes (it is placed like a new node).
//!
//! Before the kill it also reads the nodes' logs: the Raft thread's stalls of 250 ms or more
//! (a sync of the Raft store, one round of Raft's work, or a delivery of Raft messages to a
//! peer), the leaders that stepped down for want of a quorum's answers, and the nodes the
//! leader marked down for silence. A node marked down copies its replicas again once back,
//! so figures taken meanwhile measure those copies too.
//!
//! Every phase is bounded in count and time. It prints a table; with `--json` the last line
//! of stdout is one JSON object. `--keep` keeps the nodes' data directories and logs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, Target, doc};
use neardup_proto::v1::InsertRequest;
use serde_json::{Value, json};

use crate::cpu::{cpu_of, cpu_per};
use crate::free_port;
use crate::load::{Kind, Load, stall_probe};
use crate::service::{load_average, name, settle, tempfile_dir, workload};

mod grow;

/// Options of `neardup-bench cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Documents loaded (into the cluster, and into the single node).
    #[arg(long, default_value_t = 10_000_000)]
    docs: usize,
    /// Distinct queries generated (reused round-robin by every phase).
    #[arg(long, default_value_t = 200_000)]
    queries: usize,
    /// Hamming distance.
    #[arg(long, default_value_t = 3)]
    k: u32,
    /// Table design of the nodes.
    #[arg(long, default_value = "paper-10")]
    design: String,
    /// Offered rates (queries/s) of the unary latency phase.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    rates: Vec<u64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Insert batches in flight at once.
    #[arg(long, default_value_t = 4)]
    insert_streams: usize,
    /// Documents per insert batch.
    #[arg(long, default_value_t = 2000)]
    insert_batch: usize,
    /// Queries per QueryBatch message.
    #[arg(long, default_value_t = 1000)]
    query_batch: usize,
    /// Concurrent QueryBatch streams.
    #[arg(long, default_value_t = 2)]
    batch_streams: usize,
    /// Queries sent through QueryBatch in all.
    #[arg(long, default_value_t = 1_000_000)]
    batch_queries: usize,
    /// Unary rate while a node is killed.
    #[arg(long, default_value_t = 1000)]
    kill_rate: u64,
    /// Seconds of the kill phase (the kill comes one second in).
    #[arg(long, default_value_t = 10)]
    kill_seconds: u64,
    /// The nodes' `cluster.rebuild_after_ms`: longer than the kill phase, so only the rebuild
    /// phase marks node 3 lost.
    #[arg(long, default_value_t = 30_000)]
    rebuild_after_ms: u64,
    /// Raft tick of the nodes, ms (the service's default is 100).
    #[arg(long, default_value_t = 100)]
    tick_ms: u64,
    /// Skip the single-node baseline.
    #[arg(long)]
    no_single: bool,
    /// Print the figures as one JSON object on the last line too.
    #[arg(long)]
    json: bool,
    /// Keep the nodes' data directories and logs (under the directory printed at the end).
    #[arg(long)]
    keep: bool,
    /// Grow instead: one node loaded, then nodes 2 to 4 joined, figures at 1, 2 and 4 nodes
    /// and each join's rebalance timed (see `grow.rs`).
    #[arg(long)]
    grow: bool,
    /// `--grow`: documents inserted at each size, for the insert cost there [default: a
    /// tenth of `--docs`].
    #[arg(long)]
    grow_inserts: Option<usize>,
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 20070508)]
    seed: u64,
    /// Extra `--set key=value` settings for every node (repeatable).
    #[arg(long = "server-set")]
    server_set: Vec<String>,
    /// The `neardup` binary to start [default: `neardup` next to this program, else the one
    /// on PATH].
    #[arg(long, value_name = "FILE")]
    neardup: Option<PathBuf>,
}

/// One node process: a cluster member (with an internal listener) or a single server.
struct Proc {
    public: String,
    internal: Option<String>,
    /// The metrics listener.
    metrics: String,
    id: u64,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    fn new(id: u64, base: &Path, cluster: bool) -> Result<Proc, String> {
        let public = format!("127.0.0.1:{}", free_port()?);
        let internal = if cluster { Some(format!("127.0.0.1:{}", free_port()?)) } else { None };
        let name = if cluster { format!("node-{id}") } else { "single".into() };
        Ok(Proc {
            public,
            internal,
            metrics: format!("127.0.0.1:{}", free_port()?),
            id,
            data: base.join(&name),
            log: base.join(format!("{name}.log")),
            child: None,
        })
    }

    fn start(&mut self, args: &ClusterArgs, extra: &[&str]) -> Result<(), String> {
        let exe = crate::service::neardup_binary(args.neardup.as_deref());
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--data"]).arg(&self.data);
        cmd.args(["--listen", &self.public, "--metrics-listen", &self.metrics]);
        cmd.args(["--design", &args.design]);
        if let Some(internal) = &self.internal {
            cmd.args(["--internal-listen", internal, "--node-id", &self.id.to_string()]);
            cmd.args(["--set", &format!("cluster.tick_ms={}", args.tick_ms)]);
            cmd.args(["--set", &format!("cluster.rebuild_after_ms={}", args.rebuild_after_ms)]);
        }
        // Compact as soon as loading stops, as `neardup-bench service` does.
        cmd.args(["--set", "storage.compact_idle_secs=1"]);
        for s in &args.server_set {
            cmd.args(["--set", s]);
        }
        cmd.args(extra);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the public health says SERVING (up to `limit`).
    async fn serving(&mut self, limit: Duration) -> Result<(), String> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        let end = Instant::now() + limit;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "node {} exited ({status}); its log: {}",
                    self.id,
                    self.log.display()
                ));
            }
            let endpoint =
                tonic::transport::Endpoint::from_shared(format!("http://{}", self.public))
                    .map_err(|e| e.to_string())?;
            if let Ok(channel) = endpoint.connect().await
                && let Ok(r) = HealthClient::new(channel)
                    .check(HealthCheckRequest { service: String::new() })
                    .await
                && r.get_ref().status == ServingStatus::Serving as i32
            {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!("node {} not SERVING within {limit:?}", self.id));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What the nodes' logs say of the map's health so far (phases 1 to 4): the Raft thread's
/// stalls (a store sync, one round of Raft's work, or a delivery of messages to a peer, of
/// 250 ms or more; each delays heartbeats), the leaders that stepped down because a quorum
/// had not answered within an election timeout (the map takes no change until a new leader
/// is elected, gid grants included), and the nodes the leader marked down for silence. A
/// node marked down turns its replicas to filling when back, each copied again: figures
/// taken while that happens measure the copies too.
fn log_events(procs: &[Proc]) -> Value {
    let (mut syncs, mut sync_max, mut readies, mut ready_max, mut downs) = (0, 0, 0, 0, 0);
    let (mut deliveries, mut delivery_max, mut step_downs) = (0, 0, 0);
    for p in procs {
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        for line in text.lines() {
            let took = || {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix("took_ms="))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if line.contains("syncing the Raft store took long") {
                syncs += 1;
                sync_max = sync_max.max(took());
            } else if line.contains("handling Raft's readies took long") {
                readies += 1;
                ready_max = ready_max.max(took());
            } else if line.contains("marking a silent node down") {
                downs += 1;
            } else if line.contains("Raft messages took long to deliver") {
                deliveries += 1;
                delivery_max = delivery_max.max(took());
            } else if line.contains("stepped down to follower since quorum is not active") {
                step_downs += 1;
            }
        }
    }
    json!({
        "slow_store_syncs": syncs,
        "slowest_store_sync_ms": sync_max,
        "slow_readies": readies,
        "slowest_ready_ms": ready_max,
        "nodes_marked_down": downs,
        "slow_deliveries": deliveries,
        "slowest_delivery_ms": delivery_max,
        "leader_step_downs": step_downs,
    })
}

/// Starts 3 nodes (bootstrap, 2 joins) and waits until each serves.
async fn start_cluster(args: &ClusterArgs, base: &Path) -> Result<Vec<Proc>, String> {
    let mut procs: Vec<Proc> =
        (1..=3).map(|id| Proc::new(id, base, true)).collect::<Result<_, _>>()?;
    procs[0].start(args, &["--bootstrap"])?;
    procs[0].serving(Duration::from_secs(120)).await?;
    let via = procs[0].internal.clone().expect("a cluster node");
    for p in procs.iter_mut().skip(1) {
        p.start(args, &["--join", &via])?;
    }
    for p in procs.iter_mut() {
        p.serving(Duration::from_secs(120)).await?;
    }
    placed(&via, 3, Duration::from_secs(120)).await?;
    Ok(procs)
}

/// Waits until the map at the member `internal` has `nodes` active nodes and every tablet and
/// partition on `min(replicas, nodes)` serving replicas with none filling: placement has
/// settled, so the load that follows measures the cluster, not its first copies.
async fn placed(internal: &str, nodes: usize, limit: Duration) -> Result<(), String> {
    use neardup_proto::admin::StatusRequest;
    use neardup_proto::admin::admin_client::AdminClient;
    let until = Instant::now() + limit;
    let mut last = String::from("no answer yet");
    while Instant::now() < until {
        if let Ok(mut c) = AdminClient::connect(format!("http://{internal}")).await
            && let Ok(r) = c.status(StatusRequest {}).await
        {
            let s = r.into_inner();
            let want = (s.replicas as usize).min(nodes);
            let active_state = neardup_proto::admin::NodeState::Active as i32;
            let active = s.nodes.iter().filter(|n| n.state == active_state).count();
            let settled = |n: &[u64], f: &[u64]| n.len() == want && f.is_empty();
            let done = active == nodes
                && !s.partitions.is_empty()
                && s.tablets.iter().all(|t| settled(&t.nodes, &t.filling))
                && s.partitions.iter().all(|p| settled(&p.nodes, &p.filling));
            if done {
                return Ok(());
            }
            last = format!("epoch {}, {active} of {nodes} nodes active", s.epoch);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("placement did not settle within {limit:?}: {last}"))
}

/// The shared inputs of the phases.
struct Inputs {
    fps: Arc<Vec<u64>>,
    queries: Arc<Vec<u64>>,
}

/// Phases 1 to 4 through `router`, over the nodes `nodes` (public addresses) run by the
/// processes `pids` (for the CPU they spend per document and per query).
async fn measure(
    args: &ClusterArgs,
    inputs: &Inputs,
    router: &str,
    nodes: &[String],
    pids: &[u32],
) -> Result<serde_json::Map<String, Value>, String> {
    let options = ClientOptions { timeout: Duration::from_secs(600), ..ClientOptions::default() };
    let mut out = serde_json::Map::new();
    // 1. Durable inserts, then merges settle on every node. A batch that fails with
    // UNAVAILABLE (a leader election, a node being marked down) is sent again, up to 40 times
    // about 250 ms apart, as a crawler would: an insert by id is idempotent.
    let writer = writer(router).await?;
    let t = Instant::now();
    let cpu_start = cpu_of(pids);
    let inserted = insert_batches(
        &writer,
        inputs.fps.clone(),
        0..args.docs,
        args.insert_streams,
        args.insert_batch,
    )
    .await?;
    let secs = t.elapsed().as_secs_f64();
    let cpu_acked = cpu_of(pids);
    eprintln!("  {:.0} documents/s durable", inserted as f64 / secs);
    out.insert("documents_inserted".into(), json!(inserted));
    out.insert("insert_docs_per_second".into(), json!(inserted as f64 / secs));
    out.insert("insert_batches_retried".into(), json!(writer.calls_retried()));
    let mut stats = Vec::new();
    for addr in nodes {
        let c = Client::connect_with(addr, options.clone()).await.map_err(|e| e.to_string())?;
        settle(&c, Duration::from_secs(300)).await?;
        stats.push(c.stats().await.map_err(|e| e.to_string())?);
    }
    // The servers' CPU per document: until the last insert was acknowledged, and until the
    // merges it left had settled too (the whole cost of taking a document in).
    let cpu_settled = cpu_of(pids);
    out.insert("insert_cpu_us_per_doc".into(), json!(cpu_per(cpu_start, cpu_acked, inserted)));
    out.insert(
        "insert_settled_cpu_us_per_doc".into(),
        json!(cpu_per(cpu_start, cpu_settled, inserted)),
    );
    // 2. Bytes per document. A node's public `Stats` covers the whole cluster (its router
    // sums every node's own statistics), so one answer holds every node's bytes.
    let memory = stats[0].index_bytes;
    let documents = stats[0].document_bytes;
    let disk = stats[0].disk_bytes;
    let held: Vec<u64> = stats.iter().map(|s| s.documents).collect();
    let per = |b: u64| b as f64 / args.docs.max(1) as f64;
    out.insert("documents_per_node".into(), json!(held));
    out.insert("memory_bytes_per_doc".into(), json!(per(memory)));
    out.insert("document_table_bytes_per_doc".into(), json!(per(documents)));
    out.insert("disk_bytes_per_doc".into(), json!(per(disk)));
    out.extend(query_figures(args, inputs, router, pids).await?);
    Ok(out)
}

/// Phases 3 and 4 through `router`: unary latency at each `--rates` value with the floors,
/// then QueryBatch throughput and the CPU per query of the processes `pids`.
async fn query_figures(
    args: &ClusterArgs,
    inputs: &Inputs,
    router: &str,
    pids: &[u32],
) -> Result<serde_json::Map<String, Value>, String> {
    let options = ClientOptions { timeout: Duration::from_secs(600), ..ClientOptions::default() };
    let mut out = serde_json::Map::new();
    // 3. Unary latency with the floors.
    let mut unary = Vec::new();
    for &rate in &args.rates {
        eprintln!("  unary queries at {rate}/s for {} s (with Health and TCP echo)", args.seconds);
        let load = Load {
            addr: router.to_string(),
            queries: inputs.queries.clone(),
            k: args.k,
            rate,
            seconds: args.seconds,
            kinds: vec![Kind::Query, Kind::Health, Kind::Echo],
            server_pid: None,
            until: None,
        };
        let r = load.measure().await?;
        unary.push(json!({
            "rate": rate,
            "query": r[Kind::Query.name()],
            "grpc_health": r[Kind::Health.name()],
            "tcp_echo": r[Kind::Echo.name()],
        }));
    }
    out.insert("unary".into(), json!(unary));
    // 4. QueryBatch throughput.
    let streams = args.batch_streams.max(1);
    let per_stream = args.batch_queries / streams;
    let t = Instant::now();
    let cpu_start = cpu_of(pids);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let c = Client::connect_with(router, options.clone()).await.map_err(|e| e.to_string())?;
        let q = &inputs.queries;
        let targets: Vec<Target> = (0..per_stream)
            .map(|i| Target::Fingerprint(q[(s * per_stream + i) % q.len()]))
            .collect();
        let (k, b) = (args.k, args.query_batch);
        tasks.push(tokio::spawn(async move { c.query_all(&targets, Some(k), 100, b).await }));
    }
    let mut answered = 0usize;
    for task in tasks {
        answered += task.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?.len();
    }
    let qps = answered as f64 / t.elapsed().as_secs_f64();
    out.insert(
        "query_batch_cpu_us".into(),
        json!(cpu_per(cpu_start, cpu_of(pids), answered as u64)),
    );
    eprintln!("  QueryBatch {qps:.0} queries/s");
    out.insert("query_batch_queries".into(), json!(answered));
    out.insert("query_batch_qps".into(), json!(qps));
    Ok(out)
}

/// A client through `router` whose inserts are sent again on UNAVAILABLE (a leader
/// election, a node marked down), up to 40 times about 250 ms apart.
async fn writer(router: &str) -> Result<Client, String> {
    let options = ClientOptions {
        timeout: Duration::from_secs(600),
        attempts: 41,
        backoff: Duration::from_millis(250),
        max_backoff: Duration::from_millis(250),
        ..ClientOptions::default()
    };
    Client::connect_with(router, options).await.map_err(|e| e.to_string())
}

/// Durable inserts of documents `docs` (indexes into `fps`), `batch` a unary Insert
/// ([`Client::insert`]), `streams` of them in flight. Returns the documents stored.
async fn insert_batches(
    client: &Client,
    fps: Arc<Vec<u64>>,
    docs: std::ops::Range<usize>,
    streams: usize,
    batch: usize,
) -> Result<u64, String> {
    let (streams, batch) = (streams.max(1), batch.max(1));
    let chunks = docs.len().div_ceil(batch);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (client, fps, first) = (client.clone(), fps.clone(), docs.start);
        let end = docs.end;
        tasks.push(tokio::spawn(async move {
            let mut stored = 0u64;
            for c in (s..chunks).step_by(streams) {
                let range = first + c * batch..(first + (c + 1) * batch).min(end);
                let documents: Vec<_> = range.map(|i| doc(name(i), fps[i], i as i64)).collect();
                let r = client.insert(documents).await;
                stored += r.map_err(|e| format!("insert of batch {c}: {e}"))?.inserted;
            }
            Ok::<_, String>(stored)
        }));
    }
    let mut stored = 0;
    for t in tasks {
        stored += t.await.map_err(|e| e.to_string())??;
    }
    Ok(stored)
}

/// Unary queries through `router` at `--kill-rate` for `--kill-seconds` (2 at least).
fn query_load(args: &ClusterArgs, inputs: &Inputs, router: &str) -> Load {
    Load {
        addr: router.to_string(),
        queries: inputs.queries.clone(),
        k: args.k,
        rate: args.kill_rate,
        seconds: args.kill_seconds.max(2),
        kinds: vec![Kind::Query],
        server_pid: None,
        until: None,
    }
}

/// Phase 5: queries through `router` while `victim` is killed; writes retried until they
/// succeed again.
async fn kill_phase(
    args: &ClusterArgs,
    inputs: &Inputs,
    router: &str,
    victim: &mut Proc,
) -> Result<Value, String> {
    let load = query_load(args, inputs, router);
    let reads = tokio::spawn(load.measure());
    let options =
        ClientOptions { timeout: Duration::from_secs(1), attempts: 1, ..ClientOptions::default() };
    let writer = Client::connect_with(router, options).await.map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    victim.kill9();
    // One-document inserts every 10 ms until one succeeds after the first failure, or the
    // phase ends with none failed (bounded by the phase's length plus 60 s).
    let mut failed = 0u64;
    let mut back_after = None;
    let end = killed + Duration::from_secs(args.kill_seconds + 60);
    for i in 0u64.. {
        if Instant::now() > end {
            break;
        }
        let d = doc(
            format!("https://bench.example/kill/{i}"),
            inputs.fps[i as usize % inputs.fps.len()],
            i as i64,
        );
        let ok = writer.raw().insert(InsertRequest { documents: vec![d] }).await.is_ok();
        if ok && failed > 0 {
            back_after = Some(killed.elapsed().as_secs_f64());
            break;
        }
        if !ok {
            failed += 1;
        }
        if ok && killed.elapsed() > Duration::from_secs(args.kill_seconds.max(2)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reads = reads.await.map_err(|e| e.to_string())??;
    // Back in the cluster for the rest of the run.
    victim.start(args, &[])?;
    victim.serving(Duration::from_secs(120)).await?;
    Ok(json!({
        "query": reads[Kind::Query.name()],
        "writes_failed": failed,
        "writes_back_after_seconds": back_after.unwrap_or(0.0),
        "victim": victim.id,
    }))
}

/// The map as the member at `internal` has it.
async fn status(internal: &str) -> Result<neardup_proto::admin::StatusResponse, String> {
    use neardup_proto::admin::StatusRequest;
    use neardup_proto::admin::admin_client::AdminClient;
    let mut c =
        AdminClient::connect(format!("http://{internal}")).await.map_err(|e| e.to_string())?;
    Ok(c.status(StatusRequest {}).await.map_err(|e| e.to_string())?.into_inner())
}

/// Phase 6 (see the module docs).
async fn rebuild_phase(
    args: &ClusterArgs,
    inputs: &Inputs,
    router: &str,
    internal: &str,
    victim: &mut Proc,
) -> Result<Value, String> {
    placed(internal, 3, Duration::from_secs(600)).await?;
    let map = status(internal).await?;
    let share = |units: Vec<&Vec<u64>>| {
        let all: usize = units.iter().map(|n| n.len()).sum();
        let mine = units.iter().filter(|n| n.contains(&victim.id)).count();
        mine as f64 / all.max(1) as f64
    };
    let tablet_share = share(map.tablets.iter().map(|t| &t.nodes).collect());
    let partition_share = share(map.partitions.iter().map(|p| &p.nodes).collect());
    let stats = Client::connect(router).await.map_err(|e| e.to_string())?;
    let st = stats.stats().await.map_err(|e| e.to_string())?;
    let bytes = st.index_bytes as f64 * tablet_share + st.document_bytes as f64 * partition_share;
    let killed = Instant::now();
    victim.kill9();
    let limit = Duration::from_millis(args.rebuild_after_ms) + Duration::from_secs(120);
    let lost = loop {
        if killed.elapsed() > limit {
            return Err(format!("node {} not marked lost within {limit:?}", victim.id));
        }
        if let Ok(s) = status(internal).await
            && s.nodes.iter().any(|n| n.id == victim.id && n.lost)
        {
            break killed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Unary queries at `--kill-rate` from the mark for `--kill-seconds` (during the rebuild,
    // or as much of it as lasts that long), then as long again once it is done: the
    // baseline, on the same two nodes and data.
    let load = query_load(args, inputs, router);
    let during = tokio::spawn(load.clone().measure());
    placed(internal, 2, Duration::from_secs(1800)).await?;
    let rebuilt = killed.elapsed() - lost;
    let during = during.await.map_err(|e| e.to_string())??;
    let after = load.measure().await?;
    let back = Instant::now();
    victim.start(args, &[])?;
    victim.serving(Duration::from_secs(120)).await?;
    placed(internal, 3, Duration::from_secs(1800)).await?;
    let secs = rebuilt.as_secs_f64();
    Ok(json!({
        "victim": victim.id,
        "marked_lost_after_seconds": lost.as_secs_f64(),
        "rebuild_seconds": secs,
        "rebuilt_bytes": bytes,
        "rebuild_mb_per_second": bytes / 1e6 / secs.max(1e-9),
        "query_during": during[Kind::Query.name()],
        "query_after": after[Kind::Query.name()],
        "settled_after_return_seconds": back.elapsed().as_secs_f64(),
    }))
}

async fn run(args: ClusterArgs) -> Result<(), String> {
    let base = tempfile_dir()?.join("cluster");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    let mut report = serde_json::Map::new();
    report.insert("load_average_at_start".into(), json!(load_average()));
    report.insert("docs".into(), json!(args.docs));
    report.insert("k".into(), json!(args.k));
    report.insert("design".into(), json!(args.design));
    let probe =
        tokio::task::spawn_blocking(|| stall_probe(2.0)).await.map_err(|e| e.to_string())?;
    report.insert("machine_stalls".into(), probe);
    if args.grow {
        report.insert("grow".into(), grow::run(&args, &base).await?);
    } else {
        three_and_one(&args, &base, &mut report).await?;
    }
    report.insert("load_average_at_end".into(), json!(load_average()));
    if args.keep {
        eprintln!("data and logs kept in {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
        // The run's own directory too, once nothing else of it is left there.
        if let Some(parent) = base.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
    let report = Value::Object(report);
    if args.grow {
        grow::print_table(&args, &report);
    } else {
        print_table(&args, &report);
    }
    if args.json {
        println!("{report}");
    }
    Ok(())
}

/// Three nodes measured, then one (see the module docs).
async fn three_and_one(
    args: &ClusterArgs,
    base: &Path,
    report: &mut serde_json::Map<String, Value>,
) -> Result<(), String> {
    eprintln!("generating {} documents and {} queries", args.docs, args.queries);
    let w = workload(args.docs, args.queries, args.seed);
    let inputs = Inputs { fps: Arc::new(w.stored), queries: Arc::new(w.queries) };
    eprintln!("3 nodes: starting (bootstrap + 2 joins)");
    let mut procs = start_cluster(args, base).await?;
    let nodes: Vec<String> = procs.iter().map(|p| p.public.clone()).collect();
    let router = nodes[0].clone();
    eprintln!("3 nodes: measuring through the router at {router}");
    let pids: Vec<u32> = procs.iter().filter_map(|p| p.child.as_ref().map(Child::id)).collect();
    let mut cluster = measure(args, &inputs, &router, &nodes, &pids).await?;
    cluster.insert("raft_health".into(), log_events(&procs));
    eprintln!("3 nodes: kill -9 of node 3 under {} queries/s", args.kill_rate);
    let kill = kill_phase(args, &inputs, &router, &mut procs[2]).await?;
    cluster.insert("kill".into(), kill);
    eprintln!("3 nodes: node 3 killed and kept down until it is rebuilt elsewhere");
    let internal = procs[0].internal.clone().expect("a cluster node");
    let rebuild = rebuild_phase(args, &inputs, &router, &internal, &mut procs[2]).await?;
    cluster.insert("rebuild".into(), rebuild);
    for p in procs.iter_mut() {
        p.terminate();
    }
    drop(procs);
    report.insert("cluster".into(), Value::Object(cluster));

    if !args.no_single {
        eprintln!("1 node: starting");
        let mut single = Proc::new(0, base, false)?;
        single.start(args, &[])?;
        single.serving(Duration::from_secs(120)).await?;
        let addr = single.public.clone();
        let pids: Vec<u32> = single.child.as_ref().map(Child::id).into_iter().collect();
        let one = measure(args, &inputs, &addr, std::slice::from_ref(&addr), &pids).await?;
        single.terminate();
        report.insert("single".into(), Value::Object(one));
    }
    Ok(())
}

/// The figures as a table: one column for the cluster, one for the single node.
fn print_table(args: &ClusterArgs, r: &Value) {
    let (c, s) = (&r["cluster"], &r["single"]);
    let num = |v: &Value, digits: usize| match v.as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    };
    println!(
        "neardup-bench cluster: {} documents, k = {}, design {}, 3 nodes on loopback through \
         node 1's public listener; load average {} at start, {} at end",
        args.docs, args.k, args.design, r["load_average_at_start"], r["load_average_at_end"]
    );
    println!("| figure | 3 nodes | 1 node |");
    println!("|---|---:|---:|");
    let row = |name: &str, key: &str, digits: usize| {
        println!("| {name} | {} | {} |", num(&c[key], digits), num(&s[key], digits));
    };
    row("durable inserts, documents/s", "insert_docs_per_second", 0);
    row("insert batches sent again after UNAVAILABLE", "insert_batches_retried", 0);
    row("server CPU per document inserted, us (every node)", "insert_cpu_us_per_doc", 1);
    row("... and with the merges it left, until settled, us", "insert_settled_cpu_us_per_doc", 1);
    row("index in memory, bytes/document (every node)", "memory_bytes_per_doc", 1);
    row("document table in memory, bytes/document", "document_table_bytes_per_doc", 1);
    row("disk, bytes/document (every node)", "disk_bytes_per_doc", 1);
    row("QueryBatch, queries/s", "query_batch_qps", 0);
    row("server CPU per QueryBatch query, us (every node)", "query_batch_cpu_us", 2);
    for (i, &rate) in args.rates.iter().enumerate() {
        for (what, kind) in [
            ("Query", "query"),
            ("floor: gRPC Health", "grpc_health"),
            ("floor: TCP echo", "tcp_echo"),
        ] {
            let cell = |side: &Value| {
                let x = &side["unary"][i][kind];
                if x.is_null() {
                    return "-".to_string();
                }
                format!(
                    "{} / {} / {}",
                    num(&x["p50_us"], 0),
                    num(&x["p99_us"], 0),
                    num(&x["p999_us"], 0)
                )
            };
            println!("| {what} at {rate}/s, p50/p99/p999 us | {} | {} |", cell(c), cell(s));
        }
    }
    let h = &c["raft_health"];
    println!(
        "| Raft stalls of 250 ms or more before the kill: store syncs (slowest, ms); rounds \
         (slowest, ms); message deliveries (slowest, ms); leader step-downs; nodes marked down \
         | {} ({}); {} ({}); {} ({}); {}; {} | - |",
        h["slow_store_syncs"],
        h["slowest_store_sync_ms"],
        h["slow_readies"],
        h["slowest_ready_ms"],
        h["slow_deliveries"],
        h["slowest_delivery_ms"],
        h["leader_step_downs"],
        h["nodes_marked_down"]
    );
    let k = &c["kill"];
    println!(
        "| Query at {}/s during kill -9 of node {}, p50/p99/p999 us (errors) | {} / {} / {} ({}) | - |",
        args.kill_rate,
        k["victim"],
        num(&k["query"]["p50_us"], 0),
        num(&k["query"]["p99_us"], 0),
        num(&k["query"]["p999_us"], 0),
        k["query"]["errors"]
    );
    println!(
        "| writes failed after the kill; succeeding again after, s | {}; {} | - |",
        k["writes_failed"],
        num(&k["writes_back_after_seconds"], 2)
    );
    let b = &c["rebuild"];
    println!(
        "| node {} lost: marked lost after, s; rebuilt on the other two in, s; rebuilt, MB; \
         rate, MB/s; settled on three after its return, s | {}; {}; {}; {}; {} | - |",
        b["victim"],
        num(&b["marked_lost_after_seconds"], 1),
        num(&b["rebuild_seconds"], 2),
        num(&(b["rebuilt_bytes"].as_f64().unwrap_or(0.0) / 1e6).into(), 1),
        num(&b["rebuild_mb_per_second"], 1),
        num(&b["settled_after_return_seconds"], 2)
    );
    let windows =
        [("from the mark, rebuilding", &b["query_during"]), ("once rebuilt", &b["query_after"])];
    for (when, q) in windows {
        println!(
            "| Query at {}/s for {} s {when}, p50/p99/p999 us (errors) | \
             {} / {} / {} ({}) | - |",
            args.kill_rate,
            args.kill_seconds.max(2),
            num(&q["p50_us"], 0),
            num(&q["p99_us"], 0),
            num(&q["p999_us"], 0),
            q["errors"]
        );
    }
    println!(
        "| documents (Stats through each node) | {} | {} |",
        c["documents_per_node"], s["documents_per_node"]
    );
}

/// Runs `neardup-bench cluster` on a tokio runtime of its own.
pub fn main(args: ClusterArgs) -> Result<(), String> {
    if args.docs == 0 || args.queries == 0 || args.rates.is_empty() {
        return Err("--docs, --queries and --rates must not be empty or 0".into());
    }
    crate::service::on_own_runtime(run(args))
}
