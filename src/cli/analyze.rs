//! `m2r2 analyze`: the paper's motivation measured on a model. Per layer of the slow stream, how
//! much the residual turns (`cos(s_{l-1}, s_l)`), how well it already points at the final residual
//! (`cos(s_l, s_N)`) and how often exiting there would emit the final greedy token; per gate the
//! same for the fast stream next to the slow one; and (feature `linalg`) a 2-D PCA view of the
//! residual trajectory. The numbers come from `reference::analyze`; docs/ANALYZE.md explains them.

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::model::{ModelArgs, PromptArgs};
use crate::cli::common;
use anyhow::{Context, Result};
use reference::analyze::{Dynamics, Stats, residual_dynamics};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why the PCA view is missing from a build without the `linalg` feature.
#[cfg(not(feature = "linalg"))]
const PCA_UNAVAILABLE: &str = "the PCA view needs a build with `--features linalg` \
    (LAPACK through the system OpenBLAS: apt-get install libopenblas-dev)";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// M2R2 weights folder, or `none` for zero adapters (default: the model's built-in weights:
    /// seeded random for tiny / tiny-moe, trained for smollm2, zeros otherwise)
    #[arg(long, value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// Also draw the curves over depth (and the PCA view) as an SVG file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The residual trajectory of one position (or of the mean over positions) in its top-2 PCA axes.
struct PcaView {
    /// `last_position` or `mean_over_positions`
    key: &'static str,
    title: String,
    explained_variance_ratio: [f64; 2],
    /// `N + 1` points: `s_0..s_N`
    slow: Vec<[f64; 2]>,
    /// one point per gate: `u_g`
    fast: Vec<[f64; 2]>,
}

pub fn run(args: &Args) -> Result<()> {
    // the plot's path first, as `logits --out` does: an unwritable path fails before the work
    if let Some(path) = &args.plot {
        common::check_plot(path)?;
    }
    let loaded = common::load(&args.model.model)?;
    let tokens = common::prompt_tokens(&loaded, &args.prompt)?;
    let config = &loaded.model.config;
    let m2r2 = M2r2Args::weights_only(args.m2r2.clone());
    let weights = m2r2.weights(&loaded)?;
    let weights_source = m2r2.source(&loaded);

    let start = Instant::now();
    let dynamics =
        residual_dynamics(&loaded.model, &weights, &tokens).map_err(common::prompt_only)?;
    eprintln!(
        "analysed {} positions x {} layers and {} gates in {:.2} s",
        tokens.len(),
        config.num_hidden_layers,
        dynamics.gates.len(),
        start.elapsed().as_secs_f64()
    );
    let pca = pca_views(&dynamics);
    if let Err(reason) = &pca {
        eprintln!("note: no PCA view: {reason}");
    }
    if let Some(path) = &args.plot {
        let written = plot(path, &dynamics, pca.as_deref().ok())
            .with_context(|| format!("cannot write the plot {}", path.display()))?;
        eprintln!("wrote {written}");
    }

    let report = json!({
        "model": loaded.name,
        "source": loaded.source,
        "tokens": tokens,
        "positions": tokens.len(),
        "num_layers": config.num_hidden_layers,
        "m2r2": {
            "weights": weights_source,
            "gates": weights.config.gates,
            "zero_adapters": weights.accelerator.is_zero(),
        },
        "final_tokens": dynamics.final_tokens,
        "layers": serde_json::to_value(&dynamics.layers)?,
        "gates": serde_json::to_value(&dynamics.gates)?,
        "saturation_layer": {
            "mean": dynamics.mean_saturation_layer(),
            "per_position": dynamics.saturation_layer,
        },
        "pca": match &pca {
            Ok(views) => Value::Object(views.iter().map(|v| (v.key.to_string(), json!({
                "title": v.title,
                "explained_variance_ratio": v.explained_variance_ratio,
                "slow": v.slow,
                "fast": v.fast.iter().zip(&dynamics.gates).map(|(xy, g)| json!({
                    "gate": g.gate, "layer": g.layer, "xy": xy,
                })).collect::<Vec<_>>(),
            }))).collect()),
            Err(_) => Value::Null,
        },
        "pca_unavailable": pca.as_ref().err(),
        "plot": args.plot.as_ref().map(|p| p.display().to_string()),
    });
    if args.json {
        common::print_json(&report)?;
    } else {
        print_text(&report, &dynamics, pca.as_deref().ok());
    }
    Ok(())
}

/// The PCA views of the last position's trajectory and of the mean trajectory, or why there are
/// none.
#[cfg(feature = "linalg")]
fn pca_views(d: &Dynamics) -> Result<Vec<PcaView>, String> {
    use reference::analyze::pca_2d;
    let last = d.tokens.len() - 1;
    let views = [
        (
            "last_position",
            format!("last position (t = {last})"),
            &d.last_trajectory,
            &d.last_exit_states,
        ),
        (
            "mean_over_positions",
            "mean over positions".to_string(),
            &d.mean_trajectory,
            &d.mean_exit_states,
        ),
    ];
    let points = |a: ndarray::Array2<f64>| a.outer_iter().map(|r| [r[0], r[1]]).collect();
    views
        .into_iter()
        .map(|(key, title, trajectory, exits)| {
            let pca = pca_2d(trajectory.view()).map_err(|e| e.to_string())?;
            Ok(PcaView {
                key,
                title,
                explained_variance_ratio: pca.explained_variance_ratio,
                fast: points(pca.project(exits.view())),
                slow: points(pca.coords),
            })
        })
        .collect()
}

#[cfg(not(feature = "linalg"))]
fn pca_views(_: &Dynamics) -> Result<Vec<PcaView>, String> {
    Err(PCA_UNAVAILABLE.to_string())
}

fn stats(s: &Stats) -> String {
    format!("{:.3} [{:.3}, {:.3}]", s.mean, s.min, s.max)
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn print_text(report: &Value, d: &Dynamics, pca: Option<&[PcaView]>) {
    let n = d.layers.len();
    println!(
        "{}: {} positions, {} layers; M2R2 weights {}, gates after layers {}",
        report["model"].as_str().unwrap_or(""),
        d.tokens.len(),
        n,
        report["m2r2"]["weights"].as_str().unwrap_or(""),
        report["m2r2"]["gates"]
    );
    println!();
    println!(
        "slow stream, per layer l (cosines: mean [min, max] over positions; FN = the final RMSNorm)"
    );
    println!(
        "{:>5}  {:<26} {:<26} {:<26} {:>9}",
        "layer", "cos(s_{l-1}, s_l)", "cos(s_l, s_N)", "cos(FN(s_l), FN(s_N))", "exit agr."
    );
    for row in &d.layers {
        println!(
            "{:>5}  {:<26} {:<26} {:<26} {:>9}",
            row.layer,
            stats(&row.cos_prev),
            stats(&row.cos_final),
            stats(&row.cos_final_normed),
            percent(row.exit_agreement)
        );
    }
    println!(
        "first layer from which the exit token stays the final one: mean {:.2} of {n}",
        d.mean_saturation_layer()
    );
    println!();
    println!("fast stream at the gates (slow s_e at the gate's layer -> fast u_g)");
    println!(
        "{:>4} {:>5}  {:<26} {:<26} {:<26} cos(u_g, s_e)",
        "gate", "layer", "cos(., s_N) mean", "cos(FN(.), FN(s_N)) mean", "exit agreement",
    );
    let gain = |slow: f64, fast: f64| format!("{slow:.3} -> {fast:.3} ({:+.3})", fast - slow);
    for g in &d.gates {
        println!(
            "{:>4} {:>5}  {:<26} {:<26} {:<26} {}",
            g.gate,
            g.layer,
            gain(g.slow_cos_final.mean, g.fast_cos_final.mean),
            gain(g.slow_cos_final_normed.mean, g.fast_cos_final_normed.mean),
            format!(
                "{} -> {} ({:+.1})",
                percent(g.slow_exit_agreement),
                percent(g.fast_exit_agreement),
                100.0 * (g.fast_exit_agreement - g.slow_exit_agreement)
            ),
            stats(&g.cos_fast_slow)
        );
    }
    println!();
    match pca {
        None => println!(
            "PCA view: {}",
            report["pca_unavailable"].as_str().unwrap_or("")
        ),
        Some(views) => {
            println!("PCA of the slow trajectory s_0..s_N (2-D coordinates in --json)");
            for v in views {
                let [a, b] = v.explained_variance_ratio;
                println!(
                    "  {:<28} explained variance {} + {} = {}",
                    v.title,
                    percent(a),
                    percent(b),
                    percent(a + b)
                );
            }
        }
    }
}

/// Draw the curves over depth (and, with PCA views, one panel per view below them) into `path`.
/// Returns a description of what was written.
fn plot(path: &Path, d: &Dynamics, pca: Option<&[PcaView]>) -> Result<String> {
    use plotters::element::DashedPathElement;
    use plotters::prelude::*;
    const BLUE_: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
    const RED_: RGBColor = RGBColor(0xd6, 0x27, 0x28);
    const GREEN_: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
    const ORANGE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
    const GREY: RGBColor = RGBColor(0x70, 0x70, 0x70);
    let height = if pca.is_some() { 900 } else { 450 };
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(450);

    // Panel 1: the curves over depth, fast-stream points at the gates; the legend in a strip on the
    // right, so it never hides a curve.
    let (curves_area, legend_area) = top.split_horizontally(860);
    let n = d.layers.len();
    let lowest = d
        .layers
        .iter()
        .flat_map(|r| [r.cos_prev.mean, r.cos_final.mean, r.cos_final_normed.mean])
        .chain(
            d.gates
                .iter()
                .flat_map(|g| [g.fast_cos_final.mean, g.fast_cos_final_normed.mean]),
        )
        .fold(0.0f64, f64::min)
        - 0.05;
    let mut chart = ChartBuilder::on(&curves_area)
        .caption(
            format!(
                "residual dynamics over depth ({} positions)",
                d.tokens.len()
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.5..n as f64 + 0.5, lowest..1.05f64)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_labels(n.min(16))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc("layer l (dashed: exit gates)")
        .y_desc("cosine / fraction")
        .draw()?;
    chart.draw_series(d.gates.iter().map(|g| {
        let x = g.layer as f64;
        DashedPathElement::new(vec![(x, lowest), (x, 1.05)], 6, 4, GREY.mix(0.6))
    }))?;
    // (value, colour, legend) per curve and per kind of gate mark.
    type Curve<Row> = (fn(&Row) -> f64, RGBColor, &'static str);
    let curves: [Curve<reference::analyze::LayerRow>; 4] = [
        (
            |r| r.cos_prev.mean,
            BLUE_,
            "cos(s_{l-1}, s_l): direction change",
        ),
        (
            |r| r.cos_final.mean,
            RED_,
            "cos(s_l, s_N): alignment with final",
        ),
        (
            |r| r.cos_final_normed.mean,
            ORANGE,
            "cos(FN(s_l), FN(s_N)): after final norm",
        ),
        (
            |r| r.exit_agreement,
            GREEN_,
            "exit agreement with final token",
        ),
    ];
    for (f, color, _) in curves {
        let points: Vec<(f64, f64)> = d.layers.iter().map(|r| (r.layer as f64, f(r))).collect();
        chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    let marks: [Curve<reference::analyze::GateRow>; 3] = [
        (|g| g.fast_cos_final.mean, RED_, "fast u_g: cos(u_g, s_N)"),
        (
            |g| g.fast_cos_final_normed.mean,
            ORANGE,
            "fast u_g: cos(FN(u_g), FN(s_N))",
        ),
        (
            |g| g.fast_exit_agreement,
            GREEN_,
            "fast u_g: exit agreement",
        ),
    ];
    for (f, color, _) in marks {
        chart.draw_series(d.gates.iter().map(|g| {
            let p = (g.layer as f64, f(g));
            EmptyElement::at(p) + Cross::new((0, 0), 7, color.stroke_width(3))
        }))?;
    }
    let font = |size: u32, color: &RGBColor| ("sans-serif", size).into_font().color(color);
    let mut y = 50;
    legend_area.draw(&Text::new(
        "slow stream (mean over positions)",
        (5, y - 25),
        font(14, &BLACK),
    ))?;
    for (_, color, label) in curves {
        legend_area.draw(&PathElement::new(
            vec![(5, y), (30, y)],
            color.stroke_width(2),
        ))?;
        legend_area.draw(&Circle::new((17, y), 3, color.filled()))?;
        legend_area.draw(&Text::new(label, (38, y - 7), font(13, &BLACK)))?;
        y += 24;
    }
    y += 30;
    legend_area.draw(&Text::new(
        "fast stream at the gates",
        (5, y - 25),
        font(14, &BLACK),
    ))?;
    for (_, color, label) in marks {
        legend_area.draw(&Cross::new((17, y), 6, color.stroke_width(3)))?;
        legend_area.draw(&Text::new(label, (38, y - 7), font(13, &BLACK)))?;
        y += 24;
    }

    // Panels 2, 3: PCA views, the slow trajectory as a line and the fast exit states as crosses.
    if let Some(views) = pca {
        let panels = bottom.split_evenly((1, views.len()));
        for (area, v) in panels.iter().zip(views) {
            let all: Vec<[f64; 2]> = v.slow.iter().chain(&v.fast).copied().collect();
            let range = |k: usize| {
                let lo = all.iter().map(|p| p[k]).fold(f64::INFINITY, f64::min);
                let hi = all.iter().map(|p| p[k]).fold(f64::NEG_INFINITY, f64::max);
                let pad = 0.08 * (hi - lo).max(1e-9);
                (lo - pad)..(hi + pad)
            };
            let [a, b] = v.explained_variance_ratio;
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!(
                        "PCA of s_0..s_N, {} ({}, {})",
                        v.title,
                        percent(a),
                        percent(b)
                    ),
                    ("sans-serif", 17),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d(range(0), range(1))?;
            chart
                .configure_mesh()
                .light_line_style(TRANSPARENT)
                .x_desc("PC 1   (blue: slow s_l, labelled l; red: fast exit states u_g)")
                .y_desc("PC 2")
                .draw()?;
            let slow: Vec<(f64, f64)> = v.slow.iter().map(|p| (p[0], p[1])).collect();
            chart.draw_series(LineSeries::new(slow.clone(), BLUE_.stroke_width(2)))?;
            // Every layer labelled on short trajectories; on long ones every 5th, the gates' and N.
            let labelled = |l: usize| {
                n <= 12 || l.is_multiple_of(5) || l == n || d.gates.iter().any(|g| g.layer == l)
            };
            chart.draw_series(slow.iter().enumerate().map(|(l, &p)| {
                let label = if labelled(l) {
                    l.to_string()
                } else {
                    String::new()
                };
                EmptyElement::at(p)
                    + Circle::new((0, 0), 3, BLUE_.filled())
                    + Text::new(label, (4, -15), font(12, &GREY))
            }))?;
            chart.draw_series(v.fast.iter().zip(&d.gates).map(|(p, g)| {
                EmptyElement::at((p[0], p[1]))
                    + Cross::new((0, 0), 7, RED_.stroke_width(3))
                    + Text::new(format!("u{}", g.gate), (7, 3), font(13, &RED_))
            }))?;
        }
    }
    root.present()?;
    Ok(match pca {
        Some(_) => format!("{} (curves over depth and PCA views)", path.display()),
        None => format!("{} (curves over depth; no PCA view)", path.display()),
    })
}
