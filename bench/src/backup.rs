//! `neardup-bench backup`: a single node's backup and restore timed on real processes, with
//! the ordinary way to load the same documents (durable streaming inserts) as the baseline
//! in the same run.
//!
//! 1. starts `neardup serve` with a fresh data directory and streams `--n` documents into it
//!    (the baseline);
//! 2. `neardup backup` of it (timed), then stops it;
//! 3. starts a second server with a fresh data directory and `neardup restore`s the backup
//!    into it (timed: the command's whole run, the check of the backup included, until
//!    every document is durable);
//! 4. checks the restored server: its document count, and 1,000 documents found by their
//!    own fingerprints at distance 0;
//! 5. restarts it (SIGTERM, then start until SERVING), timed.
//!
//! The last line of stdout is one JSON object.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions};
use neardup_core::util::SplitMix64;
use serde_json::{Value, json};

use crate::free_port;
use crate::service::{
    ServerProcess, insert_range, load_average, name, neardup_binary, on_own_runtime, tempfile_dir,
};

/// Options of `neardup-bench backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Documents stored.
    #[arg(long, default_value_t = 1_000_000)]
    n: usize,
    /// Give every document a sketch (66 bytes) as well.
    #[arg(long)]
    sketches: bool,
    /// Concurrent InsertStream calls of the baseline load.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Seed of the fingerprints.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `neardup` binary [default: `neardup` next to this program, else on `PATH`].
    #[arg(long)]
    neardup: Option<PathBuf>,
}

/// Runs the `neardup` command `args` to completion; its JSON output and the seconds it took.
fn timed_cli(exe: &std::path::Path, args: &[&str]) -> Result<(Value, f64), String> {
    let t = Instant::now();
    let out = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!(
            "neardup {} failed: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("neardup {} printed no JSON: {e}", args[0]))?;
    Ok((v, secs))
}

async fn start(
    exe: &std::path::Path,
    data: &std::path::Path,
) -> Result<(ServerProcess, f64), String> {
    let t = Instant::now();
    let mut s = ServerProcess::launch(exe, data, free_port()?, None, &[], None)?;
    let up = s.wait_serving(t, Duration::from_secs(600)).await?;
    Ok((s, up))
}

async fn client(addr: &str) -> Result<Client, String> {
    let options = ClientOptions { timeout: Duration::from_secs(600), ..Default::default() };
    Client::connect_with(addr, options).await.map_err(|e| e.to_string())
}

/// Runs `neardup-bench backup`.
pub async fn run(args: BackupArgs) -> Result<(), String> {
    let exe = neardup_binary(args.neardup.as_deref());
    let dir = tempfile_dir()?;
    let _ = std::fs::remove_dir_all(dir.join("backup"));
    let mut rng = SplitMix64::new(args.seed);
    let fps: Arc<Vec<u64>> = Arc::new((0..args.n).map(|_| rng.next_u64()).collect());
    eprintln!("load average at start: {:.2}", load_average());

    let (a, _) = start(&exe, &dir.join("a")).await?;
    let ca = client(&a.addr).await?;
    let t = Instant::now();
    let inserted =
        insert_range(&ca, fps.clone(), 0..args.n, args.streams, 10_000, 0, args.sketches).await?;
    let insert_s = t.elapsed().as_secs_f64();
    if inserted != args.n as u64 {
        return Err(format!("{inserted} of {} documents inserted", args.n));
    }
    eprintln!("baseline: {} documents inserted in {insert_s:.1} s", args.n);

    let to = dir.join("backup");
    let (b_out, backup_s) = timed_cli(
        &exe,
        &["backup", "--server", &a.addr, "--to", to.to_str().ok_or("a non-UTF-8 path")?],
    )?;
    eprintln!("backup: {backup_s:.1} s, {} bytes", b_out["bytes"]);
    a.stop()?;

    let (b, _) = start(&exe, &dir.join("b")).await?;
    let (r_out, restore_s) = timed_cli(
        &exe,
        &["restore", "--server", &b.addr, "--from", to.to_str().ok_or("a non-UTF-8 path")?],
    )?;
    eprintln!("restore: {restore_s:.1} s");
    if r_out["restored"].as_u64() != Some(args.n as u64) {
        return Err(format!("the restore stored {} of {} documents", r_out["restored"], args.n));
    }
    let cb = client(&b.addr).await?;
    let held = cb.stats().await.map_err(|e| e.to_string())?.documents;
    if held != args.n as u64 {
        return Err(format!("the restored server holds {held} of {} documents", args.n));
    }
    let step = (args.n / 1000).max(1);
    let mut found = 0;
    for i in (0..args.n).step_by(step) {
        let r = cb.query(fps[i], Some(0), 100).await.map_err(|e| e.to_string())?;
        if !r.matches.iter().any(|m| m.id == name(i)) {
            return Err(format!("document {i} is not found in the restored server"));
        }
        found += 1;
    }
    let shutdown_s = b.stop()?;
    let (b, restart_s) = start(&exe, &dir.join("b")).await?;
    b.stop()?;
    let _ = std::fs::remove_dir_all(&dir);

    let result = json!({
        "n": args.n,
        "sketches": args.sketches,
        "insert_seconds": insert_s,
        "insert_docs_per_s": args.n as f64 / insert_s,
        "backup_seconds": backup_s,
        "backup_bytes": b_out["bytes"],
        "restore_seconds": restore_s,
        "restore_docs_per_s": args.n as f64 / restore_s,
        "restore_over_insert": restore_s / insert_s,
        "checked_by_fingerprint": found,
        "shutdown_after_restore_seconds": shutdown_s,
        "start_after_restore_seconds": restart_s,
        "load_average_end": load_average(),
    });
    println!(
        "n={} insert {:.1} s | backup {:.1} s | restore {:.1} s ({:.2}x the insert) | restart \
         {:.1} s",
        args.n,
        insert_s,
        backup_s,
        restore_s,
        restore_s / insert_s,
        restart_s
    );
    println!("{result}");
    Ok(())
}

/// Runs `neardup-bench backup` on a runtime of its own.
pub fn main(args: BackupArgs) -> Result<(), String> {
    on_own_runtime(run(args))
}
