//! What `m2r2 train` prints as it goes: the progress bar of the steps and the per-gate summary of
//! a window of steps (loss, alignment, agreement).

use crate::cli::progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use train::trainer::GateStats;

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
