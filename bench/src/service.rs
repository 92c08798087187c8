//! `neardup-bench service`: the gRPC service measured on loopback, with the in-process
//! index measured in the same run as the baseline.
//!
//! It starts `neardup serve` (the binary given with `--neardup`, by default the `neardup`
//! next to this program, else the one on `PATH`) as a child process on 127.0.0.1 with a
//! fresh data directory,
//! then, in order:
//! 1. durable streaming inserts of `--n` generated documents (several streams at once);
//! 2. waits for background merges to settle;
//! 3. the in-process index over the same documents: one thread and all threads;
//! 4. unary Query latency at each `--rates` value, open loop (see [`crate::load`]), with two
//!    floors at the same rate in interleaved one-second slices: a gRPC Health check (the
//!    stack with no index work) and a plain loopback TCP echo (the machine itself); for
//!    each, the server's CPU time per call;
//! 5. QueryBatch throughput over several streams;
//! 6. with `--admit-rates`, verified CheckAndInsert at each rate, with the same floors;
//! 7. mixed load: unary queries at a fixed rate while new documents stream in;
//! 8. restart: SIGTERM (drain, checkpoint) and start again, then `kill -9` during inserts and
//!    start again; each timed from the start of the process to health SERVING.
//!
//! Every phase is bounded in count and time. The last line of stdout is one JSON object.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, Document, Target, doc};
use neardup_core::index::QueryScratch;
use neardup_core::util::SplitMix64;
use neardup_core::{Design, Doc, Index, IndexConfig};
use neardup_proto::v1::InsertRequest;
use serde_json::{Value, json};

use crate::cpu::{CpuMeter, thread_cpu_seconds};
use crate::free_port;
use crate::load::{Kind, Load, stall_probe};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Options of `neardup-bench service`.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// Documents stored.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) n: usize,
    /// Distinct queries generated (reused round-robin by every phase).
    #[arg(long, default_value_t = 200_000)]
    queries: usize,
    /// Hamming distance.
    #[arg(long, default_value_t = 3)]
    pub(crate) k: u32,
    /// Table design of the server and the baseline.
    #[arg(long, default_value = "paper-10")]
    pub(crate) design: String,
    /// Block size of the server's and the baseline's tables (the service's default).
    #[arg(long, default_value_t = neardup_cli::config::SERVICE_BLOCK_BYTES)]
    block_bytes: usize,
    /// Offered rates (queries/s) for the unary latency phase.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    rates: Vec<u64>,
    /// Seconds per rate (and for the mixed phase).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent insert streams.
    #[arg(long, default_value_t = 4)]
    pub(crate) insert_streams: usize,
    /// Documents per insert message.
    #[arg(long, default_value_t = 2000)]
    pub(crate) insert_batch: usize,
    /// Queries per QueryBatch message.
    #[arg(long, default_value_t = 1000)]
    pub(crate) query_batch: usize,
    /// Concurrent QueryBatch streams.
    #[arg(long, default_value_t = 2)]
    pub(crate) batch_streams: usize,
    /// Queries sent through QueryBatch in all.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) batch_queries: usize,
    /// Unary rate of the mixed phase.
    #[arg(long, default_value_t = 5000)]
    mixed_rate: u64,
    /// Offered rates (calls/s) of verified CheckAndInsert (new documents with sketches, the
    /// server's verification defaults), each with its Health and TCP echo floors; none: the
    /// phase is skipped.
    #[arg(long, value_delimiter = ',')]
    admit_rates: Vec<u64>,
    /// Store the documents with (synthetic) sketches, so verification reads them.
    #[arg(long)]
    sketches: bool,
    /// Documents per second streamed in during the mixed phase.
    #[arg(long, default_value_t = 20_000)]
    mixed_insert_rate: u64,
    /// Data directory for the server (removed first) [default: a fresh temporary one].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Seed of the generated workload.
    #[arg(long, default_value_t = 20070508)]
    seed: u64,
    /// Extra `--set key=value` settings for the server (repeatable).
    #[arg(long = "server-set")]
    server_set: Vec<String>,
    /// The `neardup` binary to start as the server [default: `neardup` next to this
    /// program, else the one on PATH].
    #[arg(long, value_name = "FILE")]
    neardup: Option<PathBuf>,
    /// Instead of the phases above: what TLS costs. Two servers over the same documents, one
    /// plaintext and one with TLS (certificates from `neardup cert`), measured in alternating
    /// rounds: QueryBatch throughput and unary Query latency (see [`crate::service_tls`]).
    #[arg(long)]
    pub(crate) tls: bool,
    /// Rounds of the TLS comparison (each measures both servers).
    #[arg(long, default_value_t = 5)]
    pub(crate) tls_rounds: usize,
    /// Unary calls per server and round in the TLS comparison.
    #[arg(long, default_value_t = 5000)]
    pub(crate) tls_unary_calls: usize,
}

impl ServiceArgs {
    /// The `neardup` binary the server runs.
    pub(crate) fn neardup(&self) -> PathBuf {
        neardup_binary(self.neardup.as_deref())
    }
}

/// The `neardup` binary a benchmark starts: `explicit` if given, else `neardup` next to this
/// program, else the one on PATH.
pub(crate) fn neardup_binary(explicit: Option<&std::path::Path>) -> PathBuf {
    if let Some(path) = explicit {
        return path.to_path_buf();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("neardup")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("neardup"))
}

/// The generated workload: stored fingerprints (id = position) and queries.
pub(crate) struct Workload {
    pub(crate) stored: Vec<u64>,
    pub(crate) queries: Vec<u64>,
}

pub(crate) fn workload(n: usize, q: usize, seed: u64) -> Workload {
    let mut r = SplitMix64::new(seed);
    let mut stored: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
    for _ in 0..n / 100 {
        let (dst, src) = (r.below(n as u64) as usize, r.below(n as u64) as usize);
        let flips = 1 + r.below(3) as u32;
        stored[dst] = r.flip_bits(stored[src], flips);
    }
    let queries = (0..q)
        .map(|i| {
            if i % 2 == 0 {
                let s = stored[r.below(n as u64) as usize];
                let flips = r.below(4) as u32;
                r.flip_bits(s, flips)
            } else {
                r.next_u64()
            }
        })
        .collect();
    Workload { stored, queries }
}

pub(crate) fn name(i: usize) -> String {
    format!("https://bench.example/page/{i}")
}

/// The server under test, a child process.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) addr: String,
    /// Its Prometheus endpoint (host:port), when it serves one.
    metrics: Option<String>,
}

impl ServerProcess {
    /// The server of `args` on 127.0.0.1:`port`, with `extra` settings after `args`'.
    pub(crate) fn start_with(
        data: &std::path::Path,
        port: u16,
        args: &ServiceArgs,
        extra: &[String],
    ) -> Result<Self, String> {
        let mut sets = vec![
            format!("index.block_bytes={}", args.block_bytes),
            // Compact as soon as the loading stops, so the measured phases see one run and
            // no background merge (later --server-set values override this).
            "storage.compact_idle_secs=1".to_string(),
        ];
        sets.extend(args.server_set.iter().cloned());
        sets.extend(extra.iter().cloned());
        let metrics = format!("127.0.0.1:{}", free_port()?);
        Self::launch(&args.neardup(), data, port, Some(&args.design), &sets, Some(&metrics))
    }

    /// `neardup serve` from `exe` on 127.0.0.1:`port` with data in `data`, table design
    /// `design` (none: the server's default), `--set` settings `sets`, and its metrics at
    /// `metrics` (none: no endpoint).
    pub(crate) fn launch(
        exe: &std::path::Path,
        data: &std::path::Path,
        port: u16,
        design: Option<&str>,
        sets: &[String],
        metrics: Option<&str>,
    ) -> Result<Self, String> {
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(exe);
        cmd.args(["serve", "--data"]).arg(data).args([
            "--listen",
            &addr,
            "--metrics-listen",
            metrics.unwrap_or(""),
        ]);
        if let Some(design) = design {
            cmd.args(["--design", design]);
        }
        for s in sets {
            cmd.args(["--set", s]);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        let child =
            cmd.spawn().map_err(|e| format!("cannot start the server {}: {e}", exe.display()))?;
        Ok(ServerProcess { child, addr, metrics: metrics.map(str::to_string) })
    }

    /// Waits until health says SERVING; the time since `since`.
    pub(crate) async fn wait_serving(
        &mut self,
        since: Instant,
        limit: Duration,
    ) -> Result<f64, String> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the server exited early: {status}"));
            }
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
                .map_err(|e| e.to_string())?;
            if let Ok(channel) = endpoint.connect().await {
                let mut c = HealthClient::new(channel);
                let req = HealthCheckRequest { service: String::new() };
                if let Ok(r) = c.check(req).await
                    && r.get_ref().status == ServingStatus::Serving as i32
                {
                    return Ok(since.elapsed().as_secs_f64());
                }
            }
            if Instant::now() > deadline {
                return Err("the server did not become healthy in time".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGTERM and wait; the seconds it took to exit.
    pub(crate) fn stop(mut self) -> Result<f64, String> {
        let t = Instant::now();
        self.signal(libc::SIGTERM);
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the server exited with {status}"));
        }
        Ok(t.elapsed().as_secs_f64())
    }

    fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// QueryBatch over `streams` concurrent streams (stream `s` on `clients[s % len]`), `per`
/// queries each from `queries` (stream `s` starting at `s * per`), `args.k` and
/// `args.query_batch` queries a message; the queries answered and the matches.
pub(crate) async fn query_batch_streams(
    clients: &[Client],
    streams: usize,
    queries: &Arc<Vec<u64>>,
    per: usize,
    args: &ServiceArgs,
) -> Result<(usize, usize), String> {
    let mut tasks = Vec::new();
    for s in 0..streams {
        let c = clients[s % clients.len()].clone();
        let targets: Vec<Target> =
            (0..per).map(|i| Target::Fingerprint(queries[(s * per + i) % queries.len()])).collect();
        let (k, b) = (args.k, args.query_batch);
        tasks.push(tokio::spawn(async move { c.query_all(&targets, Some(k), 100, b).await }));
    }
    let (mut answered, mut matched) = (0, 0);
    for task in tasks {
        let r = task.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        answered += r.len();
        matched += r.iter().map(|x| x.matches.len()).sum::<usize>();
    }
    Ok((answered, matched))
}

/// Streams documents `range` over `streams` concurrent InsertStream calls at most `rate`
/// documents/s (0: as fast as possible); returns documents acknowledged.
pub(crate) async fn insert_range(
    client: &Client,
    fps: Arc<Vec<u64>>,
    range: std::ops::Range<usize>,
    streams: usize,
    batch: usize,
    rate: u64,
    sketches: bool,
) -> Result<u64, String> {
    let per = range.len().div_ceil(streams.max(1));
    let mut tasks = Vec::new();
    for s in 0..streams.max(1) {
        let lo = range.start + s * per;
        let hi = (lo + per).min(range.end);
        if lo >= hi {
            continue;
        }
        let client = client.clone();
        let fps = fps.clone();
        let rate_each = rate / streams.max(1) as u64;
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel::<InsertRequest>(4);
            let producer = tokio::spawn(async move {
                let start = Instant::now();
                let mut sent = 0u64;
                for chunk_start in (lo..hi).step_by(batch) {
                    let chunk_end = (chunk_start + batch).min(hi);
                    let documents: Vec<Document> = (chunk_start..chunk_end)
                        .map(|i| {
                            let mut d = doc(name(i), fps[i], i as i64);
                            if sketches {
                                d.sketch = crate::load::synthetic_sketch(fps[i]);
                            }
                            d
                        })
                        .collect();
                    sent += documents.len() as u64;
                    if tx.send(InsertRequest { documents }).await.is_err() {
                        return;
                    }
                    if rate_each > 0 {
                        let due = start + Duration::from_secs_f64(sent as f64 / rate_each as f64);
                        tokio::time::sleep_until(due.into()).await;
                    }
                }
            });
            let mut rpc = client.raw();
            let mut req = tonic::Request::new(ReceiverStream::new(rx));
            req.set_timeout(Duration::from_secs(3600));
            let r = rpc.insert_stream(req).await;
            let _ = producer.await;
            r.map(|r| r.into_inner().inserted).map_err(|e| e.to_string())
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total)
}

/// Waits until the index is one run (the server compacts once writes stop; the benchmark
/// starts it with a short idle time) or at least steady; the seconds it took.
pub(crate) async fn settle(client: &Client, limit: Duration) -> Result<(f64, u64), String> {
    let t = Instant::now();
    let mut last = (u64::MAX, u64::MAX);
    let mut steady = 0;
    while t.elapsed() < limit {
        let s = client.stats().await.map_err(|e| e.to_string())?;
        let now = (s.runs, s.merges);
        // One run, stored, is the end state (the server compacts and checkpoints when writes
        // stop); otherwise wait until nothing is buffered, merging or pending and nothing has
        // changed for 3 s.
        if s.runs <= 1 && s.buffered == 0 && !s.checkpoint_pending {
            return Ok((t.elapsed().as_secs_f64(), s.runs));
        }
        if now == last && s.buffered == 0 && !s.merging && !s.checkpoint_pending {
            steady += 1;
            if steady >= 6 {
                return Ok((t.elapsed().as_secs_f64(), s.runs));
            }
        } else {
            steady = 0;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok((t.elapsed().as_secs_f64(), last.0))
}

/// Runs `neardup-bench service`.
pub async fn run(args: ServiceArgs) -> Result<(), String> {
    let design = Design::parse(&args.design).map_err(|e| e.to_string())?;
    let tmp;
    let data = match &args.data {
        Some(d) => {
            let _ = std::fs::remove_dir_all(d);
            d.clone()
        }
        None => {
            tmp = tempfile_dir()?;
            tmp.clone()
        }
    };
    eprintln!("generating {} documents and {} queries", args.n, args.queries);
    let w = workload(args.n + 200_000, args.queries, args.seed);
    let fps = Arc::new(w.stored);
    let queries = Arc::new(w.queries);
    if args.tls {
        let report = crate::service_tls::run(&args, &data, fps, queries).await?;
        println!("{report}");
        return Ok(());
    }
    let port = free_port()?;
    let mut server = ServerProcess::start_with(&data, port, &args, &[])?;
    server.wait_serving(Instant::now(), Duration::from_secs(60)).await?;
    let options = ClientOptions { timeout: Duration::from_secs(600), ..ClientOptions::default() };
    let clients: Vec<Client> = futures_join(
        // One connection per QueryBatch stream, up to four.
        (0..args.batch_streams.clamp(1, 4))
            .map(|_| Client::connect_with(&server.addr, options.clone()))
            .collect(),
    )
    .await?;
    let client = clients[0].clone();
    let mut report = serde_json::Map::new();
    report.insert("load_average_at_start".into(), json!(load_average()));
    report.insert("n".into(), json!(args.n));
    report.insert("k".into(), json!(args.k));
    report.insert("design".into(), json!(design.to_string()));

    // 1. Durable streaming inserts.
    eprintln!("inserting {} documents over {} streams", args.n, args.insert_streams);
    let t = Instant::now();
    let inserted = insert_range(
        &client,
        fps.clone(),
        0..args.n,
        args.insert_streams,
        args.insert_batch,
        0,
        args.sketches,
    )
    .await?;
    let secs = t.elapsed().as_secs_f64();
    report.insert(
        "insert".into(),
        json!({ "documents": inserted, "seconds": secs, "docs_per_second": inserted as f64 / secs }),
    );
    eprintln!("  {:.0} documents/s durable", inserted as f64 / secs);

    // 2. Merges settle.
    let (settle_secs, runs) = settle(&client, Duration::from_secs(600)).await?;
    report.insert("settle".into(), json!({ "seconds": settle_secs, "runs": runs }));
    let stats = client.stats().await.map_err(|e| e.to_string())?;
    report.insert(
        "server".into(),
        json!({ "documents": stats.documents, "runs": stats.runs, "index_bytes": stats.index_bytes,
                "disk_bytes": stats.disk_bytes, "wal_bytes": stats.wal_bytes }),
    );

    // 3. The in-process index, same documents, same design.
    eprintln!("in-process baseline");
    let baseline = {
        let docs: Vec<Doc> = fps[..args.n]
            .iter()
            .enumerate()
            .map(|(i, &fp)| Doc { id: i as u64, fp, ts: i as i64 })
            .collect();
        let config = IndexConfig {
            design: design.clone(),
            tables: neardup_core::codec::TableOptions {
                block_bytes: args.block_bytes,
                ..Default::default()
            },
            ..IndexConfig::default()
        };
        let index = Index::build(config, &docs).map_err(|e| e.to_string())?;
        drop(docs);
        let qs = &queries[..queries.len().min(200_000)];
        let (mut scratch, mut out) = (QueryScratch::default(), Vec::new());
        let t = Instant::now();
        let cpu = thread_cpu_seconds();
        let mut results = 0usize;
        for &q in qs {
            index.query_into(q, args.k, &mut scratch, &mut out).map_err(|e| e.to_string())?;
            results += out.len();
        }
        let one = t.elapsed().as_secs_f64();
        let one_cpu = match (cpu, thread_cpu_seconds()) {
            (Some(a), Some(b)) => b - a,
            _ => one,
        };
        // All threads: the median of three passes (one pass is a fraction of a second, and
        // the other work of a shared machine moves it).
        let mut all = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let r = index.query_batch(qs, args.k).map_err(|e| e.to_string())?;
            all.push(t.elapsed().as_secs_f64());
            drop(r);
        }
        all.sort_by(f64::total_cmp);
        let all = all[1];
        json!({
            "runs": 1,
            "us_per_query_one_thread": one * 1e6 / qs.len() as f64,
            "cpu_us_per_query_one_thread": one_cpu * 1e6 / qs.len() as f64,
            "qps_one_thread": qs.len() as f64 / one,
            "qps_all_threads": qs.len() as f64 / all,
            "results": results,
        })
    };
    report.insert("in_process".into(), baseline.clone());

    // 4. Unary latency, open loop, with the gRPC and machine floors in interleaved slices.
    // First, how often this machine stalls a thread that never sleeps.
    let probe =
        tokio::task::spawn_blocking(|| stall_probe(3.0)).await.map_err(|e| e.to_string())?;
    eprintln!(
        "machine: {:.1} stalls over 1 ms a second, longest {:.1} ms (a spinning thread, 3 s)",
        probe["stalls_over_1ms_per_second"].as_f64().unwrap_or(0.0),
        probe["max_stall_ms"].as_f64().unwrap_or(0.0)
    );
    report.insert("machine_stalls".into(), probe);
    let load = |rate, kinds| Load {
        addr: server.addr.clone(),
        queries: queries.clone(),
        k: args.k,
        rate,
        seconds: args.seconds,
        kinds,
        server_pid: Some(server.pid()),
        until: None,
    };
    // CPU time against CPU time: the server's per call, the index's per query on one thread.
    let inproc_us = baseline["cpu_us_per_query_one_thread"].as_f64().unwrap_or(0.0);
    let mut unary = Vec::new();
    for &rate in &args.rates {
        eprintln!(
            "unary queries at {rate}/s for {} s (with Health and TCP echo, interleaved)",
            args.seconds
        );
        let mut r = load(rate, vec![Kind::Query, Kind::Health, Kind::Echo]).measure().await?;
        for kind in [Kind::Query, Kind::Health, Kind::Echo] {
            let x = &r[kind.name()];
            eprintln!(
                "  {:<12} p50 {} us, p99 {} us, p999 {} us, {:.0}/s; CPU per call: server {} us, \
                 generator {:.1} us",
                kind.name(),
                x["p50_us"],
                x["p99_us"],
                x["p999_us"],
                x["achieved_qps"].as_f64().unwrap_or(0.0),
                cpu_figure(&x["server_cpu_us_per_call"]),
                x["generator_cpu_us_per_call"].as_f64().unwrap_or(0.0),
            );
        }
        eprintln!("  (in-process query: {inproc_us:.2} us of CPU, one thread)");
        let mut entry = r.remove(Kind::Query.name()).unwrap_or_default();
        entry["floor"] = Value::Object(r);
        unary.push(entry);
    }
    report.insert("unary".into(), json!(unary));

    // 5. QueryBatch throughput, before the admissions add documents: against the same
    // compacted index as the in-process baseline.
    eprintln!("QueryBatch: {} queries over {} streams", args.batch_queries, args.batch_streams);
    let per = args.batch_queries / args.batch_streams.max(1);
    let mut batch_cpu = CpuMeter::of(Some(server.pid()));
    let mut client_cpu = CpuMeter::of(Some(std::process::id()));
    batch_cpu.start();
    client_cpu.start();
    let t = Instant::now();
    let (answered, matched) =
        query_batch_streams(&clients, args.batch_streams.max(1), &queries, per, &args).await?;
    let batch_secs = t.elapsed().as_secs_f64();
    batch_cpu.stop();
    client_cpu.stop();
    let batch_qps = answered as f64 / batch_secs;
    let batch_cpu_us = batch_cpu.us_per(answered as u64);
    let client_cpu_us = client_cpu.us_per(answered as u64);
    let inproc_all = baseline["qps_all_threads"].as_f64().unwrap_or(1.0);
    eprintln!(
        "  {batch_qps:.0} queries/s ({:.2}x the in-process all-threads rate); CPU a query: \
         server {} us, client {} us (in process: {inproc_us:.2} us)",
        batch_qps / inproc_all,
        cpu_figure(&json!(batch_cpu_us)),
        cpu_figure(&json!(client_cpu_us)),
    );
    report.insert(
        "query_batch".into(),
        json!({ "queries": answered, "matches": matched, "seconds": batch_secs, "qps": batch_qps,
                "server_cpu_us_per_query": batch_cpu_us, "client_cpu_us_per_query": client_cpu_us }),
    );

    // 6. Verified CheckAndInsert, open loop, with the same floors.
    let mut admit = Vec::new();
    for &rate in &args.admit_rates {
        eprintln!("verified CheckAndInsert at {rate}/s for {} s (with floors)", args.seconds);
        let kinds = vec![Kind::Admit, Kind::AdmitPlain, Kind::Health, Kind::Echo];
        let before = server.admission_stages().await;
        let mut r = load(rate, kinds.clone()).measure().await?;
        let stages = match (before, server.admission_stages().await) {
            (Ok(a), Ok(b)) => stage_report(&a, &b),
            (Err(e), _) | (_, Err(e)) => json!({ "error": e }),
        };
        print_stages(&stages);
        for kind in kinds {
            let x = &r[kind.name()];
            eprintln!(
                "  {:<26} p50 {} us, p99 {} us, p999 {} us, errors {}",
                kind.name(),
                x["p50_us"],
                x["p99_us"],
                x["p999_us"],
                x["errors"]
            );
        }
        let mut entry = r.remove(Kind::Admit.name()).unwrap_or_default();
        if let Value::Object(m) = &mut entry {
            m.insert("floor_grpc_health".into(), r.remove(Kind::Health.name()).unwrap_or_default());
            m.insert(
                "same_write_unverified".into(),
                r.remove(Kind::AdmitPlain.name()).unwrap_or_default(),
            );
            m.insert("floor_tcp_echo".into(), r.remove(Kind::Echo.name()).unwrap_or_default());
            m.insert("server_stages".into(), stages);
        }
        admit.push(entry);
    }
    if !admit.is_empty() {
        let stats = client.stats().await.map_err(|e| e.to_string())?;
        report.insert("check_and_insert_verified".into(), json!(admit));
        report.insert(
            "server_after_admissions".into(),
            json!({ "documents": stats.documents, "disk_bytes": stats.disk_bytes }),
        );
    }

    // The gRPC cost per query against the in-process index, measured above.
    let unary_p50 = unary.first().and_then(|u| u["p50_us"].as_f64()).unwrap_or(0.0);
    // Server CPU per unary query, over the Query slices of every rate.
    let unary_cpu: Vec<Value> = unary
        .iter()
        .map(|u| {
            json!({ "offered_qps": u["offered_qps"], "server_cpu_us_per_query":
                         u["server_cpu_us_per_call"] })
        })
        .collect();
    report.insert(
        "grpc_cost".into(),
        json!({
            "in_process_cpu_us_per_query": inproc_us,
            "unary_server_cpu": unary_cpu,
            "batch_server_cpu_us_per_query": batch_cpu_us,
            "unary_p50_minus_in_process_us":
                unary_p50 - baseline["us_per_query_one_thread"].as_f64().unwrap_or(0.0),
            "batch_qps_fraction_of_in_process": batch_qps / inproc_all,
        }),
    );

    // 7. Mixed: unary reads at a fixed rate while documents stream in.
    eprintln!(
        "mixed: {} queries/s with {} documents/s streaming in, {} s",
        args.mixed_rate, args.mixed_insert_rate, args.seconds
    );
    let extra = (args.mixed_insert_rate * args.seconds) as usize;
    let extra = extra.min(fps.len() - args.n);
    let writer = {
        let c = client.clone();
        let fps = fps.clone();
        let (n, b, rate) = (args.n, args.insert_batch.min(500), args.mixed_insert_rate);
        tokio::spawn(async move {
            let t = Instant::now();
            let r = insert_range(&c, fps, n..n + extra, 1, b, rate, false).await;
            (r, t.elapsed().as_secs_f64())
        })
    };
    let mut reads = load(args.mixed_rate, vec![Kind::Query]).measure().await?;
    let reads = reads.remove(Kind::Query.name()).unwrap_or_default();
    let (written, wsecs) = writer.await.map_err(|e| e.to_string())?;
    let written = written?;
    eprintln!(
        "  reads p99 {} us; {:.0} documents/s written",
        reads["p99_us"],
        written as f64 / wsecs
    );
    report.insert(
        "mixed".into(),
        json!({ "reads": reads, "documents_written": written, "write_docs_per_second": written as f64 / wsecs }),
    );

    // 8. Restarts.
    drop(clients);
    drop(client);
    eprintln!("restart after SIGTERM");
    let stop_secs = server.stop()?;
    let t = Instant::now();
    let mut server = ServerProcess::start_with(&data, port, &args, &[])?;
    let clean = server.wait_serving(t, Duration::from_secs(600)).await?;
    eprintln!("  {clean:.2} s to serving (shutdown took {stop_secs:.2} s)");
    // A crash: kill -9 while documents stream in, then start again.
    let c = Client::connect_with(&server.addr, options.clone()).await.map_err(|e| e.to_string())?;
    let fps2 = fps.clone();
    let n = args.n;
    let crash_writer = tokio::spawn(async move {
        insert_range(&c, fps2, n..n + 100_000.min(extra.max(1)), 2, 1000, 0, false).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill9();
    let _ = crash_writer.await;
    eprintln!("restart after kill -9");
    let t = Instant::now();
    let mut server = ServerProcess::start_with(&data, port, &args, &[])?;
    let crash = server.wait_serving(t, Duration::from_secs(600)).await?;
    eprintln!("  {crash:.2} s to serving");
    report.insert(
        "restart".into(),
        json!({ "shutdown_seconds": stop_secs, "clean_seconds_to_serving": clean,
                "after_kill9_seconds_to_serving": crash }),
    );
    server.stop()?;
    report.insert("load_average_at_end".into(), json!(load_average()));
    if args.data.is_none() {
        let _ = std::fs::remove_dir_all(&data);
    }
    println!("{}", Value::Object(report));
    Ok(())
}

/// A CPU figure in microseconds as printed: one decimal, or "n/a" without a measurement.
fn cpu_figure(v: &Value) -> String {
    v.as_f64().map_or_else(|| "n/a".to_string(), |x| format!("{x:.1}"))
}

/// Runs `neardup-bench service` on a multi-threaded tokio runtime of its own.
pub fn main(args: ServiceArgs) -> Result<(), String> {
    on_own_runtime(run(args))
}

/// Runs a benchmark's future on a multi-threaded tokio runtime of its own.
pub(crate) fn on_own_runtime(
    benchmark: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(benchmark);
    // Background threads must not keep a finished process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The 1-minute load average: other work on the machine skews every figure.
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(-1.0)
}

pub(crate) fn tempfile_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir().join(format!("neardup-bench-{}", std::process::id()));
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    Ok(base)
}

async fn futures_join<T, F>(futs: Vec<F>) -> Result<Vec<T>, String>
where
    F: std::future::Future<Output = Result<T, neardup_client::ClientError>>,
{
    let mut out = Vec::with_capacity(futs.len());
    for f in futs {
        out.push(f.await.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// One stage's histogram as the server's `/metrics` reports it: cumulative counts by upper
/// bound (seconds), and the count and sum.
#[derive(Debug, Clone, Default)]
pub(crate) struct StageHistogram {
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: f64,
}

impl ServerProcess {
    /// The server's `neardup_admission_stage_seconds` histograms, by stage, read from its
    /// `/metrics` endpoint.
    pub(crate) async fn admission_stages(
        &self,
    ) -> Result<std::collections::BTreeMap<String, StageHistogram>, String> {
        let addr = self.metrics.as_deref().ok_or("the server serves no metrics")?;
        let body = metrics_page(addr).await?;
        Ok(parse_stages(&body))
    }
}

/// The `/metrics` page of the server whose metrics listener is `addr`.
pub(crate) async fn metrics_page(addr: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let failed = |e: std::io::Error| format!("metrics at {addr}: {e}");
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(failed)?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(failed)?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut body))
        .await
        .map_err(|_| format!("metrics at {addr}: no answer in 10 s"))?
        .map_err(failed)?;
    Ok(body)
}

/// The value of the series `name` (without labels) in an OpenMetrics text page.
pub(crate) fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The admission stage histograms in an OpenMetrics text page.
fn parse_stages(page: &str) -> std::collections::BTreeMap<String, StageHistogram> {
    const NAME: &str = "neardup_admission_stage_seconds_";
    let mut out: std::collections::BTreeMap<String, StageHistogram> = Default::default();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(NAME) else { continue };
        let Some((series, value)) = rest.rsplit_once(' ') else { continue };
        let Some((kind, labels)) = series.split_once('{') else { continue };
        let label = |name: &str| {
            labels.split(',').find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k == name).then(|| v.trim_end_matches('}').trim_matches('"').to_string())
            })
        };
        let Some(stage) = label("stage") else { continue };
        let h = out.entry(stage).or_default();
        match kind {
            "bucket" => {
                let le = label("le").and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::INFINITY);
                h.buckets.push((le, value.parse::<f64>().unwrap_or(0.0) as u64));
            }
            "count" => h.count = value.parse::<f64>().unwrap_or(0.0) as u64,
            "sum" => h.sum = value.parse().unwrap_or(0.0),
            _ => {}
        }
    }
    out
}

/// What each stage added between two readings: count, mean, and the bucket bounds that hold
/// the median and the 99th percentile.
fn stage_report(
    before: &std::collections::BTreeMap<String, StageHistogram>,
    after: &std::collections::BTreeMap<String, StageHistogram>,
) -> Value {
    let mut out = serde_json::Map::new();
    for (stage, b) in after {
        let a = before.get(stage).cloned().unwrap_or_default();
        let count = b.count.saturating_sub(a.count);
        if count == 0 {
            continue;
        }
        let at = |q: f64| {
            let want = (q * count as f64).ceil() as u64;
            b.buckets
                .iter()
                .map(|&(le, n)| {
                    let was = a.buckets.iter().find(|x| x.0 == le).map_or(0, |x| x.1);
                    (le, n.saturating_sub(was))
                })
                .find(|&(_, n)| n >= want)
                .map_or(f64::INFINITY, |(le, _)| le)
        };
        let us =
            |s: f64| if s.is_finite() { json!(s * 1e6) } else { json!("above the last bucket") };
        out.insert(
            stage.clone(),
            json!({ "count": count, "mean_us": (b.sum - a.sum) / count as f64 * 1e6,
                    "p50_at_most_us": us(at(0.5)), "p99_at_most_us": us(at(0.99)) }),
        );
    }
    Value::Object(out)
}

fn print_stages(stages: &Value) {
    let Value::Object(m) = stages else { return };
    if let Some(e) = m.get("error") {
        eprintln!("  server stages: {e}");
        return;
    }
    eprintln!("  server stages (verified and unverified admissions together):");
    for (stage, x) in m {
        eprintln!(
            "    {stage:<13} {} calls, mean {:.0} us, p50 <= {} us, p99 <= {} us",
            x["count"],
            x["mean_us"].as_f64().unwrap_or(0.0),
            x["p50_at_most_us"],
            x["p99_at_most_us"]
        );
    }
}
