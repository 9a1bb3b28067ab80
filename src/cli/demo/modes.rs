//! The demo's M2R2 section: greedy, early exit and self-speculation side by side on the built-in
//! models, with the lossless properties checked.

use super::{Demo, PROMPT};
use crate::cli::common;
use anyhow::Result;
use reference::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use reference::decode::mode::{DecodeRequest, M2r2Settings, Mode, ModeDetails, ModeRun, run_mode};
use reference::decode::speculative::DraftLength;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

/// Tokens decoded per model in the M2R2 section.
const M2R2_TOKENS: usize = 32;

/// Greedy, early exit and self-speculation side by side on the built-in models with their built-in
/// M2R2 weights, with the lossless properties checked: speculative tokens equal greedy tokens, and
/// the `exact` early-exit cache equals the base model's.
pub(super) fn m2r2_modes(demo: &mut Demo) -> Result<()> {
    println!(
        "  {M2R2_TOKENS} tokens after {PROMPT:?}; built-in M2R2 weights; early exit: arla gate, \
         exact KV; speculative: draft gate 1"
    );
    println!(
        "  {:<9} {:<22} {:>9} {:>10} {:>8} {:>9} {:>10} {:>9}",
        "model", "mode", "= greedy", "layers/tok", "emit at", "accepted", "FLOPs/tok", "tokens/s"
    );
    println!(
        "  (layers/tok: slow layers computed per decoded token, deferred exact layers and \
         rejected drafts included; emit at: mean layer a decoded token was emitted after)"
    );
    for name in reference::io::builtin::BUILTIN_NAMES {
        let loaded = common::load(name)?;
        let weights = M2r2Weights::builtin_for(name, &loaded.model.config)?;
        let prompt = loaded.tokenizer()?.encode(PROMPT, true)?;
        let threshold = weights.config.arla.threshold;
        let settings = |mode, draft_length| M2r2Settings {
            mode,
            source: "builtin".into(),
            gates: weights.config.gates.clone(),
            gate: GateKind::Arla,
            threshold,
            gate_thresholds: None,
            kv_policy: KvPolicy::Exact,
            draft_gate: 1,
            draft_length,
            draft_head_tokens: None,
        };
        let request = DecodeRequest {
            prompt: &prompt,
            max_new_tokens: M2R2_TOKENS,
            stop_tokens: vec![],
            sampling: None,
        };
        let dynamic = DraftLength::Dynamic {
            max: 4,
            gate: GateKind::Arla,
            threshold,
        };
        let runs = [
            ("greedy", settings(Mode::Greedy, DraftLength::Fixed(4))),
            (
                "early-exit",
                settings(Mode::EarlyExit, DraftLength::Fixed(4)),
            ),
            (
                "speculative, 4 drafts",
                settings(Mode::Speculative, DraftLength::Fixed(4)),
            ),
            ("speculative, dynamic", settings(Mode::Speculative, dynamic)),
        ];
        let mut done: Vec<(&str, ModeRun)> = Vec::new();
        for (label, settings) in runs {
            let run = run_mode(
                &loaded.model,
                &weights,
                &settings,
                &request,
                false,
                &mut |_| {},
            )?;
            done.push((label, run));
        }
        let greedy = done[0].1.tokens.clone();
        for (label, run) in &done {
            let accepted = match &run.details {
                ModeDetails::Speculative {
                    mean_accepted_tokens,
                    ..
                } => format!("{mean_accepted_tokens:.2}"),
                _ => "-".into(),
            };
            let decoded = &run.steps[1.min(run.steps.len())..];
            let emit_at = decoded.iter().map(|s| s.layers).sum::<usize>() as f64
                / decoded.len().max(1) as f64;
            println!(
                "  {name:<9} {label:<22} {:>9} {:>10.2} {:>8.2} {:>9} {:>10} {:>9.0}",
                if run.tokens == greedy { "yes" } else { "no" },
                run.layers_per_token,
                emit_at,
                accepted,
                common::count(run.work.flops() as f64 / run.decoded().max(1) as f64),
                run.tokens_per_second()
            );
        }
        for (label, run) in &done[2..] {
            demo.check(
                format!("{name}: {label}: tokens == greedy tokens (lossless)"),
                run.tokens == greedy,
            );
        }

        // exact early exit leaves the base model's KV cache behind, bit for bit
        let options = EarlyExitOptions {
            max_new_tokens: M2R2_TOKENS,
            stop_tokens: vec![],
            gate: GateKind::Arla,
            threshold: threshold.into(),
            kv_policy: KvPolicy::Exact,
            sampling: None,
        };
        let out = early_exit_generate(M2r2::new(&loaded.model, &weights), &prompt, &options)?;
        let fed: Vec<u32> = prompt
            .iter()
            .chain(&out.tokens[..out.tokens.len() - 1])
            .copied()
            .collect();
        let mut base = loaded.model.new_cache(fed.len())?;
        loaded.model.forward(&fed, &mut base)?;
        let exited = out.trace.iter().filter(|t| t.exit_gate.is_some()).count();
        demo.check(
            format!(
                "{name}: exact early exit ({exited}/{} tokens exited) leaves the base model's KV \
                 cache, bit for bit",
                out.tokens.len()
            ),
            out.cache.len() == fed.len() && out.cache.prefix_equals(&base, fed.len()),
        );
    }
    Ok(())
}
