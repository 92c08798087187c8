//! # neardup-dedup
//!
//! The offline half of neardup: point it at a corpus and get every document's duplicate
//! cluster and the original of each cluster (`neardup dedup`), and measure how good the
//! detection is against exact ground truth ([`eval`], with [`jaccard`] and [`quality`]:
//! `neardup-bench eval`, which adds the plots).
//!
//! This crate is a library so that the `neardup` command line and the `neardup-bench`
//! measurement program only wire subcommands:
//!
//! ```no_run
//! use clap::Parser;
//!
//! #[derive(clap::Parser)]
//! enum Cli {
//!     /// Duplicate clusters and originals of a corpus.
//!     Dedup(neardup_dedup::DedupArgs),
//!     /// Precision and recall against exact Jaccard ground truth.
//!     Eval(neardup_dedup::EvalArgs),
//! }
//!
//! fn main() -> Result<(), neardup_dedup::DedupError> {
//!     match Cli::parse() {
//!         Cli::Dedup(args) => neardup_dedup::run_dedup(args).map(|_| ()),
//!         Cli::Eval(args) => neardup_dedup::run_eval(args).map(|_| ()),
//!     }
//! }
//! ```
//!
//! How a dedup run works is in [`dedup`]; how clusters are formed in [`clusters`]; the
//! input formats in the documentation of [`DedupArgs`] and of the `input` module; what the
//! evaluation measures in [`eval`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clusters;
pub mod config;
mod decode;
pub mod dedup;
pub mod error;
pub mod eval;
pub mod html;
mod idf;
mod input;
pub mod jaccard;
mod output;
mod pipeline;
pub mod quality;
pub mod synth;
pub mod timestamp;

pub use config::{FingerprintArgs, HashArg};
pub use dedup::{ClusterRule, DedupArgs, Summary, run_dedup};
pub use error::{DedupError, SkipReason};
pub use eval::{EvalArgs, EvalReport, run_eval};
pub use input::InputFormat;
pub use output::OutputFormat;
pub use pipeline::{OnError, Skipped};
pub use synth::{GenerateArgs, run_generate};
