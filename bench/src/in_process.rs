//! What the in-process benchmarks (`disk`, `replica`) share: their load's options, writers
//! that load batches from several threads, and waiting for a store's background work to
//! settle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use neardup_server::shard::Shard;

/// What an in-process load writes, as both in-process benches take it.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Documents written.
    #[arg(long, default_value_t = 1_000_000)]
    pub n: usize,
    /// Table design.
    #[arg(long, default_value = "paper-10")]
    pub design: String,
    /// Concurrent writers.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Documents per write.
    #[arg(long, default_value_t = 2000)]
    pub batch: usize,
}

/// What a store reports for settling: (runs, merges, buffered, merging, checkpoint pending).
pub(crate) type Progress = (u64, u64, u64, bool, bool);

/// Waits until nothing is buffered, merging or pending and either one run is left or
/// nothing has changed for 3 s (or `limit` passed); the seconds it took.
pub(crate) fn settle(
    progress: impl Fn() -> Result<Progress, String>,
    limit: Duration,
) -> Result<f64, String> {
    let t = Instant::now();
    let mut last = None;
    let mut steady = 0;
    while t.elapsed() < limit {
        let (runs, merges, buffered, merging, pending) = progress()?;
        let quiet = buffered == 0 && !merging && !pending;
        if quiet && runs <= 1 {
            break;
        }
        if quiet && last == Some((runs, merges)) {
            steady += 1;
            if steady >= 6 {
                break;
            }
        } else {
            steady = 0;
        }
        last = Some((runs, merges));
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Runs `write(first, end)` for every batch `[first, end)` of `0..n` from `streams` threads.
/// A batch or a number of writers of 0 is refused.
pub(crate) fn load(
    n: usize,
    batch: usize,
    streams: usize,
    write: impl Fn(usize, usize) -> Result<(), String> + Sync,
) -> Result<(), String> {
    if batch == 0 || streams == 0 {
        return Err(format!(
            "--batch and --streams must be at least 1 (got {batch} and {streams})"
        ));
    }
    let next = AtomicUsize::new(0);
    let chunks = n.div_ceil(batch);
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..streams)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            return Ok(());
                        }
                        write(c * batch, ((c + 1) * batch).min(n))?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a writer panicked".to_string())??;
        }
        Ok(())
    })
}

/// [`settle`] for a shard: until its merges, compaction and checkpoint are done.
pub(crate) fn settle_shard(shard: &Shard, limit: Duration) -> Result<f64, String> {
    settle(
        || {
            let s = shard.stats().map_err(|e| e.to_string())?;
            Ok((s.runs, s.merges, s.buffered, s.merging, s.checkpoint_pending))
        },
        limit,
    )
}
