//! The open-loop load generator of `neardup-bench service`, and the machine's own floor.
//!
//! Request `i` of a slice is due at `start + i / rate`; its latency counts from that moment,
//! so a stall delays every request behind it and shows in the percentiles (no coordinated
//! omission).
//!
//! The generator is lean so that it takes as little as it can of the two cores it shares
//! with the server: one thread runs a single-threaded runtime that owns the connections and
//! the response handling, calls through [`crate::h2call`] (HTTP/2 without a gRPC stack: a
//! request leaves in one write, an answer is checked by its status), and paces the requests
//! with a `timerfd` (tokio's timer ticks in whole milliseconds, which would bunch the
//! requests and add its lag to every latency).
//!
//! Next to the Query calls it measures, in interleaved one-second slices so that both see the
//! same moments of a shared machine:
//! - a gRPC Health check on the same connection: the cost of the gRPC stack with no index
//!   work;
//! - a 16-byte TCP echo over loopback to a plain thread: what the machine itself gives, the
//!   floor under any server.
//!
//! For each kind it also counts CPU time over that kind's slices: the server process's (when
//! its pid is given; for the echo, the echo thread's: what the plainest server, a blocking
//! read and write, spends per call on this machine) and the generator's own thread's, each
//! divided by the calls answered, so that the cost of a request is told apart from the
//! machine's load and from the generator's own share.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use neardup_proto::v1::{
    CheckAndInsertRequest, Document, QueryRequest, QueryTarget, document, query_target,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;

use crate::cpu::{CpuMeter, thread_cpu_seconds};
use crate::h2call::{UnaryConn, frame};
use crate::latency::Latencies;

/// The deadline every call carries (`grpc-timeout`), and how long the generator waits for
/// an answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What one slice of load sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Unary Query by fingerprint (queries reused round-robin).
    Query,
    /// Verified CheckAndInsert: a new document with a query's fingerprint and a sketch
    /// ([`synthetic_sketch`]), the server's verification defaults.
    Admit,
    /// CheckAndInsert as before sketches: a new document by fingerprint alone, verification
    /// off (the same durable write, without the sketch and its reads).
    AdmitPlain,
    /// grpc.health.v1 Check on the same connection.
    Health,
    /// 16 bytes to a loopback echo thread and back.
    Echo,
}

impl Kind {
    /// The key of this kind in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Query => "query",
            Kind::Admit => "check_and_insert_verified",
            Kind::AdmitPlain => "check_and_insert_plain",
            Kind::Health => "grpc_health",
            Kind::Echo => "tcp_echo",
        }
    }
}

/// One load run: `kinds` in turn, one-second slices, `seconds` slices of each, at `rate`.
#[derive(Debug, Clone)]
pub struct Load {
    /// The server's gRPC address (host:port).
    pub addr: String,
    /// Fingerprints to query.
    pub queries: Arc<Vec<u64>>,
    /// Hamming distance of the queries.
    pub k: u32,
    /// Offered requests per second.
    pub rate: u64,
    /// Slices of one second per kind.
    pub seconds: u64,
    /// The kinds, interleaved.
    pub kinds: Vec<Kind>,
    /// The server's process id, to count its CPU time per call (`None`: not counted).
    pub server_pid: Option<u32>,
    /// Ends the run after the slice during which this turns true (`None`: all `seconds`).
    pub until: Option<Arc<AtomicBool>>,
}

/// Latencies and errors of one kind.
#[derive(Debug, Default)]
struct Tally {
    latencies: Latencies,
    errors: u64,
    busy: Duration,
    /// The server's CPU over this kind's slices.
    server_cpu: CpuMeter,
    /// The generator thread's CPU over this kind's slices, in seconds.
    generator_cpu: f64,
}

impl Load {
    /// Runs the load on a thread of its own; one JSON object per kind, keyed by
    /// [`Kind::name`].
    pub fn run(self) -> Result<serde_json::Map<String, Value>, String> {
        std::thread::Builder::new()
            .name("neardup-load".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the load generator's runtime: {e}"))?;
                rt.block_on(self.drive())
            })
            .map_err(|e| format!("cannot start the load generator: {e}"))?
            .join()
            .map_err(|_| "the load generator panicked".to_string())?
    }

    /// [`run`](Self::run), awaited from an async context without blocking its worker.
    pub async fn measure(self) -> Result<serde_json::Map<String, Value>, String> {
        tokio::task::spawn_blocking(move || self.run()).await.map_err(|e| e.to_string())?
    }

    async fn drive(self) -> Result<serde_json::Map<String, Value>, String> {
        let rpc = if self.kinds.iter().any(|k| *k != Kind::Echo) {
            Some(UnaryConn::connect(&self.addr, CALL_TIMEOUT).await?)
        } else {
            None
        };
        let mut echo =
            if self.kinds.contains(&Kind::Echo) { Some(Echo::start().await?) } else { None };
        let timer = Timer::new().map_err(|e| format!("cannot create a timer: {e}"))?;
        let mut tallies: Vec<Tally> = self
            .kinds
            .iter()
            .map(|kind| Tally {
                server_cpu: match kind {
                    Kind::Echo => CpuMeter::of_thread(echo.as_ref().and_then(|e| e.tid)),
                    _ => CpuMeter::of(self.server_pid),
                },
                ..Tally::default()
            })
            .collect();
        // Unmeasured first: a fifth of a second of each kind that only reads, from the middle
        // of the queries. The first calls of a generator pay for what is set up on first use
        // (docs/service.md, "How latency is measured"); a phase measures the rate's steady
        // state. Kinds that write are not warmed: their calls would change what the measured
        // ones find.
        if let Some(rpc) = rpc.as_ref() {
            let (first, warm) = (self.queries.len() / 2, (self.rate / 5).max(1));
            for kind in self.kinds.iter().filter(|k| matches!(k, Kind::Query | Kind::Health)) {
                self.rpc_slice(*kind, &timer, rpc, first, warm, &mut Tally::default()).await?;
            }
        }
        let mut sent = 0usize;
        for _ in 0..self.seconds {
            if self.until.as_ref().is_some_and(|u| u.load(Ordering::Relaxed)) {
                break;
            }
            for (kind, tally) in self.kinds.iter().zip(tallies.iter_mut()) {
                let t = Instant::now();
                let cpu = thread_cpu_seconds();
                tally.server_cpu.start();
                match kind {
                    Kind::Query | Kind::Admit | Kind::AdmitPlain | Kind::Health => {
                        let rpc = rpc.as_ref().expect("connected when asked for");
                        self.rpc_slice(*kind, &timer, rpc, sent, self.rate, tally).await?
                    }
                    Kind::Echo => {
                        let echo = echo.as_mut().expect("started when asked for");
                        echo.slice(&timer, self.rate, tally).await?
                    }
                }
                tally.server_cpu.stop();
                tally.generator_cpu += match (cpu, thread_cpu_seconds()) {
                    (Some(a), Some(b)) => b - a,
                    _ => 0.0,
                };
                tally.busy += t.elapsed();
            }
            sent += self.rate as usize;
        }
        let mut out = serde_json::Map::new();
        for (kind, tally) in self.kinds.iter().zip(tallies) {
            let lat = &tally.latencies;
            out.insert(
                kind.name().into(),
                json!({
                    "offered_qps": self.rate,
                    "sent": lat.len(),
                    "achieved_qps": lat.len() as f64 / tally.busy.as_secs_f64().max(1e-9),
                    "errors": tally.errors,
                    "p50_us": lat.percentile_us(0.50),
                    "p99_us": lat.percentile_us(0.99),
                    "p999_us": lat.percentile_us(0.999),
                    "max_us": lat.max_us(),
                    "server_cpu_us_per_call": tally.server_cpu.us_per(lat.len()),
                    "generator_cpu_us_per_call":
                        tally.generator_cpu * 1e6 / lat.len().max(1) as f64,
                }),
            );
        }
        Ok(out)
    }

    /// The first `calls` of one second of unary calls at the load's rate (all of them: the
    /// whole second); returns once every answer is in.
    async fn rpc_slice(
        &self,
        kind: Kind,
        timer: &Timer,
        rpc: &UnaryConn,
        first: usize,
        calls: u64,
        tally: &mut Tally,
    ) -> Result<(), String> {
        let uri = rpc.uri(match kind {
            Kind::Query => "/neardup.v1.Neardup/Query",
            Kind::Admit | Kind::AdmitPlain => "/neardup.v1.Neardup/CheckAndInsert",
            Kind::Health | Kind::Echo => "/grpc.health.v1.Health/Check",
        })?;
        let health = frame(&HealthCheckRequest { service: String::new() });
        let mut out = Vec::with_capacity(calls as usize);
        for (i, due) in schedule(self.rate).take(calls as usize).enumerate() {
            timer.sleep_until(due).await.map_err(|e| format!("timer: {e}"))?;
            let body = match kind {
                Kind::Query => {
                    let q = self.queries[(first + i) % self.queries.len()];
                    frame(&QueryRequest {
                        target: Some(QueryTarget {
                            target: Some(query_target::Target::Fingerprint(q)),
                            sketch: Vec::new(),
                        }),
                        k: Some(self.k),
                        limit: 100,
                        ..Default::default()
                    })
                }
                Kind::Admit | Kind::AdmitPlain => {
                    let n = first + i;
                    let q = self.queries[n % self.queries.len()];
                    let plain = kind == Kind::AdmitPlain;
                    frame(&CheckAndInsertRequest {
                        document: Some(Document {
                            id: format!("https://bench.example/{}/{n}", kind.name()),
                            content: Some(document::Content::Fingerprint(q)),
                            timestamp_ms: n as i64,
                            sketch: if plain { Vec::new() } else { synthetic_sketch(q) },
                        }),
                        k: Some(self.k),
                        limit: 100,
                        verify_jaccard: plain.then_some(0.0),
                        ..Default::default()
                    })
                }
                Kind::Health | Kind::Echo => health.clone(),
            };
            let call = rpc.call(&uri, body, CALL_TIMEOUT).await;
            out.push(tokio::spawn(async move {
                let ok = call.await;
                (ok, due.elapsed().as_nanos() as u64)
            }));
        }
        for call in out {
            let (ok, ns) = call.await.map_err(|e| e.to_string())?;
            tally.errors += u64::from(!ok);
            tally.latencies.record(ns);
        }
        Ok(())
    }
}

/// A valid sketch encoding (version 1, 64 payload bytes) whose bits come from `seed`: the
/// benchmark has fingerprints, not texts, and verification costs the same whatever the bits.
pub fn synthetic_sketch(seed: u64) -> Vec<u8> {
    let mut r = neardup_core::util::SplitMix64::new(seed);
    let mut out = vec![neardup_core::sketch::SKETCH_VERSION, 64];
    for _ in 0..8 {
        out.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    out
}

/// A loopback TCP echo: a plain thread answers, the generator writes and reads.
struct Echo {
    write: tokio::net::tcp::OwnedWriteHalf,
    read: tokio::net::tcp::OwnedReadHalf,
    origin: Instant,
    /// The echo thread's id, to count its CPU time (`None`: not on Linux).
    tid: Option<i32>,
}

impl Echo {
    /// Starts the echo thread and connects to it.
    async fn start() -> Result<Echo, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("echo: {e}"))?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| format!("echo: {e}"))?;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("neardup-echo".into())
            .spawn(move || {
                let _ = tid_tx.send(crate::cpu::thread_id());
                let Ok((mut s, _)) = listener.accept() else { return };
                let _ = s.set_nodelay(true);
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("echo: {e}"))?;
        let stream =
            tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("echo: {e}"))?;
        stream.set_nodelay(true).map_err(|e| format!("echo: {e}"))?;
        let (read, write) = stream.into_split();
        let tid = tid_rx.recv().map_err(|_| "echo: the thread ended".to_string())?;
        Ok(Echo { write, read, origin: Instant::now(), tid })
    }

    /// One second of echoes: each message carries its due time; the reader times it.
    async fn slice(&mut self, timer: &Timer, rate: u64, tally: &mut Tally) -> Result<(), String> {
        let n = rate as usize;
        let Echo { write, read, origin, .. } = self;
        let origin = *origin;
        let reader = async {
            let mut got = Vec::with_capacity(n);
            let mut msg = [0u8; 16];
            for _ in 0..n {
                read.read_exact(&mut msg).await.map_err(|e| format!("echo: {e}"))?;
                let due = u64::from_le_bytes(msg[..8].try_into().expect("8 bytes"));
                got.push((origin.elapsed().as_nanos() as u64).saturating_sub(due));
            }
            Ok::<_, String>(got)
        };
        let writer = async {
            for due in schedule(rate) {
                timer.sleep_until(due).await.map_err(|e| format!("timer: {e}"))?;
                let mut msg = [0u8; 16];
                msg[..8].copy_from_slice(&((due - origin).as_nanos() as u64).to_le_bytes());
                write.write_all(&msg).await.map_err(|e| format!("echo: {e}"))?;
            }
            Ok::<_, String>(())
        };
        let (got, wrote) = tokio::join!(reader, writer);
        wrote?;
        for ns in got? {
            tally.latencies.record(ns);
        }
        Ok(())
    }
}

/// The due times of one second of requests at `rate`, starting in 2 ms.
fn schedule(rate: u64) -> impl Iterator<Item = Instant> {
    let start = Instant::now() + Duration::from_millis(2);
    (0..rate).map(move |i| start + Duration::from_nanos(i * 1_000_000_000 / rate))
}

/// A sleep with microsecond precision on the runtime's own event loop (a `timerfd`).
struct Timer {
    #[cfg(target_os = "linux")]
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl Timer {
    #[cfg(target_os = "linux")]
    fn new() -> std::io::Result<Timer> {
        use std::os::fd::FromRawFd;
        // SAFETY: timerfd_create returns a new descriptor we own, or -1.
        let raw = unsafe {
            libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid descriptor owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: the OwnedFd keeps the descriptor open, and names the same one, for as long
        // as the AsyncFd that owns it lives.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        Ok(Timer { fd: fd.map_err(|e| e.into_parts().1)? })
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> std::io::Result<Timer> {
        Ok(Timer {})
    }

    /// Returns at `due` (at once if it has passed).
    #[cfg(target_os = "linux")]
    async fn sleep_until(&self, due: Instant) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let Some(wait) = due.checked_duration_since(Instant::now()).filter(|w| !w.is_zero()) else {
            return Ok(());
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            },
        };
        let fd = self.fd.get_ref().as_raw_fd();
        // SAFETY: a valid timerfd and a fully initialised itimerspec.
        if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let mut guard = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let r = unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), 8) };
            if r == 8 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(err);
            }
            guard.clear_ready();
        }
    }

    #[cfg(not(target_os = "linux"))]
    async fn sleep_until(&self, due: Instant) -> std::io::Result<()> {
        tokio::time::sleep_until(due.into()).await;
        Ok(())
    }
}

/// How often the machine took the CPU away from a thread that never sleeps: `seconds` of
/// spinning on the clock, counting the gaps over 1 ms (the other work of a 2-core VM, the
/// hypervisor's own). Run it while nothing else of the benchmark does.
pub fn stall_probe(seconds: f64) -> Value {
    let start = Instant::now();
    let (mut prev, mut over_1ms, mut over_10ms, mut max) = (start, 0u64, 0u64, Duration::ZERO);
    let mut stalled = Duration::ZERO;
    while prev.duration_since(start).as_secs_f64() < seconds {
        let now = Instant::now();
        let gap = now - prev;
        if gap > Duration::from_millis(1) {
            over_1ms += 1;
            over_10ms += u64::from(gap > Duration::from_millis(10));
            stalled += gap;
        }
        max = max.max(gap);
        prev = now;
    }
    let secs = start.elapsed().as_secs_f64();
    json!({
        "seconds": secs,
        "stalls_over_1ms_per_second": over_1ms as f64 / secs,
        "stalls_over_10ms": over_10ms,
        "stalled_fraction": stalled.as_secs_f64() / secs,
        "max_stall_ms": max.as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_never_wakes_before_its_due_time() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let timer = Timer::new().unwrap();
            for micros in [0u64, 50, 300, 2000] {
                let due = Instant::now() + Duration::from_micros(micros);
                timer.sleep_until(due).await.unwrap();
                assert!(Instant::now() >= due, "woke before a {micros} us deadline");
            }
            // A deadline already past returns at once.
            timer.sleep_until(Instant::now() - Duration::from_millis(1)).await.unwrap();
        });
    }

    /// A load against a port nobody listens on.
    fn nowhere(kind: Kind, rate: u64, seconds: u64) -> Load {
        Load {
            addr: "127.0.0.1:1".into(),
            queries: Arc::new(vec![1]),
            k: 3,
            rate,
            seconds,
            kinds: vec![kind],
            server_pid: None,
            until: None,
        }
    }

    #[test]
    fn the_echo_floor_answers_every_message_once() {
        let out = nowhere(Kind::Echo, 400, 2).run().unwrap();
        let echo = &out[Kind::Echo.name()];
        assert_eq!(echo["sent"], 800);
        assert_eq!(echo["errors"], 0);
        assert!(echo["p50_us"].as_f64().unwrap() > 0.0);
        assert!(echo["p99_us"].as_f64().unwrap() >= echo["p50_us"].as_f64().unwrap());
        assert!(out.get(Kind::Query.name()).is_none());
    }

    #[test]
    fn an_unreachable_server_is_a_clear_error() {
        let err = nowhere(Kind::Query, 10, 1).run().unwrap_err();
        assert!(err.contains("cannot connect to 127.0.0.1:1"), "{err}");
    }
}
