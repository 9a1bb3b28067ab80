//! The figures of a speculative bench: one engine's medians ([`EngineResult`]) with the ratios
//! paired per run ([`Spread`]), the `--onnx` result ([`OnnxBenchResult`]), and their tables.

use crate::cli::args::onnx::head_words;
use anyhow::{Result, bail};
use serde::Serialize;

/// One engine's medians.
#[derive(Clone, Debug, Serialize)]
pub struct EngineResult {
    /// `reference` or `onnxruntime-<ep>` (`onnxruntime-<ep> static` for a `--static-cache` export)
    pub engine: String,
    /// The export folder (ONNX Runtime engines).
    pub onnx: Option<String>,
    /// `L` of a static export's KV buffers.
    pub static_cache: Option<usize>,
    /// The prompt's prefill in the greedy runs, prompt tokens per second (the time to the first
    /// token).
    pub prefill_tokens_per_second: f64,
    pub greedy_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub mean_accepted_length: f64,
    pub ms_per_draft_step: f64,
    pub ms_per_verify_step: f64,
    /// Greedy tokens equal speculative tokens (lossless), in every timed run.
    pub speculative_equals_greedy: bool,
    /// Speculative over greedy tokens/s of this engine, paired within each timed run.
    pub speculative_over_greedy: Spread,
    /// Greedy tokens/s over the first export's in the same timed run (the runs alternate), for
    /// every export after the first; `None` for the first and for the reference.
    pub greedy_over_first_export: Option<Spread>,
    /// The same for the greedy runs' prefill tokens/s.
    pub prefill_over_first_export: Option<Spread>,
}

/// How a ratio measured once per timed run spread over the runs: its median, lowest and highest.
/// Paired within a run, so a machine that slows down between runs moves both sides.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub(super) fn of(xs: &[f64]) -> Spread {
        Spread {
            median: median(xs),
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::fmt::Display for Spread {
    /// `1.04x (0.98-1.09)`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}x ({:.2}-{:.2})", self.median, self.min, self.max)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct OnnxBenchResult {
    pub model: String,
    /// The export folders, comma-separated, in `--onnx` order.
    pub onnx: String,
    pub ep: String,
    pub ep_used: String,
    pub onnxruntime: String,
    pub cpu: String,
    pub m2r2: String,
    pub draft_gate: usize,
    pub draft_len: usize,
    /// `K` of the pruned draft head both engines draft with; `None`: the full head.
    pub draft_head_tokens: Option<usize>,
    pub prompt_len: usize,
    pub decode_tokens: usize,
    pub repeats: usize,
    /// The machine's memory read bandwidth (bytes/s), measured before the engines run.
    pub memory_read_bytes_per_second: f64,
    pub engines: Vec<EngineResult>,
    /// ONNX Runtime's greedy tokens equal the reference's (every export's).
    pub tokens_equal_reference: bool,
}

pub(super) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn print_table(r: &OnnxBenchResult) {
    println!(
        "bench {} on ONNX Runtime {} ({} requested, {} ran) vs the reference",
        r.model, r.onnxruntime, r.ep, r.ep_used
    );
    println!(
        "cpu: {}; memory read bandwidth {:.1} GB/s; export {}; M2R2 weights: {}",
        r.cpu,
        r.memory_read_bytes_per_second / 1e9,
        r.onnx,
        r.m2r2
    );
    println!(
        "prompt {} tokens, decode {} tokens, draft gate {}, {} drafts per round, {}; median of {} runs after 1 warm-up",
        r.prompt_len,
        r.decode_tokens,
        r.draft_gate,
        r.draft_len,
        head_words(r.draft_head_tokens),
        r.repeats
    );
    print_engines(&r.engines);
    println!(
        "  greedy tokens equal to the reference's: {}",
        if r.tokens_equal_reference {
            "yes"
        } else {
            "NO"
        }
    );
}

/// Refuse (after the table is printed) a bench whose equality columns say NO: an engine whose
/// speculative tokens differ from its greedy ones (`lossless`), or ONNX Runtime's greedy tokens
/// differing from the reference's (`tokens_equal_reference`). Its timings are then of unequal
/// work, and a decode that is not lossless is a bug, not a speed.
pub fn check_equalities(engines: &[EngineResult], tokens_equal_reference: bool) -> Result<()> {
    let mut unequal: Vec<String> = engines
        .iter()
        .filter(|e| !e.speculative_equals_greedy)
        .map(|e| {
            format!(
                "lossless NO on {}: its speculative tokens differ from its greedy ones",
                e.engine
            )
        })
        .collect();
    if !tokens_equal_reference {
        unequal.push(
            "greedy tokens equal to the reference's: NO (ONNX Runtime's greedy tokens differ from \
             the reference's)"
                .into(),
        );
    }
    if !unequal.is_empty() {
        bail!(
            "the bench's outputs differ where they must be equal: {}; the timings above are not \
             of the same decode",
            unequal.join("; ")
        );
    }
    Ok(())
}

/// The engines' table rows and the legend; the engine column is as wide as its longest name.
pub fn print_engines(engines: &[EngineResult]) {
    let width = engines
        .iter()
        .map(|e| e.engine.len())
        .max()
        .unwrap_or(0)
        .max(30);
    println!(
        "  {:<width$} {:>14} {:>14} {:>14} {:>10} {:>12} {:>13} {:>9}",
        "engine",
        "prefill tok/s",
        "greedy tok/s",
        "spec tok/s",
        "accepted",
        "ms/draft",
        "ms/verify",
        "lossless"
    );
    for e in engines {
        println!(
            "  {:<width$} {:>14.1} {:>14.1} {:>14.1} {:>10.2} {:>12.2} {:>13.2} {:>9}",
            e.engine,
            e.prefill_tokens_per_second,
            e.greedy_tokens_per_second,
            e.speculative_tokens_per_second,
            e.mean_accepted_length,
            e.ms_per_draft_step,
            e.ms_per_verify_step,
            if e.speculative_equals_greedy {
                "yes"
            } else {
                "NO"
            }
        );
    }
    print_spreads(engines, width);
    println!(
        "  (prefill: the prompt's in the greedy runs, the time to the first token; accepted: tokens \
         emitted per verification; ms/draft: one token through draft.onnx or the reference's lower \
         layers with the fast stream; ms/verify: one verify chunk)"
    );
    println!(
        "  (a fixed chain on a pseudo-random prompt: it prices the steps, not the default \
         drafting's speed-up on text, which scripts/bench_speculative.py measures on real prompts)"
    );
}

/// The ratios paired within each timed run, median (lowest-highest): what a side-by-side
/// comparison should quote on a noisy machine. The second column only with several exports.
fn print_spreads(engines: &[EngineResult], width: usize) {
    let exports: Vec<&EngineResult> = engines.iter().filter(|e| e.onnx.is_some()).collect();
    let several = exports.len() > 1;
    let mut header = format!(
        "  {:<width$} {:>22}",
        "ratios paired per run", "spec / greedy"
    );
    if several {
        header.push_str(&format!(
            " {:>26} {:>26}",
            "greedy / first export", "prefill / first export"
        ));
    }
    println!("{header}");
    for e in engines {
        let mut row = format!(
            "  {:<width$} {:>22}",
            e.engine,
            e.speculative_over_greedy.to_string()
        );
        if several {
            let show = |s: Option<Spread>| s.map_or("-".into(), |s| s.to_string());
            let (greedy, prefill) = (
                show(e.greedy_over_first_export),
                show(e.prefill_over_first_export),
            );
            row.push_str(&format!(" {greedy:>26} {prefill:>26}"));
        }
        println!("{row}");
    }
    let mut legend = "  (median (lowest-highest) of one ratio per timed run".to_string();
    if several {
        legend.push_str(&format!("; first export: {}", exports[0].engine));
    }
    println!("{legend})");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::spec_bench::summarise;

    fn engine(name: &str, lossless: bool) -> EngineResult {
        EngineResult {
            speculative_equals_greedy: lossless,
            ..summarise(name.into(), &[])
        }
    }

    /// Every NO of the table fails the bench, named; all yes passes.
    #[test]
    fn a_no_in_an_equality_column_fails_the_bench() {
        let (reference, export) = (engine("reference", true), engine("onnxruntime-cpu", true));
        assert!(check_equalities(&[reference.clone(), export.clone()], true).is_ok());
        let lossy = engine("onnxruntime-cpu", false);
        let e = check_equalities(&[reference.clone(), lossy], true).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("lossless NO on onnxruntime-cpu"), "{text}");
        assert!(!text.contains("reference's: NO"), "{text}");
        let e = check_equalities(&[reference, export], false).unwrap_err();
        assert!(
            e.to_string()
                .contains("greedy tokens equal to the reference's: NO"),
            "{e}"
        );
        // the reference alone (`bench --speculative`)
        assert!(check_equalities(&[engine("reference", false)], true).is_err());
    }
}
