//! What `m2r2 train` prints: what is trained, the progress bar of the steps, the per-gate summary
//! of a window of steps (loss, alignment, agreement), and the held-out table at the end.

use crate::cli::progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::Path;
use train::trainer::{GateStats, StepLog, Trainer};

/// The trained gates and parameters (with `bridge_only`: the bridge's alone).
pub fn what_is_trained(trainer: &Trainer) -> String {
    let gates = &trainer.options.train_gates;
    if trainer.options.bridge_only {
        let maps = trainer
            .gates
            .iter()
            .flat_map(|g| g.adapters.bridge.values());
        let params: usize = maps.map(|p| p.a.len() + p.b.len()).sum();
        format!(
            "training only the bridge (gate {gates:?}; adapters frozen), {params} bridge parameters"
        )
    } else {
        let params: usize = trainer.gates.iter().map(|g| g.adapters.len()).sum();
        format!("training gates {gates:?}, {params} adapter parameters")
    }
}

/// Each gate's statistics pooled over a window of logged steps (at least one).
pub fn window_mean(window: &[StepLog]) -> Vec<GateStats> {
    let mut mean: Vec<GateStats> = window[0]
        .gates
        .iter()
        .map(|g| GateStats {
            gate: g.gate,
            ..GateStats::default()
        })
        .collect();
    for log in window {
        for (m, g) in mean.iter_mut().zip(&log.gates) {
            m.add(g);
        }
    }
    mean
}

/// The `--eval-data` table: each gate's KL and agreement before and after training.
pub fn print_held_out(dir: &Path, before: &[GateStats], after: &[GateStats]) {
    println!("held-out data {}:", dir.display());
    println!("| gate | rows | KL before | KL after | agreement before | agreement after |");
    println!("|---|---|---|---|---|---|");
    for (b, a) in before.iter().zip(after) {
        println!(
            "| {} | {} | {:.4} | {:.4} | {:.3} | {:.3} |",
            a.gate,
            a.rows,
            b.kl,
            a.kl,
            b.agreement(),
            a.agreement()
        );
    }
}

pub fn gate_summary(stats: &[GateStats]) -> String {
    stats
        .iter()
        .map(|s| {
            let align = match s.align {
                0.0 => String::new(),
                a => format!(" align {a:.4}"),
            };
            format!(
                "g{} kl {:.4}{align} agree {:.3}",
                s.gate,
                s.kl,
                s.agreement()
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

pub fn step_bar(total: u64) -> ProgressBar {
    if !progress::enabled() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("train [{bar:24}] {pos}/{len} {per_sec} eta {eta} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}
