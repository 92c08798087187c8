//! The evaluation's PNG plots, drawn with `plotters` on its bitmap backend.
//!
//! Text needs a TrueType font, read at run time (no font is built in or committed): the
//! file given with `--font`, else DejaVu Sans (Debian package `fonts-dejavu-core`) or
//! Liberation Sans (`fonts-liberation`) where Debian installs them.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use neardup_dedup::{DedupError, EvalReport};

const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// The family name the plots use for the registered font.
pub(crate) struct Font(&'static str);

/// Finds, reads and registers the plot font.
pub(crate) fn load_font(explicit: Option<&Path>) -> Result<Font, DedupError> {
    let path: PathBuf =
        match explicit {
            Some(p) => p.to_path_buf(),
            None => FONT_CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or_else(
                || DedupError::Plot {
                    path: "(font)".into(),
                    message: format!(
                        "no TrueType font found for the plots (looked for {}); install one \
                     (apt-get install fonts-dejavu-core), pass --font FILE.ttf, or use --no-plots",
                        FONT_CANDIDATES.join(", ")
                    ),
                },
            )?,
        };
    let bytes = std::fs::read(&path).map_err(|e| DedupError::io(path.display(), e))?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("neardup-plot", FontStyle::Normal, bytes).map_err(|_| DedupError::Plot {
        path: path.display().to_string(),
        message: "not a TrueType/OpenType font that can be read".into(),
    })?;
    Ok(Font("neardup-plot"))
}

fn err(path: &Path) -> impl Fn(String) -> DedupError + '_ {
    move |message| DedupError::Plot { path: path.display().to_string(), message }
}

/// Figure 1: precision and recall against k, pairs and documents, for each truth threshold;
/// verified points as markers.
pub(crate) fn precision_recall(path: &Path, r: &EvalReport, font: &Font) -> Result<(), DedupError> {
    let e = err(path);
    let root = BitMapBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let root = root
        .titled(
            &format!(
                "simhash near-duplicates vs exact word 3-gram Jaccard ({} documents)",
                r.documents
            ),
            (font.0, 26),
        )
        .map_err(|x| e(x.to_string()))?;
    let panels = root.split_evenly((1, 2));
    let max_k = r.simhash.iter().map(|x| x.k).max().unwrap_or(0);
    let mut truths: Vec<f64> = r.simhash.iter().map(|x| x.truth).collect();
    truths.sort_by(f64::total_cmp);
    truths.dedup();
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    for (panel, docs) in panels.iter().zip([false, true]) {
        let mut chart = ChartBuilder::on(panel)
            .caption(if docs { "per document" } else { "per pair" }, (font.0, 22))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.3f64..max_k as f64 + 0.3, 0f64..1.02f64)
            .map_err(|x| e(x.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("k (fingerprint bits that may differ)")
            .y_desc("precision / recall")
            .x_labels(max_k as usize + 1)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(11)
            .light_line_style(RGBColor(238, 238, 238))
            .label_style((font.0, 16))
            .axis_desc_style((font.0, 18))
            .draw()
            .map_err(|x| e(x.to_string()))?;
        for (ti, &t) in truths.iter().enumerate() {
            let color = colors[ti % colors.len()];
            let pts = |prec: bool| -> Vec<(f64, f64)> {
                r.simhash
                    .iter()
                    .filter(|x| x.truth == t)
                    .map(|x| {
                        let s = if docs { x.docs } else { x.pairs };
                        (x.k as f64, if prec { s.precision } else { s.recall })
                    })
                    .collect()
            };
            let solid = ShapeStyle::from(&color).stroke_width(3);
            chart
                .draw_series(LineSeries::new(pts(true), solid))
                .map_err(|x| e(x.to_string()))?
                .label(format!("precision, truth J >= {t}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], solid));
            chart
                .draw_series(pts(true).into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(|x| e(x.to_string()))?;
            let light = ShapeStyle::from(&color.mix(0.55)).stroke_width(3);
            chart
                .draw_series(LineSeries::new(pts(false), light))
                .map_err(|x| e(x.to_string()))?
                .label(format!("recall, truth J >= {t}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], light));
            chart
                .draw_series(
                    pts(false)
                        .into_iter()
                        .map(|p| TriangleMarker::new(p, 6, color.mix(0.55).filled())),
                )
                .map_err(|x| e(x.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .label_font((font.0, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(x.to_string()))?;
    }
    root.present().map_err(|x| e(x.to_string()))
}

/// Figure 2: the distribution of the leading 1-bit position of the XOR of successive sorted
/// fingerprints.
pub(crate) fn xor_leading_bit(path: &Path, r: &EvalReport, font: &Font) -> Result<(), DedupError> {
    let e = err(path);
    let total: u64 = r.xor_leading_bit.iter().sum();
    let frac: Vec<f64> = r
        .xor_leading_bit
        .iter()
        .map(|&c| if total == 0 { 0.0 } else { c as f64 / total as f64 })
        .collect();
    let top = frac.iter().copied().fold(0.0, f64::max).max(0.01) * 1.1;
    let root = BitMapBackend::new(path, (1100, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "leading 1-bit of XOR of successive sorted fingerprints ({} distinct)",
                total + 1
            ),
            (font.0, 24),
        )
        .margin(18)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..63.5f64, 0f64..top)
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("bit position (63 = most significant)")
        .y_desc("fraction of successive pairs")
        .x_labels(17)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((font.0, 16))
        .axis_desc_style((font.0, 18))
        .disable_x_mesh()
        .draw()
        .map_err(|x| e(x.to_string()))?;
    chart
        .draw_series(frac.iter().enumerate().map(|(b, &f)| {
            Rectangle::new(
                [(b as f64 - 0.4, 0.0), (b as f64 + 0.4, f)],
                RGBColor(31, 119, 180).filled(),
            )
        }))
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}
