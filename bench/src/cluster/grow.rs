//! `neardup-bench cluster --grow`: the cluster grown from one node to four under queries,
//! measured at 1, 2 and 4 nodes, and each join's rebalance timed.
//!
//! 1. Node 1 starts with `--bootstrap` and takes `--docs` documents (durable inserts through
//!    its public listener, the router of every phase).
//! 2. At each size (1 node; node 2 joined; nodes 3 and 4 joined, one after the other) it
//!    measures:
//!    - the cost of taking documents in: `--grow-inserts` new documents inserted (default a
//!      tenth of `--docs`), their rate and the servers' CPU per document (every node
//!      process, until acknowledged and until the merges settle);
//!    - each node's own bytes (`NodeStats` over the internal API: the index and document
//!      table in memory, and disk), and how far the most distant node is from the mean of
//!      the in-memory bytes: the balance;
//!    - the query figures of `neardup-bench cluster` (unary latency at each `--rates` value
//!      with the floors, QueryBatch throughput and the servers' CPU per query), from which
//!      queries/s per core follows.
//! 3. Each join: the time from the new node's start until placement settled (every unit on
//!    `min(2, nodes)` serving replicas, none filling), the bytes the new node then holds and
//!    their rate, and unary queries at `--kill-rate` during that time and for
//!    `--kill-seconds` once settled (the baseline on the same nodes and data): the ratio of
//!    their p99 is what a rebalance costs queries. Beside them, the cores the nodes kept busy
//!    on average in each window (their CPU time over the window's length), and as long with
//!    no load before the baseline: what the copies, drops and merges add to the queries' own
//!    work, figures a shared machine's noise moves far less than a tail latency.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use neardup_proto::internal::NodeStatsRequest;
use neardup_proto::internal::data_client::DataClient;

use super::*;
use crate::cpu::CoresBusy;
use crate::service::settle;

/// A node's own bytes, from its `NodeStats` (internal API).
async fn node_bytes(internal: &str) -> Result<Value, String> {
    let epoch = status(internal).await?.epoch;
    let mut c =
        DataClient::connect(format!("http://{internal}")).await.map_err(|e| e.to_string())?;
    let r = c.node_stats(NodeStatsRequest { epoch }).await.map_err(|e| e.to_string())?;
    let s = r.into_inner().stats.unwrap_or_default();
    Ok(json!({
        "index_bytes": s.index_bytes,
        "document_bytes": s.document_bytes,
        "memory_bytes": s.index_bytes + s.document_bytes,
        "disk_bytes": s.disk_bytes,
        "documents": s.documents,
    }))
}

/// The largest distance of a node's in-memory bytes from the mean, as a fraction of it.
fn imbalance(nodes: &[Value]) -> f64 {
    let bytes: Vec<f64> = nodes.iter().map(|n| n["memory_bytes"].as_f64().unwrap_or(0.0)).collect();
    let mean = bytes.iter().sum::<f64>() / bytes.len().max(1) as f64;
    bytes.iter().map(|b| (b - mean).abs() / mean.max(1.0)).fold(0.0, f64::max)
}

/// The router's hedged read calls so far (sent, won), from the node's `/metrics`.
async fn hedged(node: &Proc) -> Result<(u64, u64), String> {
    let page = crate::service::metrics_page(&node.metrics).await?;
    let value = |name: &str| {
        crate::service::metric_value(&page, name)
            .map(|v| v as u64)
            .ok_or_else(|| format!("node {}'s metrics have no {name}", node.id))
    };
    Ok((value("neardup_router_hedged_calls_total")?, value("neardup_router_hedged_won_total")?))
}

/// The running processes' ids.
fn pids(procs: &[Proc]) -> Vec<u32> {
    procs.iter().filter_map(|p| p.child.as_ref().map(Child::id)).collect()
}

/// Figures at the current size (the running `procs`, routed through the first): inserts of
/// the documents `docs`, bytes per node, then the query figures.
async fn size_figures(
    args: &ClusterArgs,
    inputs: &Inputs,
    procs: &[Proc],
    docs: Range<usize>,
) -> Result<serde_json::Map<String, Value>, String> {
    let router = procs[0].public.as_str();
    let pids = pids(procs);
    let mut out = serde_json::Map::new();
    out.insert("nodes".into(), json!(procs.len()));
    let writer = writer(router).await?;
    let t = Instant::now();
    let cpu_start = cpu_of(&pids);
    let inserted =
        insert_batches(&writer, inputs.fps.clone(), docs, args.insert_streams, args.insert_batch)
            .await?;
    let secs = t.elapsed().as_secs_f64();
    let cpu_acked = cpu_of(&pids);
    settle(&writer, Duration::from_secs(300)).await?;
    out.insert("documents_inserted".into(), json!(inserted));
    out.insert("insert_docs_per_second".into(), json!(inserted as f64 / secs));
    out.insert("insert_cpu_us_per_doc".into(), json!(cpu_per(cpu_start, cpu_acked, inserted)));
    out.insert(
        "insert_settled_cpu_us_per_doc".into(),
        json!(cpu_per(cpu_start, cpu_of(&pids), inserted)),
    );
    let mut nodes = Vec::new();
    for p in procs {
        nodes.push(node_bytes(p.internal.as_deref().expect("a cluster node")).await?);
    }
    let held = writer.stats().await.map_err(|e| e.to_string())?.documents;
    let sum = |key: &str| nodes.iter().map(|n| n[key].as_u64().unwrap_or(0)).sum::<u64>();
    let per = |b: u64| b as f64 / held.max(1) as f64;
    out.insert("documents".into(), json!(held));
    out.insert("memory_bytes_per_doc".into(), json!(per(sum("index_bytes"))));
    out.insert("document_table_bytes_per_doc".into(), json!(per(sum("document_bytes"))));
    out.insert("disk_bytes_per_doc".into(), json!(per(sum("disk_bytes"))));
    out.insert("imbalance".into(), json!(imbalance(&nodes)));
    out.insert("per_node".into(), json!(nodes));
    eprintln!("  {} nodes: measuring queries", procs.len());
    out.extend(query_figures(args, inputs, router, &pids).await?);
    Ok(out)
}

/// Node `procs[j]` joins through `via`; the rebalance that follows is timed, with queries
/// through the router during it and once it is done.
async fn join(
    args: &ClusterArgs,
    inputs: &Inputs,
    procs: &mut [Proc],
    j: usize,
    via: &str,
) -> Result<Value, String> {
    let router = procs[0].public.clone();
    let done = Arc::new(AtomicBool::new(false));
    let mut during = query_load(args, inputs, &router);
    // Bounded by the rebalance's own limit below.
    during.seconds = 1800;
    during.until = Some(done.clone());
    let hedged_before = hedged(&procs[0]).await?;
    // The new node's process starts at no CPU: the nodes' CPU from here is the join's.
    let busy = CoresBusy::start(&pids(procs));
    let reads = tokio::spawn(during.measure());
    let t = Instant::now();
    let joined = async {
        procs[j].start(args, &["--join", via])?;
        procs[j].serving(Duration::from_secs(120)).await?;
        placed(via, j + 1, Duration::from_secs(1800)).await
    }
    .await;
    let secs = t.elapsed().as_secs_f64();
    let cores_during = busy.cores(&pids(procs));
    done.store(true, Ordering::Relaxed);
    let during = reads.await.map_err(|e| e.to_string())??;
    let hedged_after = hedged(&procs[0]).await?;
    joined?;
    settle(&writer(&router).await?, Duration::from_secs(300)).await?;
    // Cores busy on average, every node together: while settling (queries, copies, drops,
    // merges), with the queries alone, and with nothing to do (Raft's ticks, the nodes'
    // own checks) for as long.
    let idle = CoresBusy::start(&pids(procs));
    tokio::time::sleep(Duration::from_secs(args.kill_seconds.max(2))).await;
    let cores_idle = idle.cores(&pids(procs));
    let busy = CoresBusy::start(&pids(procs));
    let after = query_load(args, inputs, &router).measure().await?;
    let cores_after = busy.cores(&pids(procs));
    let moved = node_bytes(procs[j].internal.as_deref().expect("a cluster node")).await?;
    let bytes = moved["memory_bytes"].as_f64().unwrap_or(0.0);
    let p99 = |r: &serde_json::Map<String, Value>| r[Kind::Query.name()]["p99_us"].as_f64();
    let ratio = match (p99(&during), p99(&after)) {
        (Some(d), Some(a)) if a > 0.0 => json!(d / a),
        _ => Value::Null,
    };
    eprintln!("  node {} joined: settled in {secs:.1} s, {:.1} MB on it", j + 1, bytes / 1e6);
    Ok(json!({
        "node": procs[j].id,
        "nodes": j + 1,
        "rebalance_seconds": secs,
        "new_node_bytes": bytes,
        "mb_per_second": bytes / 1e6 / secs.max(1e-9),
        "query_during": during[Kind::Query.name()],
        "hedged_calls_during": hedged_after.0 - hedged_before.0,
        "hedged_won_during": hedged_after.1 - hedged_before.1,
        "query_after": after[Kind::Query.name()],
        "p99_ratio": ratio,
        "server_cores_during": cores_during,
        "server_cores_after": cores_after,
        "server_cores_idle": cores_idle,
    }))
}

/// The whole run (see the module docs); the report.
pub(super) async fn run(args: &ClusterArgs, base: &Path) -> Result<Value, String> {
    let extra = args.grow_inserts.unwrap_or(args.docs / 10).max(1);
    eprintln!("generating {} documents and {} queries", args.docs + 3 * extra, args.queries);
    let w = workload(args.docs + 3 * extra, args.queries, args.seed);
    let inputs = Inputs { fps: Arc::new(w.stored), queries: Arc::new(w.queries) };
    let mut procs: Vec<Proc> =
        (1..=4).map(|id| Proc::new(id, base, true)).collect::<Result<_, _>>()?;
    procs[0].start(args, &["--bootstrap"])?;
    procs[0].serving(Duration::from_secs(120)).await?;
    let via = procs[0].internal.clone().expect("a cluster node");
    placed(&via, 1, Duration::from_secs(120)).await?;
    eprintln!("1 node: loading {} documents", args.docs);
    let t = Instant::now();
    let router = procs[0].public.clone();
    let loaded = insert_batches(
        &writer(&router).await?,
        inputs.fps.clone(),
        0..args.docs,
        args.insert_streams,
        args.insert_batch,
    )
    .await?;
    let load_secs = t.elapsed().as_secs_f64();
    let (mut sizes, mut joins) = (Vec::new(), Vec::new());
    let mut next = args.docs;
    for (n, joining) in [(1, 1..1), (2, 1..2), (4, 2..4)] {
        for j in joining {
            eprintln!("node {} joins", j + 1);
            joins.push(join(args, &inputs, &mut procs, j, &via).await?);
        }
        eprintln!("{n} nodes: inserting {extra} documents");
        let docs = next..next + extra;
        next += extra;
        sizes.push(Value::Object(size_figures(args, &inputs, &procs[..n], docs).await?));
    }
    for p in procs.iter_mut() {
        p.terminate();
    }
    Ok(json!({
        "loaded": loaded,
        "load_docs_per_second": loaded as f64 / load_secs,
        "sizes": sizes,
        "joins": joins,
    }))
}

/// The figures as two tables: one column per size, then one row per join.
pub(super) fn print_table(args: &ClusterArgs, r: &Value) {
    let num = |v: &Value, digits: usize| match v.as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    };
    let g = &r["grow"];
    let sizes = g["sizes"].as_array().cloned().unwrap_or_default();
    println!(
        "neardup-bench cluster --grow: {} documents loaded into one node ({} documents/s), \
         k = {}, design {}, on loopback through node 1's public listener; load average {} at \
         start, {} at end",
        g["loaded"],
        num(&g["load_docs_per_second"], 0),
        args.k,
        args.design,
        r["load_average_at_start"],
        r["load_average_at_end"]
    );
    let head: Vec<String> = sizes.iter().map(|s| format!("{} nodes", s["nodes"])).collect();
    println!("| figure | {} |", head.join(" | "));
    println!("|---|{}", "---:|".repeat(sizes.len()));
    let row = |name: &str, cell: &dyn Fn(&Value) -> String| {
        let cells: Vec<String> = sizes.iter().map(cell).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    let key = |k: &'static str, digits: usize| move |s: &Value| num(&s[k], digits);
    row("documents held", &key("documents", 0));
    row("durable inserts, documents/s", &key("insert_docs_per_second", 0));
    row("server CPU per document inserted, us (every node)", &key("insert_cpu_us_per_doc", 1));
    row("... and with the merges it left, us", &key("insert_settled_cpu_us_per_doc", 1));
    row("index in memory, bytes/document (every node)", &key("memory_bytes_per_doc", 1));
    row(
        "document table in memory, bytes/document (every node)",
        &key("document_table_bytes_per_doc", 1),
    );
    row("disk, bytes/document (every node)", &key("disk_bytes_per_doc", 1));
    row("in memory per node, MB", &|s: &Value| {
        let per = s["per_node"].as_array().cloned().unwrap_or_default();
        let mb: Vec<String> = per
            .iter()
            .map(|n| num(&(n["memory_bytes"].as_f64().unwrap_or(0.0) / 1e6).into(), 1))
            .collect();
        mb.join(", ")
    });
    row("largest distance of a node from the mean, %", &|s: &Value| {
        num(&(s["imbalance"].as_f64().unwrap_or(0.0) * 100.0).into(), 1)
    });
    for (i, &rate) in args.rates.iter().enumerate() {
        for (what, kind) in [("Query", "query"), ("floor: gRPC Health", "grpc_health")] {
            row(&format!("{what} at {rate}/s, p50/p99/p999 us"), &|s: &Value| {
                let x = &s["unary"][i][kind];
                format!(
                    "{} / {} / {}",
                    num(&x["p50_us"], 0),
                    num(&x["p99_us"], 0),
                    num(&x["p999_us"], 0)
                )
            });
        }
    }
    row("QueryBatch, queries/s", &key("query_batch_qps", 0));
    row("server CPU per QueryBatch query, us (every node)", &key("query_batch_cpu_us", 2));
    row("queries/s per core (QueryBatch)", &|s: &Value| match s["query_batch_cpu_us"].as_f64() {
        Some(us) if us > 0.0 => format!("{:.0}", 1e6 / us),
        _ => "-".into(),
    });
    println!();
    println!(
        "| join | settled after, s | on the new node, MB | MB/s | Query at {}/s while settling, \
         p50/p99 us | hedged calls (answered first) | for {} s after, p50/p99 us | p99 during / \
         after | server cores busy, during / after / idle |",
        args.kill_rate,
        args.kill_seconds.max(2)
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for j in g["joins"].as_array().cloned().unwrap_or_default() {
        let q = |x: &Value| format!("{} / {}", num(&x["p50_us"], 0), num(&x["p99_us"], 0));
        println!(
            "| node {} ({} nodes) | {} | {} | {} | {} | {} ({}) | {} | {} | {} / {} / {} |",
            j["node"],
            j["nodes"],
            num(&j["rebalance_seconds"], 2),
            num(&(j["new_node_bytes"].as_f64().unwrap_or(0.0) / 1e6).into(), 1),
            num(&j["mb_per_second"], 1),
            q(&j["query_during"]),
            j["hedged_calls_during"],
            j["hedged_won_during"],
            q(&j["query_after"]),
            num(&j["p99_ratio"], 2),
            num(&j["server_cores_during"], 2),
            num(&j["server_cores_after"], 2),
            num(&j["server_cores_idle"], 2)
        );
    }
}
