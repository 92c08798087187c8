//! `neardup-bench eval --online`: admission through a real server, page by page, scored per
//! document against the exact truth, next to offline verification on the same corpus in the
//! same run.
//!
//! The corpus is replayed in timestamp order (documents without a timestamp last, ties in
//! file order), one `CheckAndInsert` at a time, each document sent as its text (the server
//! fingerprints and sketches it) and always stored. A document is:
//!
//! * **truly a near-duplicate** when an earlier document of the replay has exact word
//!   3-gram Jaccard similarity at least `--online-truth` (0.9) with it;
//! * **admitted as one online** when the server answered `duplicate`;
//! * **found offline** when an earlier document is within `--offline-k` (8) bits and has
//!   exact Jaccard similarity at least `--online-truth`: what `neardup dedup --verify 0.9
//!   -k 8` pairs, seen from the later document.
//!
//! Precision and recall are over documents (the later document of each pair is the one a
//! crawl frontier would skip).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use neardup_client::{Client, ClientOptions, Verification, text_doc};
use neardup_core::fingerprint::{FingerprintConfig, Fingerprinter};
use neardup_core::util::hamming;
use neardup_dedup::jaccard::{jaccard, similarity_join};
use neardup_dedup::quality::Scores;
use serde_json::{Value, json};

use crate::free_port;
use crate::service::ServerProcess;

/// Options of the online replay (`neardup-bench eval --online`).
#[derive(Debug, Clone, clap::Args)]
pub struct OnlineArgs {
    /// Also replay the corpus through a real server with CheckAndInsert and score it.
    #[arg(long)]
    pub online: bool,
    /// Table design of the server (its largest k bounds the candidate k) [default: the
    /// server's].
    #[arg(long)]
    pub online_design: Option<String>,
    /// Verify threshold sent with every CheckAndInsert [default: the server's].
    #[arg(long)]
    pub online_verify_jaccard: Option<f64>,
    /// Candidate distance sent with every CheckAndInsert [default: the server's, the
    /// design's largest k].
    #[arg(long)]
    pub online_candidate_k: Option<u32>,
    /// Distance k for documents without sketches [default: the design's largest].
    #[arg(long)]
    pub online_k: Option<u32>,
    /// A document is truly a near-duplicate when an earlier one reaches this Jaccard
    /// similarity.
    #[arg(long, default_value_t = 0.9)]
    pub online_truth: f64,
    /// The offline comparison verifies candidates within this distance (dedup's default).
    #[arg(long, default_value_t = 8)]
    pub offline_k: u32,
    /// The `neardup` binary to start as the server [default: `neardup` next to this
    /// program, else the one on PATH].
    #[arg(long, value_name = "FILE")]
    pub neardup: Option<PathBuf>,
    /// Also simulate the online rule (candidates within `--offline-k`, kept when the
    /// estimate reaches J) without a server for other sketch shapes, BINSxBITS, and print
    /// precision and recall per shape and threshold (how the sketch's shape was chosen).
    #[arg(long, value_delimiter = ',')]
    pub sketch_shapes: Vec<String>,
}

/// One document of the replay.
struct Page {
    text: String,
    ts: i64,
    fp: u64,
    shingles: Vec<u64>,
}

fn read_pages(corpus: &std::path::Path) -> Result<(Vec<Page>, usize), String> {
    let text = std::fs::read_to_string(corpus)
        .map_err(|e| format!("cannot read {}: {e}", corpus.display()))?;
    let mut f = Fingerprinter::new(FingerprintConfig::default()).map_err(|e| e.to_string())?;
    let mut pages = Vec::new();
    let mut skipped = 0;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        let Some(t) = v["text"].as_str() else {
            skipped += 1;
            continue;
        };
        let Ok(fp) = f.fingerprint(t) else {
            skipped += 1;
            continue;
        };
        let shingles = f.word_shingles(t, 3).map_err(|e| e.to_string())?;
        let ts = v["timestamp"].as_i64().unwrap_or(i64::MAX);
        pages.push(Page { text: t.to_string(), ts, fp, shingles });
    }
    // Timestamp order; without a timestamp last; ties in file order (a stable sort).
    pages.sort_by_key(|p| p.ts);
    Ok((pages, skipped))
}

fn scores(pred: &[bool], truth: &[bool]) -> Scores {
    let tp = pred.iter().zip(truth).filter(|(p, t)| **p && **t).count();
    let fp = pred.iter().zip(truth).filter(|(p, t)| **p && !**t).count();
    let fn_ = pred.iter().zip(truth).filter(|(p, t)| !**p && **t).count();
    Scores::from_counts(tp, fp, fn_)
}

/// Runs the replay and the offline comparison; prints the table and returns the figures
/// (also written to `out/online.json`).
pub fn run(
    corpus: &std::path::Path,
    out: &std::path::Path,
    args: &OnlineArgs,
) -> Result<Value, String> {
    let t0 = Instant::now();
    let (pages, skipped) = read_pages(corpus)?;
    let n = pages.len();
    let t = args.online_truth;
    // The truth: exact join; the later document of each pair is a near-duplicate.
    let sets: Vec<&[u64]> = pages.iter().map(|p| p.shingles.as_slice()).collect();
    let pairs = similarity_join(&sets, t).map_err(|e| e.to_string())?;
    let mut truth = vec![false; n];
    for p in &pairs {
        truth[p.i.max(p.j)] = true;
    }
    // Offline: candidates within offline_k, verified by exact Jaccard.
    let mut offline = vec![false; n];
    for j in 0..n {
        offline[j] = (0..j).any(|i| {
            hamming(pages[i].fp, pages[j].fp) <= args.offline_k
                && jaccard(&pages[i].shingles, &pages[j].shingles) >= t
        });
    }
    let prep_secs = t0.elapsed().as_secs_f64();
    if !args.sketch_shapes.is_empty() {
        simulate_shapes(&pages, &truth, args)?;
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let (online, server_secs, stats) = rt.block_on(replay(&pages, args))?;
    let on = scores(&online, &truth);
    let off = scores(&offline, &truth);
    let result = json!({
        "corpus": corpus.display().to_string(),
        "documents": n,
        "skipped": skipped,
        "truth_threshold": t,
        "true_near_duplicates": truth.iter().filter(|x| **x).count(),
        "design": stats.2,
        "max_k": stats.0,
        "verify_jaccard": args.online_verify_jaccard,
        "candidate_k": args.online_candidate_k,
        "offline_k": args.offline_k,
        "online": score_json(&on),
        "offline": score_json(&off),
        "replay_seconds": server_secs,
        "prepare_seconds": prep_secs,
        "disk_bytes": stats.1,
    });
    println!(
        "\nonline admission, {n} documents in timestamp order ({} near-duplicates of an earlier \
         one at J >= {t}); design {} (max k {})",
        result["true_near_duplicates"], stats.2, stats.0
    );
    println!("| | precision | recall | F1 | flagged |");
    println!("|---|---:|---:|---:|---:|");
    for (name, s) in [("online CheckAndInsert (verified)", &on), ("offline dedup rule", &off)] {
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {} |",
            s.precision,
            s.recall,
            s.f1,
            s.true_positives + s.false_positives
        );
    }
    println!(
        "replay: {:.1} s ({:.0} CheckAndInsert/s, one at a time)",
        server_secs,
        n as f64 / server_secs.max(1e-9)
    );
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    std::fs::write(
        out.join("online.json"),
        serde_json::to_string_pretty(&result).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(result)
}

/// The online rule over candidates within `offline_k`, for each sketch shape and threshold.
fn simulate_shapes(pages: &[Page], truth: &[bool], args: &OnlineArgs) -> Result<(), String> {
    let n = pages.len();
    let mut cands: Vec<(u32, u32)> = Vec::new();
    for j in 0..n {
        for i in 0..j {
            if hamming(pages[i].fp, pages[j].fp) <= args.offline_k {
                cands.push((i as u32, j as u32));
            }
        }
    }
    println!("\nsketch shapes: the online rule simulated over {} candidate pairs", cands.len());
    println!("| shape | bytes | J | precision | recall |");
    println!("|---|---:|---:|---:|---:|");
    for shape in &args.sketch_shapes {
        let (b, k) = shape.split_once('x').ok_or_else(|| format!("shape {shape:?}: BINSxBITS"))?;
        let bins: usize = b.parse().map_err(|_| format!("shape {shape:?}"))?;
        let bits: u32 = k.parse().map_err(|_| format!("shape {shape:?}"))?;
        let values: Vec<Vec<u16>> = pages
            .iter()
            .map(|p| neardup_core::sketch::values_of_shape(&p.shingles, bins, bits))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("shape {shape:?} is out of range"))?;
        let est: Vec<f64> = cands
            .iter()
            .map(|&(i, j)| {
                let (a, b) = (&values[i as usize], &values[j as usize]);
                let m = a.iter().zip(b).filter(|(x, y)| x == y).count();
                neardup_core::sketch::estimate(m, bins, bits)
            })
            .collect();
        for jt in [0.88, 0.89, 0.9, 0.91, 0.92] {
            let mut pred = vec![false; n];
            for (&(_, j), &e) in cands.iter().zip(&est) {
                if e >= jt {
                    pred[j as usize] = true;
                }
            }
            let s = scores(&pred, truth);
            println!(
                "| {bins}x{bits} | {} | {jt} | {:.3} | {:.3} |",
                bins * bits as usize / 8,
                s.precision,
                s.recall
            );
        }
    }
    Ok(())
}

fn score_json(s: &Scores) -> Value {
    json!({
        "precision": s.precision, "recall": s.recall, "f1": s.f1,
        "true_positives": s.true_positives, "false_positives": s.false_positives,
        "false_negatives": s.false_negatives,
    })
}

/// Starts a server on a fresh data directory, replays the pages; returns what it admitted,
/// the replay's seconds, and (max k, disk bytes, design) from its statistics.
async fn replay(
    pages: &[Page],
    args: &OnlineArgs,
) -> Result<(Vec<bool>, f64, (u32, u64, String)), String> {
    let dir = std::env::temp_dir().join(format!("neardup-eval-online-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port()?;
    let exe = crate::service::neardup_binary(args.neardup.as_deref());
    let mut server =
        ServerProcess::launch(&exe, &dir, port, args.online_design.as_deref(), &[], None)?;
    server.wait_serving(Instant::now(), Duration::from_secs(60)).await?;
    let options = ClientOptions { timeout: Duration::from_secs(60), ..Default::default() };
    let client = Client::connect_with(&server.addr, options).await.map_err(|e| e.to_string())?;
    let verify =
        Verification { jaccard: args.online_verify_jaccard, candidate_k: args.online_candidate_k };
    let t = Instant::now();
    let mut admitted = Vec::with_capacity(pages.len());
    for (i, p) in pages.iter().enumerate() {
        let ts = p.ts.saturating_mul(1000);
        let d = text_doc(format!("page/{i}"), p.text.clone(), ts);
        let r = client
            .check_and_insert_verified(d, args.online_k, verify, 1, false)
            .await
            .map_err(|e| format!("CheckAndInsert of document {i}: {e}"))?;
        admitted.push(r.duplicate);
    }
    let secs = t.elapsed().as_secs_f64();
    let stats = client.stats().await.map_err(|e| e.to_string())?;
    server.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((admitted, secs, (stats.max_k, stats.disk_bytes, stats.design)))
}
