//! # neardup-tests
//!
//! Integration tests that run neardup as real processes on loopback: start a server with a
//! data directory, talk to it over gRPC, kill it (`SIGTERM` or `kill -9`), start it again.
//! The harness here starts and stops processes and waits for health; the tests are in
//! `tests/`. No test asserts on time. [`cluster`] starts cluster nodes and the network
//! namespaces that partition them.
#![deny(missing_docs)]

pub mod checker;
pub mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The `neardup` binary under test (set by cargo for this package's tests, or given).
pub fn binary() -> PathBuf {
    built("NEARDUP_TEST_BINARY", option_env!("CARGO_BIN_EXE_neardup-node"), "neardup-node")
}

/// The `neardup-bench` measurement program under test (set by cargo for this package's
/// tests, or given).
pub fn bench_binary() -> PathBuf {
    built(
        "NEARDUP_TEST_BENCH_BINARY",
        option_env!("CARGO_BIN_EXE_neardup-bench-node"),
        "neardup-bench-node",
    )
}

/// A binary of this package: the path in `$var` if set, else where cargo says it built it,
/// else next to the running test's deps folder.
fn built(var: &str, cargo_says: Option<&str>, name: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| cargo_says.map(PathBuf::from))
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the test's path");
            exe.parent().and_then(Path::parent).expect("target dir").join(name)
        })
}

/// A free port on 127.0.0.1 for a server a test starts: [`neardup_bench::free_port`].
pub fn free_port() -> u16 {
    neardup_bench::free_port().expect("a free port")
}

/// Starts a server process with its stderr (at `RUST_LOG=info`) in `log`, no stdin or stdout.
pub fn spawn_server(cmd: &mut Command, log: &Path) -> std::process::Child {
    let stderr = std::fs::File::create(log).unwrap();
    cmd.env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the neardup binary")
}

/// A neardup process.
pub struct Node {
    child: Option<Child>,
    /// `127.0.0.1:port` it listens on.
    pub addr: String,
    /// Its log (stderr), for assertions and failure reports.
    pub log: PathBuf,
}

impl Node {
    /// Starts `neardup ARGS... --listen 127.0.0.1:PORT --metrics-listen ""` with its stderr
    /// in `log_dir`.
    pub fn start(args: &[&str], log_dir: &Path) -> Node {
        let port = free_port();
        Node::start_on(args, port, log_dir)
    }

    /// As [`start`](Self::start), on a given port.
    pub fn start_on(args: &[&str], port: u16, log_dir: &Path) -> Node {
        let addr = format!("127.0.0.1:{port}");
        let log = log_dir.join(format!("node-{port}-{}.log", Instant::now().elapsed().as_nanos()));
        let mut cmd = Command::new(binary());
        cmd.args(args).args(["--listen", &addr, "--metrics-listen", ""]);
        let child = spawn_server(&mut cmd, &log);
        Node { child: Some(child), addr, log }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Health of `service` ("" for the whole server), or None when unreachable.
    pub async fn health(&self, service: &str) -> Option<ServingStatus> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).ok()?;
        let channel = endpoint.connect().await.ok()?;
        let r = HealthClient::new(channel)
            .check(HealthCheckRequest { service: service.into() })
            .await
            .ok()?;
        ServingStatus::try_from(r.get_ref().status).ok()
    }

    /// Waits (up to two minutes, a safety net, not an assertion) for health `want`.
    pub async fn wait_health(&mut self, want: ServingStatus) {
        let limit = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the server exited ({status}):\n{}", self.log_text());
            }
            if self.health("").await == Some(want) {
                return;
            }
            assert!(Instant::now() < limit, "no {want:?} in time:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until SERVING.
    pub async fn serving(&mut self) {
        self.wait_health(ServingStatus::Serving).await
    }

    /// `neardup serve` with its data in `dir/data` (and `extra` arguments), once SERVING.
    pub async fn serve_in(dir: &Path, extra: &[&str]) -> Node {
        let data = dir.join("data");
        let mut args = vec!["serve", "--data", data.to_str().expect("a UTF-8 path")];
        args.extend_from_slice(extra);
        let mut node = Node::start(&args, dir);
        node.serving().await;
        node
    }

    /// A client with a few retries.
    pub async fn client(&self) -> Client {
        let options = ClientOptions { timeout: Duration::from_secs(60), ..Default::default() };
        Client::connect_with(&self.addr, options).await.unwrap()
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// `kill -9`: no chance to flush anything.
    pub fn kill9(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        self.child.take().unwrap().wait().unwrap();
    }

    /// SIGTERM, then waits for the exit; its status must be success.
    pub fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let status = self.child.take().unwrap().wait().unwrap();
        assert!(status.success(), "exit after SIGTERM: {status}\n{}", self.log_text());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the binary to completion (for commands that fail at start, or client commands).
pub fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run the neardup binary")
}

/// `neardup cert ARGS...`, which must succeed.
pub fn cert(args: &[&str]) {
    let out = run(&[&["cert"][..], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Whether a test may go on without something it needs that this machine lacks (a Python
/// package, a data set): prints `SKIPPED: what` and returns false, so the test returns early.
/// With `NEARDUP_TESTS_STRICT` set (`.ci/run` sets it) nothing is skipped: it panics instead.
pub fn skip_without(what: &str) -> bool {
    let strict = std::env::var_os("NEARDUP_TESTS_STRICT").is_some_and(|v| !v.is_empty());
    assert!(!strict, "{what} (NEARDUP_TESTS_STRICT is set, so nothing is skipped)");
    eprintln!("SKIPPED: {what}");
    false
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// `program ARGS...` (`program` may be several words: `docker compose`) with `env` added:
/// its stdout, trimmed, or the command and what it printed when it fails.
pub fn command_output(
    program: &[&str],
    args: &[&str],
    env: &[(String, String)],
) -> Result<String, String> {
    let out = Command::new(program[0])
        .args(&program[1..])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| format!("{program:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program:?} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `docker ARGS...`: its stdout, or why it failed.
pub fn docker(args: &[&str]) -> Result<String, String> {
    command_output(&["docker"], args, &[])
}

/// Whether a Docker Engine answers here.
pub fn docker_running() -> bool {
    docker(&["info", "--format", "{{.ServerVersion}}"]).is_ok()
}

/// Builds an image with `deploy/docker/SCRIPT`, tagged `tag` (the node image from the binary
/// under test): what the script printed, `{"image": TAG, "bytes": SIZE}`.
pub fn build_image(script: &str, tag: &str) -> serde_json::Value {
    let out = Command::new(repo_root().join("deploy/docker").join(script))
        .arg(tag)
        .env("NEARDUP_BINARY", binary())
        .output()
        .expect("run the image script");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

/// The ids of the acknowledged documents (`acked`: id to fingerprint) within `k` of `fp`,
/// by brute force, in order.
pub fn brute_ids(acked: &std::collections::BTreeMap<String, u64>, fp: u64, k: u32) -> Vec<String> {
    acked.iter().filter(|&(_, &f)| (f ^ fp).count_ones() <= k).map(|(id, _)| id.clone()).collect()
}

/// The ids a query of `fp` within `k` answers through `c` (limit 1000), in order; panics on
/// an error.
pub async fn query_ids(c: &Client, fp: u64, k: u32) -> Vec<String> {
    let mut ids: Vec<String> =
        c.query(fp, Some(k), 1000).await.unwrap().matches.into_iter().map(|m| m.id).collect();
    ids.sort();
    ids
}

/// One HTTP/1.0 GET of `path` at `addr` (HOST:PORT), with an `Authorization` header when
/// given: the whole response (status line, headers, body).
pub fn http_get(addr: &str, path: &str, authorization: Option<&str>) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).map_err(|e| format!("{addr}: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| format!("{addr}: {e}"))?;
    Ok(text)
}

/// The body of an HTTP response [`http_get`] read.
pub fn http_body(response: &str) -> &str {
    response.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// Whether `python3` can import grpcio and grpcio-tools.
pub fn has_python_grpc() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `neardup-bench` to completion.
pub fn run_bench(args: &[&str]) -> Output {
    Command::new(bench_binary())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run the neardup-bench binary")
}
