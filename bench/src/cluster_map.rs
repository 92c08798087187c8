//! `neardup-bench cluster-map`: the cluster map's control plane on real processes on
//! loopback, for clusters of 3 and 5 nodes:
//!
//! - time to a new leader after `kill -9` of the leader (the killed node is restarted, and
//!   back in the cluster, before the next kill): from the kill to the first surviving node
//!   whose Status names another leader;
//! - time for a membership change to commit: an AddNode (then a RemoveNode) of a node that
//!   never starts, answered by the leader once committed and applied there;
//! - time until every node sees a map change: from the change's start until every node's
//!   Status shows its epoch, polled every `--poll-ms`.
//!
//! It starts `neardup serve` (the binary given with `--neardup`, by default `neardup` next to
//! this program) with `--bootstrap` and `--join`. Figures only: nothing is asserted.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use neardup_proto::admin::admin_client::AdminClient;
use neardup_proto::admin::{
    AddNodeRequest, RemoveNodeRequest, Role, StatusRequest, StatusResponse,
};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::free_port;

/// Options of `neardup-bench cluster-map`.
#[derive(clap::Args, Debug)]
pub struct ClusterMapArgs {
    /// Cluster sizes to measure (comma-separated, 1 to 5 voters each).
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    nodes: Vec<usize>,
    /// Leader kills per size.
    #[arg(long, default_value_t = 10)]
    kills: usize,
    /// Membership changes per size (each an AddNode then a RemoveNode: twice as many).
    #[arg(long, default_value_t = 10)]
    changes: usize,
    /// Raft tick of the nodes, ms (the service's default is 100).
    #[arg(long, default_value_t = 100)]
    tick_ms: u64,
    /// How often each node's Status is polled, ms.
    #[arg(long, default_value_t = 2)]
    poll_ms: u64,
    /// The `neardup` binary to start [default: `neardup` next to this program, else the one
    /// on PATH].
    #[arg(long, value_name = "FILE")]
    neardup: Option<PathBuf>,
}

impl ClusterMapArgs {
    fn neardup(&self) -> PathBuf {
        crate::service::neardup_binary(self.neardup.as_deref())
    }
}

/// One node process.
struct Proc {
    id: u64,
    public: String,
    internal: String,
    data: PathBuf,
    child: Option<Child>,
    admin: AdminClient<Channel>,
}

impl Proc {
    fn new(id: u64, base: &std::path::Path) -> Result<Proc, String> {
        let public = format!("127.0.0.1:{}", free_port()?);
        let internal = format!("127.0.0.1:{}", free_port()?);
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{internal}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10));
        let admin = AdminClient::new(endpoint.connect_lazy());
        let data = base.join(format!("node-{id}"));
        Ok(Proc { id, public, internal, data, child: None, admin })
    }

    fn start(&mut self, args: &ClusterMapArgs, extra: &[&str]) -> Result<(), String> {
        let exe = args.neardup();
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--data"]).arg(&self.data);
        cmd.args(["--listen", &self.public, "--metrics-listen", ""]);
        cmd.args(["--internal-listen", &self.internal, "--node-id", &self.id.to_string()]);
        cmd.args(["--set", &format!("cluster.tick_ms={}", args.tick_ms)]);
        cmd.args(extra);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        cmd.env("RUST_LOG", "warn");
        let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    async fn status(&self) -> Option<StatusResponse> {
        let mut a = self.admin.clone();
        a.status(StatusRequest {}).await.ok().map(|r| r.into_inner())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Polls `p` every `poll` until `ready` (up to `limit`).
async fn until(
    p: &Proc,
    poll: Duration,
    limit: Duration,
    what: &str,
    ready: impl Fn(&StatusResponse) -> bool,
) -> Result<StatusResponse, String> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = p.status().await
            && ready(&s)
        {
            return Ok(s);
        }
        if Instant::now() > end {
            return Err(format!("node {}: no {what} within {limit:?}", p.id));
        }
        tokio::time::sleep(poll).await;
    }
}

/// Median and max of seconds, as milliseconds.
fn summary(xs: &[f64]) -> (f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let median =
        if v.len() % 2 == 1 { v[v.len() / 2] } else { (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0 };
    (median * 1e3, v[v.len() - 1] * 1e3)
}

/// The leader's process index, as node 0 sees it... or any node that knows one.
async fn leader_of(procs: &[Proc], poll: Duration) -> Result<usize, String> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        for p in procs.iter().filter(|p| p.child.is_some()) {
            if let Some(s) = p.status().await
                && s.leader != 0
                && let Some(i) = procs.iter().position(|q| q.id == s.leader && q.child.is_some())
            {
                return Ok(i);
            }
        }
        if Instant::now() > end {
            return Err("no leader within 60 s".into());
        }
        tokio::time::sleep(poll).await;
    }
}

async fn measure(args: &ClusterMapArgs, n: usize, base: &std::path::Path) -> Result<Value, String> {
    let poll = Duration::from_millis(args.poll_ms);
    let limit = Duration::from_secs(60);
    let dir = base.join(format!("cluster-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut procs: Vec<Proc> =
        (1..=n as u64).map(|id| Proc::new(id, &dir)).collect::<Result<_, _>>()?;
    procs[0].start(args, &["--bootstrap"])?;
    until(&procs[0], poll, limit, "leader", |s| s.leader == 1).await?;
    let via = procs[0].internal.clone();
    for p in procs.iter_mut().skip(1) {
        p.start(args, &["--join", &via])?;
    }
    for p in &procs {
        until(p, poll, limit, "every node a voter", |s| {
            s.nodes.len() == n
                && s.leader != 0
                && s.nodes.iter().all(|x| x.role == Role::Voter as i32)
        })
        .await?;
    }
    // Membership changes: add then remove a node that never starts.
    let (mut commit, mut seen) = (Vec::new(), Vec::new());
    for j in 0..args.changes {
        for add in [true, false] {
            let li = leader_of(&procs, poll).await?;
            let fake = 1000 + j as u64;
            let mut a = procs[li].admin.clone();
            let t = Instant::now();
            let epoch = if add {
                let req = AddNodeRequest {
                    node_id: fake,
                    public_addr: "127.0.0.1:9".into(),
                    internal_addr: "127.0.0.1:9".into(),
                };
                a.add_node(req).await.map_err(|e| format!("AddNode: {e}"))?.into_inner().epoch
            } else {
                a.remove_node(RemoveNodeRequest { node_id: fake })
                    .await
                    .map_err(|e| format!("RemoveNode: {e}"))?
                    .into_inner()
                    .epoch
            };
            commit.push(t.elapsed().as_secs_f64());
            for p in &procs {
                until(p, poll, limit, "the new epoch", |s| s.epoch >= epoch).await?;
            }
            seen.push(t.elapsed().as_secs_f64());
        }
    }
    // Leader kills.
    let mut elections = Vec::new();
    // A kill needs a majority left: none below 3 nodes.
    let kills = if n >= 3 { args.kills } else { 0 };
    for _ in 0..kills {
        let li = leader_of(&procs, poll).await?;
        let old = procs[li].id;
        let t = Instant::now();
        procs[li].kill9();
        'wait: loop {
            for p in procs.iter().filter(|p| p.child.is_some()) {
                if let Some(s) = p.status().await
                    && s.leader != 0
                    && s.leader != old
                {
                    break 'wait;
                }
            }
            if t.elapsed() > limit {
                return Err("no new leader within 60 s of a kill".into());
            }
            tokio::time::sleep(poll).await;
        }
        elections.push(t.elapsed().as_secs_f64());
        // Back in the cluster before the next kill: the restarted node knows the leader
        // and has applied what the others have.
        procs[li].start(args, &[])?;
        let want =
            until(&procs[(li + 1) % n], poll, limit, "a leader", |s| s.leader != 0).await?.applied;
        until(&procs[li], poll, limit, "caught up", |s| s.leader != 0 && s.applied >= want).await?;
    }
    let (c_med, c_max) = summary(&commit);
    let (s_med, s_max) = summary(&seen);
    let (e_med, e_max) = summary(&elections);
    println!(
        "{n} nodes: new leader after kill -9 of the leader: median {e_med:.0} ms, max \
         {e_max:.0} ms ({} kills)",
        elections.len()
    );
    println!(
        "{n} nodes: membership change committed: median {c_med:.1} ms, max {c_max:.1} ms \
         ({} changes)",
        commit.len()
    );
    println!(
        "{n} nodes: map change seen by every node: median {s_med:.1} ms, max {s_max:.1} ms \
         (Status polled every {} ms)",
        args.poll_ms
    );
    Ok(json!({
        "nodes": n,
        "kills": elections.len(),
        "new_leader_ms": { "median": e_med, "max": e_max },
        "changes": commit.len(),
        "change_commit_ms": { "median": c_med, "max": c_max },
        "change_seen_by_all_ms": { "median": s_med, "max": s_max },
        "poll_ms": args.poll_ms,
    }))
}

async fn run(args: ClusterMapArgs) -> Result<(), String> {
    let base = std::env::temp_dir().join(format!("neardup-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    println!(
        "cluster-map: real `neardup serve` processes on loopback, Raft tick {} ms (election \
         after 10 to 20 ticks), {} kills and {} changes per size",
        args.tick_ms,
        args.kills,
        args.changes * 2
    );
    let mut sizes = Vec::new();
    let mut result = Ok(());
    for &n in &args.nodes {
        match measure(&args, n, &base).await {
            Ok(v) => sizes.push(v),
            Err(e) => {
                result = Err(format!("{n} nodes: {e}"));
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
    result?;
    println!("{}", json!({ "cluster_map": sizes, "tick_ms": args.tick_ms }));
    Ok(())
}

/// Runs `neardup-bench cluster-map` on a tokio runtime of its own.
pub fn main(args: ClusterMapArgs) -> Result<(), String> {
    if args.nodes.iter().any(|&n| n == 0 || n > 5) {
        return Err("--nodes: each size must be 1 to 5".into());
    }
    crate::service::on_own_runtime(run(args))
}
