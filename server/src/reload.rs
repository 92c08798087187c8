//! Files a server reads again while it runs (the tokens file, the TLS certificate and key):
//! on SIGHUP, and when one of them changes.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Runs `reload` on SIGHUP and whenever the modification time of one of `files` changes
/// (looked at every `every`), until the returned task is aborted. `reload` says what it
/// took (logged) or why it could not (logged as a warning; it is tried again at the next
/// signal or change, and what was in force stays). `what` names the files in the log.
pub fn watch_files(
    what: &'static str,
    files: Vec<PathBuf>,
    every: Duration,
    reload: impl Fn() -> Result<String, String> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = stamp(&files);
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            let now = stamp(&files);
            if !signalled && now == seen {
                continue;
            }
            seen = now;
            match reload() {
                Ok(took) => tracing::info!(what, took = %took, "read again"),
                Err(e) => tracing::warn!(what, error = %e, "did not read; what was in force stays"),
            }
        }
    })
}

/// The modification times of `files` (`None` for one that cannot be read).
fn stamp(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files.iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect()
}
