//! The ahead-of-time expert loading report (docs/MOE_AOT.md) that `m2r2 moe-sim` prints and
//! `m2r2 demo` shows for MoE models: greedily decode `--steps` tokens with the base model while the
//! fast stream runs alongside, record which experts every MoE layer used and what each predictor
//! guessed (`reference::moe_aot::expert_prefetch`), then simulate a device cache fed from host
//! memory (`reference::moe_aot::memory_sim`) for each policy, at the chosen capacity and bandwidth
//! and over a sweep. docs/MOE_AOT.md explains the model and the report.
//! The flags are checked first (`moe_checks.rs`).

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::moe_sim::MoeSimArgs;
use crate::cli::common;
use crate::cli::moe_checks::{check_config, check_context, check_flags};
use anyhow::{Context, Result, bail};
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use reference::moe_aot::expert_prefetch::{ExpertTrace, Predictor, collect_trace};
use reference::moe_aot::memory_sim::{CapacityScope, SimParams, SimResult, compare};
use reference::moe_aot::sweep::{
    Deployment, SweepPoint, Timing, default_capacities, expert_bytes, layer_times,
    mixtral_8x7b_config, split_measured, sweep,
};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

/// Trace, simulate and print for a model already loaded (`args.model` is not read).
pub fn run_loaded(args: &MoeSimArgs, loaded: &LoadedModel) -> Result<()> {
    check_flags(args)?;
    let config = &loaded.model.config;
    let cache = check_config(args, config, &loaded.name)?;
    let prompt = common::prompt_tokens(loaded, &args.prompt)?;
    check_context(args, prompt.len(), config, &loaded.name)?;
    let flags = M2r2Args::weights_only(args.m2r2.clone());
    let weights = flags.weights(loaded)?;

    let deployment = Deployment {
        host_bandwidth: args.bandwidth_gbps * 1e9,
        latency: args.latency_us * 1e-6,
        device_bandwidth: args.device_gbps * 1e9,
        flops: args.tflops * 1e12,
        bytes_per_param: args.bytes_per_param,
    };
    let timing_config = match args.timing {
        Timing::Model | Timing::Measured => config.clone(),
        Timing::Mixtral8x7b => {
            mixtral_8x7b_config(config.num_hidden_layers, cache.num_experts, cache.top_k)
        }
    };
    // Adapter terms only when the times come from the traced model itself.
    let adapters = (args.timing == Timing::Model).then_some(&weights);
    let last_gate = weights.config.gate_layer(weights.config.num_gates());
    let position = prompt.len() + args.steps / 2;
    let mut params = SimParams {
        capacity: cache.capacity,
        scope: cache.scope,
        eviction: args.eviction,
        expert_bytes: expert_bytes(&timing_config, &deployment),
        bandwidth: deployment.host_bandwidth,
        latency: deployment.latency,
        compute: layer_times(&timing_config, None, None, position, &deployment),
        fast_compute: layer_times(
            &timing_config,
            adapters,
            Some(last_gate),
            position,
            &deployment,
        ),
        warmup_tokens: args.warmup,
    };
    if !params.expert_bytes.is_finite() {
        bail!(
            "--bytes-per-param {} makes one expert of {} sizes larger than any finite number of bytes",
            args.bytes_per_param,
            args.timing.name()
        );
    }

    let start = Instant::now();
    let decoded = collect_trace(M2r2::new(&loaded.model, &weights), &prompt, args.steps)
        .context("cannot trace the experts")?;
    let trace = &decoded.trace;
    eprintln!(
        "traced {} decoded tokens x {} MoE layers in {:.2} s",
        trace.steps.len(),
        trace.moe_layers().len(),
        start.elapsed().as_secs_f64()
    );

    if args.timing == Timing::Measured {
        // Measured with the fast row in the gated layers: every policy is charged the same.
        params.compute = split_measured(&decoded.layer_seconds, &params.compute);
        params.fast_compute = params.compute.clone();
    }
    let results = compare(trace, &args.policy, &params)?;
    let capacities = args
        .sweep_capacities
        .clone()
        .unwrap_or_else(|| default_capacities(cache.top_k, cache.total));
    let bandwidths = args
        .sweep_bandwidths
        .clone()
        .unwrap_or_else(|| vec![args.bandwidth_gbps]);
    let points = sweep(trace, &args.policy, &params, &capacities, &bandwidths)
        .context("cannot run the sweep")?;
    let scope = cache.scope;
    if let Some(path) = &args.plot {
        let title = format!("{} ({} sizes)", loaded.name, args.timing.name());
        plot(path, &points, &args.policy, &bandwidths, &title, scope)
            .with_context(|| format!("cannot write the plot {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }

    let us = |s: f64| s * 1e6;
    let report = json!({
        "model": loaded.name,
        "source": loaded.source,
        "prompt_tokens": prompt,
        "tokens": decoded.tokens,
        "steps": args.steps,
        "m2r2": {
            "weights": flags.source(loaded),
            "gates": weights.config.gates,
            "zero_adapters": weights.accelerator.is_zero(),
        },
        "trace": {
            "num_layers": trace.num_layers,
            "moe_layers": trace.moe_layers(),
            "num_experts": trace.num_experts,
            "top_k": trace.top_k,
        },
        "deployment": {
            "timing": args.timing.name(),
            "host_bandwidth_gbps": args.bandwidth_gbps,
            "latency_us": args.latency_us,
            "device_bandwidth_gbps": args.device_gbps,
            "tflops": args.tflops,
            "bytes_per_param": args.bytes_per_param,
            "expert_bytes": params.expert_bytes,
            "transfer_us": us(params.transfer_seconds()),
            "layer_pre_us": params.compute.iter().map(|t| us(t.pre)).collect::<Vec<_>>(),
            "layer_moe_us": params.compute.iter().map(|t| us(t.moe)).collect::<Vec<_>>(),
            "fast_layer_pre_us": params.fast_compute.iter().map(|t| us(t.pre)).collect::<Vec<_>>(),
        },
        "params": {
            "capacity": cache.capacity,
            "capacity_scope": scope,
            "total_experts": cache.total,
            "eviction": args.eviction,
            "warmup_tokens": args.warmup,
        },
        "policies": serde_json::to_value(&results)?,
        "sweep": {
            "capacities": capacities,
            "bandwidths_gbps": bandwidths,
            "points": serde_json::to_value(&points)?,
        },
        "plot": args.plot.as_ref().map(|p| p.display().to_string()),
    });
    if args.json {
        common::print_json(&report)?;
    } else {
        print_text(&report, trace, &results, &points);
    }
    Ok(())
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn optional_percent(x: Option<f64>) -> String {
    x.map_or("-".into(), percent)
}

/// Bytes as [`common::bytes`] writes them (`36.9 kB`, `352.3 MB`), and sizes out of its range
/// (from `--bytes-per-param`, or fractions of a byte wasted by a cancelled copy) with a precision:
/// `0.5 B`, `1.84e-26 B`, `3.52 TB`, `3.52e20 B`.
fn byte_size(n: f64) -> String {
    match n {
        0.0 => "0 B".into(),
        n if (1e3..1e12).contains(&n) => common::bytes(n),
        n if (1e12..1e15).contains(&n) => format!("{:.2} TB", n / 1e12),
        n if (1.0..1e3).contains(&n) && n.fract() == 0.0 => format!("{n} B"),
        n if (0.1..1e3).contains(&n) => format!("{n:.1} B"),
        n => format!("{n:.2e} B"),
    }
}

/// Seconds as the most readable unit.
fn duration(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.3} ms", s * 1e3),
        s => format!("{:.2} us", s * 1e6),
    }
}

fn print_text(report: &Value, trace: &ExpertTrace, results: &[SimResult], points: &[SweepPoint]) {
    let d = &report["deployment"];
    let p = &report["params"];
    println!(
        "{}: {} decoded tokens, {} MoE layers x {} experts, top-{}; M2R2 weights {}, gates {}",
        report["model"].as_str().unwrap_or(""),
        trace.steps.len(),
        trace.moe_layers().len(),
        trace.num_experts,
        trace.top_k,
        report["m2r2"]["weights"].as_str().unwrap_or(""),
        report["m2r2"]["gates"],
    );
    println!(
        "sizes: {}; expert {}; transfer {:.1} us ({} GB/s + {} us); capacity {} experts ({}) of {}; \
         eviction {}; {} warm-up tokens",
        d["timing"].as_str().unwrap_or(""),
        byte_size(d["expert_bytes"].as_f64().unwrap_or(0.0)),
        d["transfer_us"].as_f64().unwrap_or(0.0),
        d["host_bandwidth_gbps"],
        d["latency_us"],
        p["capacity"],
        p["capacity_scope"].as_str().unwrap_or(""),
        p["total_experts"],
        p["eviction"].as_str().unwrap_or(""),
        p["warmup_tokens"],
    );
    println!();
    println!(
        "{:<10} {:>8} {:>8} {:>9} {:>8} {:>9} {:>7} {:>11} {:>12} {:>12} {:>8}",
        "policy",
        "hit",
        "cached",
        "precision",
        "recall",
        "prefetch",
        "demand",
        "wasted",
        "stall/token",
        "time/token",
        "speedup"
    );
    for r in results {
        println!(
            "{:<10} {:>8} {:>8} {:>9} {:>8} {:>9} {:>7} {:>11} {:>12} {:>12} {:>7.2}x",
            r.policy,
            percent(r.hit_rate),
            percent(r.cache_hit_rate),
            optional_percent(r.precision),
            optional_percent(r.recall),
            r.prefetches,
            r.demand_loads,
            byte_size(r.wasted_bytes),
            duration(r.stall_per_token_seconds),
            duration(r.time_per_token_seconds),
            r.speedup_over_lazy.unwrap_or(f64::NAN),
        );
    }
    for r in results.iter().filter(|r| r.precision.is_some()) {
        println!();
        println!("{} per MoE layer", r.policy);
        println!(
            "{:>5} {:>8} {:>9} {:>8} {:>12}",
            "layer", "hit", "precision", "recall", "stall/token"
        );
        for row in &r.layers {
            println!(
                "{:>5} {:>8} {:>9} {:>8} {:>12}",
                row.layer,
                percent(row.hits as f64 / row.accesses as f64),
                optional_percent(row.precision),
                optional_percent(row.recall),
                duration(row.stall_seconds / r.tokens as f64),
            );
        }
    }
    println!();
    println!("sweep: speedup over lazy (hit rate) per capacity");
    let policies: Vec<&str> = results.iter().map(|r| r.policy.as_str()).collect();
    print!("{:>9} {:>8}", "GB/s", "capacity");
    for name in &policies {
        print!(" {name:>17}");
    }
    println!();
    for chunk in points.chunks(policies.len()) {
        print!("{:>9} {:>8}", chunk[0].bandwidth_gbps, chunk[0].capacity);
        for point in chunk {
            print!(
                " {:>17}",
                format!(
                    "{:.2}x ({})",
                    point.speedup_over_lazy,
                    percent(point.hit_rate)
                )
            );
        }
        println!();
    }
}

/// Hit rate and speedup over lazy against capacity, one colour per policy; bandwidths after the
/// first are dashed.
fn plot(
    path: &Path,
    points: &[SweepPoint],
    policies: &[Predictor],
    bandwidths: &[f64],
    title: &str,
    scope: CapacityScope,
) -> Result<()> {
    use plotters::prelude::*;
    const COLOURS: [RGBColor; 4] = [
        RGBColor(0x70, 0x70, 0x70), // lazy
        RGBColor(0x1f, 0x77, 0xb4), // next-gate
        RGBColor(0xd6, 0x27, 0x28), // m2r2
        RGBColor(0x2c, 0xa0, 0x2c), // oracle
    ];
    let colour = |p: Predictor| COLOURS[Predictor::ALL.iter().position(|&q| q == p).unwrap_or(0)];
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 2));
    let max_capacity = points.iter().map(|p| p.capacity).max().unwrap_or(1) as f64;
    let max_speedup = points
        .iter()
        .map(|p| p.speedup_over_lazy)
        .fold(1.0f64, f64::max);
    let capacity_axis = match scope {
        CapacityScope::Global => "device capacity (experts, all layers)",
        CapacityScope::PerLayer => "device capacity (experts per layer)",
    };
    let styles = bandwidths
        .iter()
        .zip(
            ["solid", "dashed", "dotted"]
                .iter()
                .chain(std::iter::repeat(&"dotted")),
        )
        .map(|(b, style)| format!("{b} GB/s {style}"))
        .collect::<Vec<_>>()
        .join(", ");
    type Metric = fn(&SweepPoint) -> f64;
    let metrics: [(&str, Metric, f64); 2] = [
        ("hit rate", |p| p.hit_rate, 1.05),
        (
            "speedup over lazy",
            |p| p.speedup_over_lazy,
            max_speedup * 1.1,
        ),
    ];
    for (area, (name, metric, top)) in panels.iter().zip(metrics) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}: {name}"), ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..max_capacity * 1.02, 0.0..top)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .x_desc(format!("{capacity_axis}; host link {styles}"))
            .y_desc(name)
            .draw()?;
        for (b, &bandwidth) in bandwidths.iter().enumerate() {
            for &policy in policies {
                let series: Vec<(f64, f64)> = points
                    .iter()
                    .filter(|p| p.policy == policy.name() && p.bandwidth_gbps == bandwidth)
                    .map(|p| (p.capacity as f64, metric(p)))
                    .collect();
                let c = colour(policy);
                // Solid for the first bandwidth, then dashed, then dotted; only solid in the legend.
                let (dash, gap) = [(0, 0), (9, 5), (2, 4)][b.min(2)];
                if dash == 0 {
                    chart
                        .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))?
                        .label(policy.name())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                        });
                } else {
                    chart.draw_series(DashedLineSeries::new(
                        series.clone(),
                        dash,
                        gap,
                        c.stroke_width(2),
                    ))?;
                }
                chart.draw_series(series.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
