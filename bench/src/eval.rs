//! `neardup-bench eval`: the quality evaluation of `neardup_dedup::eval`, and its two PNG
//! plots.
//!
//! The scoring is a library in `neardup-dedup`; drawing is here so that only this
//! measurement program links `plotters` and needs a TrueType font at run time, never the
//! `neardup` binary.

use std::path::PathBuf;

use neardup_dedup::DedupError;

use crate::plot;

/// Options of `neardup-bench eval`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalWithPlotsArgs {
    /// What to evaluate, and how.
    #[command(flatten)]
    eval: neardup_dedup::EvalArgs,
    /// TrueType font for the plots [default: DejaVu Sans or Liberation Sans from the
    /// system's font packages].
    #[arg(long)]
    font: Option<PathBuf>,
    /// Do not draw the plots.
    #[arg(long)]
    no_plots: bool,
    /// The online replay through a real server (`--online`).
    #[command(flatten)]
    online: crate::eval_online::OnlineArgs,
}

/// Runs `neardup-bench eval`: `report.json`, the table on stdout, then the plots.
pub fn run(args: EvalWithPlotsArgs) -> Result<(), DedupError> {
    let EvalWithPlotsArgs { eval, font, no_plots, online } = args;
    let out = eval.out.clone();
    let corpus = eval.corpus.clone();
    let report = neardup_dedup::run_eval(eval)?;
    if !no_plots {
        let font = plot::load_font(font.as_deref())?;
        plot::precision_recall(&out.join("precision_recall.png"), &report, &font)?;
        plot::xor_leading_bit(&out.join("xor_leading_bit.png"), &report, &font)?;
    }
    if online.online {
        crate::eval_online::run(&corpus, &out, &online).map_err(DedupError::Usage)?;
    }
    Ok(())
}
