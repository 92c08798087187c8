//! Peak heap memory of a phase of a benchmark: a global allocator over the system's that
//! counts live bytes and their high-water mark while counting is on. Off, it costs one
//! relaxed load per call, so the other benchmarks measure the plain allocator.
//!
//! The process's resident set is also read (`VmRSS`, and `VmHWM` after resetting it through
//! `/proc/self/clear_refs`), so that a figure can be checked against what the machine saw.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// The system allocator, counting while [`start`] is in effect.
pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed while counting (frees of older blocks make it dip).
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[inline]
fn grew(bytes: usize) {
    if ON.load(Ordering::Relaxed) {
        let now = LIVE.fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

#[inline]
fn shrank(bytes: usize) {
    if ON.load(Ordering::Relaxed) {
        LIVE.fetch_sub(bytes as i64, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size <= layout.size() {
                // A shrink gives memory back where it is.
                shrank(layout.size() - new_size);
            } else {
                // A growth may move: the new block counts before the old one is freed,
                // so the high-water mark is not understated.
                grew(new_size);
                shrank(layout.size());
            }
        }
        p
    }
}

/// What a phase used: heap bytes at most above its start, and the resident set's growth.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// The heap's high-water mark above its level at [`start`].
    pub heap_bytes: u64,
    /// The resident set's high-water mark above its size at [`start`], when Linux reports it.
    pub rss_bytes: Option<u64>,
}

/// A phase being measured; [`Phase::end`] gives its [`Peak`].
pub struct Phase {
    rss_start: Option<u64>,
}

/// Starts counting from zero. Phases do not nest.
pub fn start() -> Phase {
    LIVE.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    // Writing 5 resets the resident set's high-water mark to its current size.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let rss_start = if reset { status_bytes("VmRSS:") } else { None };
    ON.store(true, Ordering::SeqCst);
    Phase { rss_start }
}

impl Phase {
    /// Stops counting and reports the phase's peak.
    pub fn end(self) -> Peak {
        ON.store(false, Ordering::SeqCst);
        let rss_bytes = match (self.rss_start, status_bytes("VmHWM:")) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Peak { heap_bytes: PEAK.load(Ordering::Relaxed).max(0) as u64, rss_bytes }
    }
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_sees_its_largest_allocation_and_not_the_ones_before() {
        let before = vec![1u8; 8 << 20];
        let phase = start();
        let big = vec![7u8; 32 << 20];
        drop(big);
        let small = vec![3u8; 1 << 20];
        let peak = phase.end();
        assert!(peak.heap_bytes >= 32 << 20, "{peak:?}");
        // Other tests of this binary may allocate meanwhile: only a gross miscount fails.
        assert!(peak.heap_bytes < 1 << 30, "{peak:?}");
        assert_eq!(before.len() + small.len(), (8 << 20) + (1 << 20));
    }
}
