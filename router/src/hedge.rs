//! Hedged reads: a read call to a node that has not answered within the recent calls' 90th
//! percentile is sent again to other serving replicas, and the first answer wins.
//!
//! A node pauses now and then: a merge installed, a table compacted, a page of a copy
//! written, its process descheduled. Calls to it wait meanwhile, and under coalescing every
//! read behind them waits too. The other replicas hold the same data and usually answer at
//! once, so a second call after a short delay hides the pause (Dean and Barroso, "The Tail
//! at Scale", CACM 2013). The delay follows the calls' own latency, and the second calls
//! are at most a tenth of all calls: when every node is slow (the machine is saturated),
//! hedging cannot add more than that to the load.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use neardup_server::DataResult;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Recent call latencies kept.
const WINDOW: usize = 512;

/// The delay is recomputed every this many calls.
const RECOMPUTE_EVERY: u32 = 64;

/// The shortest delay: below it, a second call would mostly race a first one about to
/// answer.
pub const HEDGE_MIN: Duration = Duration::from_millis(1);

/// The longest delay.
pub const HEDGE_MAX: Duration = Duration::from_millis(20);

/// Which percentile of recent calls' latency a call waits before it is hedged.
const PERCENTILE: f64 = 0.90;

/// Second calls earned per call: at most a tenth of calls are hedged over time.
const SHARE: f64 = 0.1;

/// Second calls that may be saved up for a burst.
const BURST: f64 = 10.0;

/// The latency record and the budget of second calls, shared by a router's reads.
pub struct Hedger {
    state: Mutex<State>,
    sent: Counter,
    won: Counter,
}

struct State {
    /// Latencies in microseconds, a ring.
    window: Vec<u32>,
    next: usize,
    since: u32,
    delay: Duration,
    tokens: f64,
}

impl Default for Hedger {
    fn default() -> Self {
        Hedger {
            state: Mutex::new(State {
                window: Vec::with_capacity(WINDOW),
                next: 0,
                since: 0,
                delay: HEDGE_MIN,
                tokens: BURST,
            }),
            sent: Counter::default(),
            won: Counter::default(),
        }
    }
}

impl Hedger {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a call that answered after `took`.
    fn record(&self, took: Duration) {
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        let mut s = self.state();
        if s.window.len() < WINDOW {
            s.window.push(us);
        } else {
            let i = s.next;
            s.window[i] = us;
        }
        s.next = (s.next + 1) % WINDOW;
        s.tokens = (s.tokens + SHARE).min(BURST);
        s.since += 1;
        if s.since >= RECOMPUTE_EVERY {
            s.since = 0;
            let mut sorted = s.window.clone();
            let i = ((sorted.len() as f64 * PERCENTILE) as usize).min(sorted.len() - 1);
            let (_, p, _) = sorted.select_nth_unstable(i);
            s.delay = Duration::from_micros(u64::from(*p)).clamp(HEDGE_MIN, HEDGE_MAX);
        }
    }

    /// How long a call waits before it is hedged.
    pub fn delay(&self) -> Duration {
        self.state().delay
    }

    /// Takes one second call from the budget; `false` when it is spent.
    fn take(&self) -> bool {
        let mut s = self.state();
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Gives back a second call taken but not sent.
    fn refund(&self) {
        let mut s = self.state();
        s.tokens = (s.tokens + 1.0).min(BURST);
    }

    /// `call`, its latency recorded when it succeeds.
    async fn recorded<T>(&self, call: impl Future<Output = DataResult<T>>) -> DataResult<T> {
        let start = Instant::now();
        let r = call.await;
        if r.is_ok() {
            self.record(start.elapsed());
        }
        r
    }

    /// Second calls sent, and those that answered first.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent.get(), self.won.get())
    }

    /// Adds the counts to `registry`: `neardup_router_hedged_calls_total` (second calls
    /// sent) and `neardup_router_hedged_won_total` (those that answered first).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "neardup_router_hedged_calls",
            "Read calls to nodes sent again to other replicas after the hedging delay",
            self.sent.clone(),
        );
        registry.register(
            "neardup_router_hedged_won",
            "Second read calls that answered before the first",
            self.won.clone(),
        );
    }

    /// `primary`'s answer; or, when it has not answered within [`delay`](Self::delay) and
    /// `backup` makes a second call (other replicas for the same answer; `None` when some
    /// part has no other replica) and the budget allows one, the first success of the two.
    /// A failure of one waits for the other; both failing give `primary`'s error.
    pub async fn run<T, P, B>(
        &self,
        primary: P,
        backup: impl FnOnce() -> Option<B>,
    ) -> DataResult<T>
    where
        P: Future<Output = DataResult<T>>,
        B: Future<Output = DataResult<T>>,
    {
        let primary = self.recorded(primary);
        tokio::pin!(primary);
        tokio::select! {
            biased;
            r = &mut primary => return r,
            () = tokio::time::sleep(self.delay()) => {}
        }
        // The budget first: making the backup sends its calls.
        if !self.take() {
            return primary.await;
        }
        let Some(backup) = backup() else {
            self.refund();
            return primary.await;
        };
        self.sent.inc();
        let backup = self.recorded(backup);
        tokio::pin!(backup);
        tokio::select! {
            biased;
            r = &mut primary => match r {
                Ok(v) => Ok(v),
                Err(e) => backup.await.map_err(|_| e),
            },
            r = &mut backup => match r {
                Ok(v) => {
                    self.won.inc();
                    Ok(v)
                }
                Err(_) => primary.await,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neardup_server::DataError;

    async fn after(ms: u64, r: DataResult<u32>) -> DataResult<u32> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        r
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_primary_is_never_hedged() {
        let h = Hedger::default();
        let r = h.run(after(0, Ok(1)), || -> Option<std::future::Ready<_>> { panic!("hedged") });
        assert_eq!(r.await.unwrap(), 1);
        assert_eq!(h.counts(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_primary_loses_to_the_backup() {
        let h = Hedger::default();
        let t = tokio::time::Instant::now();
        let r = h.run(after(500, Ok(1)), || Some(after(1, Ok(2)))).await;
        assert_eq!(r.unwrap(), 2);
        assert_eq!(h.counts(), (1, 1));
        assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_backup_waits_for_the_primary_and_both_failing_give_the_primarys_error() {
        let h = Hedger::default();
        let r = h.run(after(50, Ok(1)), || Some(after(1, Err(DataError::Internal("b".into())))));
        assert_eq!(r.await.unwrap(), 1);
        let r = h.run(after(50, Err(DataError::Internal("p".into()))), || {
            Some(after(60, Err(DataError::Internal("b".into()))))
        });
        assert!(matches!(r.await, Err(DataError::Internal(m)) if m == "p"));
        // The primary failing first gives the backup's success.
        let r = h.run(after(5, Err(DataError::Internal("p".into()))), || Some(after(50, Ok(2))));
        assert_eq!(r.await.unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn without_another_replica_or_budget_the_primary_is_awaited() {
        let h = Hedger::default();
        let r = h.run(after(50, Ok(1)), || -> Option<std::future::Ready<_>> { None });
        assert_eq!(r.await.unwrap(), 1);
        // Every call slow: the burst, then a tenth of the calls; no backup is even made
        // (its calls sent) without the budget for it.
        let (calls, made) = (100, std::cell::Cell::new(0));
        for _ in 0..calls {
            let backup = || {
                made.set(made.get() + 1);
                Some(after(1, Ok(2)))
            };
            h.run(after(50, Ok(1)), backup).await.unwrap();
        }
        let (sent, won) = h.counts();
        assert_eq!(sent, won);
        assert_eq!(made.get(), sent);
        let most = BURST + SHARE * (calls as f64 + 1.0);
        assert!(sent as f64 >= BURST && sent as f64 <= most, "{sent} second calls");
        assert!(sent < calls);
    }

    #[test]
    fn the_delay_follows_the_90th_percentile_within_its_bounds() {
        let h = Hedger::default();
        assert_eq!(h.delay(), HEDGE_MIN);
        // 90% of calls at 2 ms: the delay is 2 ms.
        for i in 0..WINDOW {
            h.record(Duration::from_millis(if i % 10 == 9 { 100 } else { 2 }));
        }
        assert_eq!(h.delay(), Duration::from_millis(2));
        // A fifth at 100 ms: capped.
        for i in 0..WINDOW {
            h.record(Duration::from_millis(if i % 5 == 4 { 100 } else { 2 }));
        }
        assert_eq!(h.delay(), HEDGE_MAX);
        for _ in 0..WINDOW {
            h.record(Duration::from_millis(3));
        }
        assert_eq!(h.delay(), Duration::from_millis(3));
        for _ in 0..WINDOW {
            h.record(Duration::from_micros(100));
        }
        assert_eq!(h.delay(), HEDGE_MIN);
    }
}
