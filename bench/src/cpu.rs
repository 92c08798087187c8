//! CPU time of a process and of the calling thread, for the "CPU per request" figures of the
//! service benchmarks: wall-clock rates on a shared 2-core machine say little about what a
//! request costs, the CPU time spent over a phase divided by the requests it answered does.

/// CPU time (user + system) a process has used so far, over all its threads, living and
/// ended, in seconds: `utime + stime` of `/proc/<pid>/stat`. `None` where there is no such
/// file (another OS, or the process is gone).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// CPU time (user + system) one thread of this process has used so far, in seconds:
/// `/proc/self/task/<tid>/stat`, as [`process_cpu_seconds`].
pub fn thread_of_mine_cpu_seconds(tid: i32) -> Option<f64> {
    stat_cpu_seconds(&format!("/proc/self/task/{tid}/stat"))
}

/// The calling thread's id, for [`CpuMeter::of_thread`] (`None`: not on Linux).
pub fn thread_id() -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes nothing and only returns the calling thread's id.
        Some(unsafe { libc::gettid() })
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// `utime + stime` of a `stat` file of proc(5), in seconds.
fn stat_cpu_seconds(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // Fields 14 and 15 of proc(5); `rest` starts at field 3.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// CPU time used so far by every process of `pids`, in seconds (`None` if one is gone).
pub fn cpu_of(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|&p| process_cpu_seconds(p)).sum()
}

/// Microseconds of CPU per item between two readings of [`cpu_of`].
pub fn cpu_per(before: Option<f64>, after: Option<f64>, items: u64) -> Option<f64> {
    Some((after? - before?) * 1e6 / items.max(1) as f64)
}

/// A window over which processes' CPU time is read: the cores they kept busy on average.
#[derive(Debug, Clone, Copy)]
pub struct CoresBusy {
    cpu: Option<f64>,
    at: std::time::Instant,
}

impl CoresBusy {
    /// Opens the window on the processes `pids` ([`cpu_of`]).
    pub fn start(pids: &[u32]) -> CoresBusy {
        CoresBusy { cpu: cpu_of(pids), at: std::time::Instant::now() }
    }

    /// The cores `pids` kept busy on average since [`start`](Self::start): their CPU time
    /// over the window's length. A process started since counts from its start; `None` if
    /// a reading failed.
    pub fn cores(&self, pids: &[u32]) -> Option<f64> {
        Some((cpu_of(pids)? - self.cpu?) / self.at.elapsed().as_secs_f64().max(1e-9))
    }
}

/// CPU time of the calling thread, in seconds (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_seconds() -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// CPU time a process spends over a stretch of work: [`start`](CpuMeter::start) it, then
/// [`stop`](CpuMeter::stop) it; stretches add up.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuMeter {
    source: Option<Source>,
    started: Option<f64>,
    /// Seconds measured so far; `None` once a reading failed.
    total: Option<f64>,
}

/// Whose CPU time a [`CpuMeter`] reads.
#[derive(Debug, Clone, Copy)]
enum Source {
    Process(u32),
    ThreadOfMine(i32),
}

impl Source {
    fn seconds(self) -> Option<f64> {
        match self {
            Source::Process(pid) => process_cpu_seconds(pid),
            Source::ThreadOfMine(tid) => thread_of_mine_cpu_seconds(tid),
        }
    }
}

impl CpuMeter {
    /// A meter of process `pid` (`None`: measures nothing, [`us_per`](Self::us_per) is
    /// `None`).
    pub fn of(pid: Option<u32>) -> CpuMeter {
        CpuMeter::with(pid.map(Source::Process))
    }

    /// A meter of thread `tid` of this process ([`thread_id`]; `None`: measures nothing).
    pub fn of_thread(tid: Option<i32>) -> CpuMeter {
        CpuMeter::with(tid.map(Source::ThreadOfMine))
    }

    fn with(source: Option<Source>) -> CpuMeter {
        CpuMeter { source, started: None, total: source.map(|_| 0.0) }
    }

    /// Starts a stretch.
    pub fn start(&mut self) {
        self.started = self.source.and_then(Source::seconds);
    }

    /// Ends the stretch started last and adds it.
    pub fn stop(&mut self) {
        let now = self.source.and_then(Source::seconds);
        self.total = match (self.total, self.started.take(), now) {
            (Some(t), Some(a), Some(b)) => Some(t + (b - a).max(0.0)),
            _ => None,
        };
    }

    /// Microseconds of CPU per item, over `items` items; `None` without a measurement or
    /// items.
    pub fn us_per(&self, items: u64) -> Option<f64> {
        self.total.filter(|_| items > 0).map(|s| s * 1e6 / items as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until this thread has used 50 ms of CPU (however long that takes on a shared
    /// machine).
    fn spin_50ms() {
        let t0 = thread_cpu_seconds().unwrap();
        let mut x = 0u64;
        while thread_cpu_seconds().unwrap() - t0 < 0.05 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn this_process_uses_cpu_when_it_spins() {
        let me = std::process::id();
        let mut meter = CpuMeter::of(Some(me));
        meter.start();
        // The process's count, in ticks of at most 10 ms, must see most of it.
        spin_50ms();
        meter.stop();
        let seen = meter.us_per(1).unwrap();
        assert!(seen >= 30_000.0, "{seen} us of CPU seen for 50 ms spent");
        assert_eq!(meter.us_per(0), None);
    }

    #[test]
    fn a_thread_is_metered_apart_from_the_others() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        // A thread that only sleeps, metered while this one spins.
        let idle = std::thread::spawn(move || {
            tx.send(thread_id()).unwrap();
            let _ = wait.recv();
        });
        let mut spinning = CpuMeter::of_thread(thread_id());
        let mut sleeping = CpuMeter::of_thread(rx.recv().unwrap());
        spinning.start();
        sleeping.start();
        spin_50ms();
        spinning.stop();
        sleeping.stop();
        go.send(()).unwrap();
        idle.join().unwrap();
        let (spun, slept) = (spinning.us_per(1).unwrap(), sleeping.us_per(1).unwrap());
        assert!(spun >= 30_000.0, "{spun} us of CPU seen for 50 ms spent");
        // Counted in clock ticks (10 ms): a sleeping thread's count moves by one at most.
        assert!(slept <= 10_000.0, "{slept} us of CPU seen for a sleeping thread");
        assert_eq!(CpuMeter::of_thread(None).us_per(1), None);
    }

    #[test]
    fn no_process_no_figure() {
        let mut meter = CpuMeter::of(None);
        meter.start();
        meter.stop();
        assert_eq!(meter.us_per(1), None);
        assert_eq!(process_cpu_seconds(u32::MAX), None);
    }
}
