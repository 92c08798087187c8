//! Cluster nodes as real processes, and network namespaces to partition them.
//!
//! - [`Member`]: one `neardup serve` in cluster mode, with its data directory, public and
//!   internal addresses; started, killed (`kill -9`), stopped and restarted by the test.
//! - [`Netns`]: network namespaces the test creates (one per node, plus one holding a
//!   bridge), joined by veth pairs; a node is cut off by setting its bridge port down. The
//!   namespaces are removed when the guard drops, also when the test fails.
//!
//! Status is read over the admin API ([`Member::status`]) when the test can reach the node
//! (loopback), or with `neardup cluster status` run inside the node's namespace
//! ([`Member::status_cli`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use neardup_proto::admin::admin_client::AdminClient;
use neardup_proto::admin::{AddNodeRequest, ChangeResponse, StatusRequest, StatusResponse};
use serde_json::Value;

use crate::{binary, free_port};

/// Test-speed Raft timing: a 20 ms tick, elections after 10 ticks without a heartbeat.
pub const FAST_RAFT: [&str; 2] = ["--set", "cluster.tick_ms=20"];

/// One cluster node process.
pub struct Member {
    /// Its id.
    pub id: u64,
    /// Public address, HOST:PORT.
    pub public: String,
    /// Internal address (Raft, admin), HOST:PORT.
    pub internal: String,
    /// Its data directory.
    pub data: PathBuf,
    /// The namespace it runs in, if any.
    pub netns: Option<String>,
    /// Arguments every start of it takes (after the addresses, before a start's own).
    pub args: Vec<String>,
    logs: PathBuf,
    /// Its current log file (stderr).
    pub log: PathBuf,
    child: Option<Child>,
    lives: u32,
}

impl Member {
    /// A member on 127.0.0.1 with free ports and its data under `dir` (not started).
    pub fn on_loopback(id: u64, dir: &Path) -> Member {
        let public = format!("127.0.0.1:{}", free_port());
        let internal = format!("127.0.0.1:{}", free_port());
        Member::new(id, dir, public, internal, None)
    }

    /// A member with given addresses, run inside `netns` when given (not started).
    pub fn new(
        id: u64,
        dir: &Path,
        public: String,
        internal: String,
        netns: Option<String>,
    ) -> Member {
        let data = dir.join(format!("node-{id}"));
        let log = dir.join(format!("node-{id}-0.log"));
        Member {
            id,
            public,
            internal,
            data,
            netns,
            args: Vec::new(),
            logs: dir.to_path_buf(),
            log,
            child: None,
            lives: 0,
        }
    }

    /// A command running `neardup` (inside the namespace, if any).
    fn command(&self) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(binary());
                c
            }
            None => Command::new(binary()),
        }
    }

    /// Starts `neardup serve` with its addresses, data and id, and `extra` arguments
    /// (`--bootstrap`, `--join ADDR`, or nothing on a restart).
    pub fn start(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "node {} is already running", self.id);
        self.lives += 1;
        self.log = self.logs.join(format!("node-{}-{}.log", self.id, self.lives));
        let mut cmd = self.command();
        cmd.args(["serve", "--data", self.data.to_str().expect("a UTF-8 path")])
            .args(["--listen", &self.public, "--metrics-listen", ""])
            .args(["--internal-listen", &self.internal])
            .args(["--node-id", &self.id.to_string()])
            .args(FAST_RAFT)
            .args(&self.args)
            .args(extra);
        if self.netns.is_some() {
            // Namespace addresses are beyond loopback: these tests are about partitions and
            // node loss, so their nodes take plaintext explicitly (TLS is tested in tls.rs).
            cmd.arg("--insecure");
        }
        self.child = Some(crate::spawn_server(&mut cmd, &self.log));
    }

    /// Starts the member for the first time, as [`start`](Self::start), and waits (up to
    /// 20 s) until both its listeners accept connections. On loopback, a port another
    /// process took between [`free_port`]'s check and the node's bind is chosen again (up to
    /// 5 times): the node exits saying the address is in use, and starts on new ports.
    pub async fn start_first(&mut self, extra: &[&str]) {
        for _ in 0..5 {
            self.start(extra);
            if self.netns.is_some() {
                return;
            }
            let limit = Instant::now() + Duration::from_secs(20);
            while self.running() && Instant::now() < limit {
                let up = |a: &str| std::net::TcpStream::connect(a).is_ok();
                if up(&self.public) && up(&self.internal) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if self.running() || !self.log_text().contains("in use") {
                // Listening late, or failed for another reason: the caller's wait says so.
                return;
            }
            self.wait_exit();
            eprintln!("node {}: a port was taken before it bound; new ports", self.id);
            self.public = format!("127.0.0.1:{}", free_port());
            self.internal = format!("127.0.0.1:{}", free_port());
        }
    }

    /// Whether the process runs (it has not exited).
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Waits (up to two minutes) for the process to exit by itself; its success.
    pub fn wait_exit(&mut self) -> bool {
        let limit = Instant::now() + Duration::from_secs(120);
        while self.running() {
            assert!(Instant::now() < limit, "node {} still runs:\n{}", self.id, self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = self.child.take().and_then(|mut c| c.wait().ok());
        status.is_some_and(|s| s.success())
    }

    /// The current log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9` (no chance to persist anything more).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child, by its pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the process hangs, its connections open and nothing answered, until
    /// [`resume`](Self::resume) (a `kill -9` ends it too).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT: a paused process goes on.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        let c = self.child.as_ref().unwrap_or_else(|| panic!("node {} is not running", self.id));
        // SAFETY: kill(2) on our own child, by its pid.
        let r = unsafe { libc::kill(c.id() as i32, sig) };
        assert_eq!(r, 0, "signal {sig} to node {}", self.id);
    }

    /// SIGTERM, then waits for the exit, which must be a success.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child, by its pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let status = c.wait().unwrap();
            assert!(
                status.success(),
                "node {} after SIGTERM: {status}\n{}",
                self.id,
                self.log_text()
            );
        }
    }

    /// Health of the public listener ("" service), or None when unreachable (loopback only).
    pub async fn public_health(&self) -> Option<i32> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_client::HealthClient;
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.public)).ok()?;
        let channel = endpoint.connect().await.ok()?;
        let r = HealthClient::new(channel)
            .check(HealthCheckRequest { service: String::new() })
            .await
            .ok()?;
        Some(r.get_ref().status)
    }

    /// The admin API's answer to Status (loopback members only).
    pub async fn status(&self) -> Result<StatusResponse, tonic::Status> {
        Ok(admin(&self.internal).await?.status(StatusRequest {}).await?.into_inner())
    }

    /// `neardup cluster status` run beside the node (in its namespace), as JSON.
    pub fn status_cli(&self) -> Result<Value, String> {
        self.cli(&["cluster", "status", "--addr", &self.internal, "--timeout-ms", "2000"])
    }

    /// A `neardup` client command run beside the node; its stdout as JSON, or its stderr.
    pub fn cli(&self, args: &[&str]) -> Result<Value, String> {
        let out = self
            .command()
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run the neardup binary");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("not JSON ({e}): {out:?}"))
    }

    /// Waits (up to two minutes, a safety net, not an assertion) until `ready` holds for this
    /// node's status (read over loopback); panics with the log if the process exits.
    pub async fn wait_status(
        &mut self,
        what: &str,
        ready: impl Fn(&StatusResponse) -> bool,
    ) -> StatusResponse {
        let limit = Instant::now() + Duration::from_secs(120);
        loop {
            if self.child.is_some() && !self.running() {
                panic!("node {} exited while waiting for {what}:\n{}", self.id, self.log_text());
            }
            if let Ok(s) = self.status().await
                && ready(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < limit,
                "node {}: no {what} in time; last status {:?}\n{}",
                self.id,
                self.status().await,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// An admin client of the node at `internal` (HOST:PORT).
pub async fn admin(
    internal: &str,
) -> Result<AdminClient<tonic::transport::Channel>, tonic::Status> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{internal}"))
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10));
    let channel =
        endpoint.connect().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(AdminClient::new(channel))
}

/// AddNode sent to the member at `via`.
pub async fn add_node(via: &str, m: &Member) -> Result<ChangeResponse, tonic::Status> {
    let req = AddNodeRequest {
        node_id: m.id,
        public_addr: m.public.clone(),
        internal_addr: m.internal.clone(),
    };
    Ok(admin(via).await?.add_node(req).await?.into_inner())
}

/// The ids of the nodes in a status's map.
pub fn node_ids(s: &StatusResponse) -> BTreeSet<u64> {
    s.nodes.iter().map(|n| n.id).collect()
}

/// Checks that a status answer is well-formed: its leader (when known) is a node of its map,
/// node ids are unique and not 0, the epoch is at least 1, the applied index does not
/// exceed the committed one, every tablet names nodes of the map and a non-empty range.
pub fn check_well_formed(s: &StatusResponse) -> Result<(), String> {
    let ids = node_ids(s);
    if ids.len() != s.nodes.len() || ids.contains(&0) {
        return Err(format!("node ids not unique or 0: {:?}", s.nodes));
    }
    if s.leader != 0 && !ids.contains(&s.leader) {
        return Err(format!("leader {} is not in the map {ids:?}", s.leader));
    }
    if s.applied > s.committed {
        return Err(format!("applied {} > committed {}", s.applied, s.committed));
    }
    for t in &s.tablets {
        if t.start > t.end || t.nodes.iter().any(|n| !ids.contains(n)) {
            return Err(format!("bad tablet {t:?} with nodes {ids:?}"));
        }
    }
    Ok(())
}

static NETNS_SEQ: AtomicU32 = AtomicU32::new(0);

/// Network namespaces of a test: one per node and one holding a bridge, joined by veth
/// pairs, on 10.201.0.0/24 (node i at 10.201.0.(11+i)). Only the test's own namespaces
/// carry traffic. Removed on drop: create it before the [`Member`]s that run inside, so that
/// they are killed (dropped) first.
pub struct Netns {
    /// The namespace holding the bridge.
    pub bridge: String,
    /// The nodes' namespaces.
    pub nodes: Vec<String>,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Netns {
    /// Creates the namespaces of `n` nodes, or says why it cannot (no `ip`, no permission);
    /// whatever was created is removed on failure.
    pub fn create(n: usize) -> Result<Netns, String> {
        let prefix = format!(
            "neardup-t{}-{}",
            std::process::id(),
            NETNS_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut ns =
            Netns { bridge: format!("{prefix}-br"), nodes: Vec::new(), created: Vec::new() };
        ip(&["netns", "add", &ns.bridge])?;
        ns.created.push(ns.bridge.clone());
        let br = ns.bridge.clone();
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let name = format!("{prefix}-n{i}");
            ip(&["netns", "add", &name])?;
            ns.created.push(name.clone());
            let port = format!("v{i}");
            ip(&[
                "link", "add", &port, "netns", &br, "type", "veth", "peer", "name", "eth0",
                "netns", &name,
            ])?;
            ip(&["-n", &br, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &br, "link", "set", &port, "up"])?;
            let addr = format!("{}/24", Netns::addr(i));
            ip(&["-n", &name, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            ns.nodes.push(name);
        }
        Ok(ns)
    }

    /// As [`create`](Self::create), and the test's own namespace reaches each node
    /// directly (a veth pair of its own per node, 10.202.i.1 here and 10.202.i.2 there, and a
    /// route to the node's address through it), so clients of the test still reach a node
    /// that [`cut`](Self::cut) cut off from the others.
    pub fn create_with_clients(n: usize) -> Result<Netns, String> {
        let ns = Netns::create(n)?;
        let tag = format!("nd{}", std::process::id() % 100_000);
        for (i, name) in ns.nodes.iter().enumerate() {
            // The host end lives in the test's namespace; it goes with the node's namespace.
            let host_end = format!("{tag}c{i}");
            ip(&["link", "add", &host_end, "type", "veth", "peer", "name", "c0", "netns", name])?;
            ip(&["addr", "add", &format!("10.202.{i}.1/30"), "dev", &host_end])?;
            ip(&["link", "set", &host_end, "up"])?;
            ip(&["-n", name, "addr", "add", &format!("10.202.{i}.2/30"), "dev", "c0"])?;
            ip(&["-n", name, "link", "set", "c0", "up"])?;
            let node = format!("{}/32", Netns::addr(i));
            ip(&["route", "add", &node, "via", &format!("10.202.{i}.2")])?;
        }
        Ok(ns)
    }

    /// The address of node `i`.
    pub fn addr(i: usize) -> String {
        format!("10.201.0.{}", 11 + i)
    }

    /// One member per namespace, node ids from 1, data under `dir`, listening on the
    /// namespace's address (public port 7000, internal 7001); not started.
    pub fn members(&self, dir: &Path) -> Vec<Member> {
        (0..self.nodes.len())
            .map(|i| {
                let host = Netns::addr(i);
                Member::new(
                    i as u64 + 1,
                    dir,
                    format!("{host}:7000"),
                    format!("{host}:7001"),
                    Some(self.nodes[i].clone()),
                )
            })
            .collect()
    }

    /// Cuts node `i` off from every other (its bridge port down).
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.bridge, "link", "set", &format!("v{i}"), "down"])
    }

    /// Joins node `i` again.
    pub fn heal(&self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.bridge, "link", "set", &format!("v{i}"), "up"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for name in self.created.iter().rev() {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("could not remove network namespace {name}: {e}");
            }
        }
    }
}
