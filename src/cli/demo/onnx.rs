//! The demo's ONNX section: export the demo model with its built-in M2R2 weights, run the graphs on
//! ONNX Runtime (CPU) greedy and self-speculative, and set them against the reference: tokens equal,
//! max logit difference, acceptance statistics equal.

use crate::cli::common;
use anyhow::{Context, Result};
use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use onnx_runner::ep::EpConfig;
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::ExportDir;
use onnx_runner::speculation::OnnxSpeculation;
use reference::base::generate::GenerateOptions;
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;
use std::time::Instant;

/// Largest |ORT - reference| logit the demo calls equal (f32, different summation order).
const LOGIT_TOL: f32 = 1e-4;

/// Run the section; `check(what, ok)` records each check. `dir` is an empty scratch folder.
pub fn tour(
    loaded: &LoadedModel,
    prompt: &[u32],
    new_tokens: usize,
    dir: &Path,
    check: &mut dyn FnMut(String, bool),
) -> Result<()> {
    let model = &loaded.model;
    let weights = M2r2Weights::builtin_for(&loaded.name, &model.config)?;
    let draft_gate = weights.config.draft_gate;
    let out = dir.join("export");
    let start = Instant::now();
    let request = ExportRequest {
        model,
        tokenizer: loaded.tokenizer.as_ref(),
        m2r2: &weights,
        options: ExportOptions {
            model_name: loaded.name.clone(),
            opset: 17,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: GraphKind::ALL.to_vec(),
        external_data: false,
    };
    let summaries = export(&request, &out, &mut |_| {})?;
    let bytes: u64 = summaries.iter().map(|s| s.bytes).sum();
    println!(
        "  exported model.onnx, draft.onnx (layers 0..{}), verifier.onnx to {} ({}) in {:.2} s",
        weights.config.gate_layer(draft_gate),
        out.display(),
        common::bytes(bytes as f64),
        start.elapsed().as_secs_f64()
    );
    let exported = ExportDir::open(&out)?;
    let runtime = onnx_runner::runtime::init()
        .context("ONNX Runtime is needed for this section (`m2r2 fetch onnxruntime`)")?;
    println!(
        "  ONNX Runtime {} from {}, CPU execution provider",
        runtime.version,
        runtime.path.display()
    );
    let stop = loaded.stop_tokens();

    // greedy: reference vs model.onnx, with the logits of every step
    let options = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_tokens: stop.clone(),
        sampling: None,
    };
    let want = reference::base::generate::generate(model, prompt, &options, &mut |_, _| {})?;
    let mut ort = OnnxModel::load(&exported, &EpConfig::cpu())?;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let got = ort.generate(prompt, &options, &mut |_, logits| {
        rows.push(logits.to_vec())
    })?;
    let fed: Vec<u32> = prompt
        .iter()
        .chain(&got.tokens[..got.tokens.len().saturating_sub(1)])
        .copied()
        .collect();
    let teacher = model.teacher_forced_logits(&fed)?;
    let mut max_diff = 0.0f32;
    for (i, row) in rows.iter().enumerate() {
        for (a, b) in row.iter().zip(teacher.row(prompt.len() - 1 + i)) {
            max_diff = max_diff.max((a - b).abs());
        }
    }

    // speculative: the reference's loop on the reference backend and on draft/verifier.onnx
    let spec = SpeculativeOptions {
        max_new_tokens: new_tokens,
        stop_tokens: stop,
        draft_length: DraftLength::Fixed(weights.config.draft_len.max(1)),
        sampling: None,
    };
    let capacity = prompt.len() + new_tokens + weights.config.draft_len + 1;
    let mut backend =
        ReferenceSpeculation::new(M2r2::new(model, &weights), draft_gate, None, capacity)?;
    let start = Instant::now();
    let ref_spec = speculative_generate(&mut backend, prompt, &spec)?;
    let ref_seconds = start.elapsed().as_secs_f64();
    let mut onnx = OnnxSpeculation::load(&exported, &EpConfig::cpu(), None)?;
    let start = Instant::now();
    let ort_spec = speculative_generate(&mut onnx, prompt, &spec)?;
    let ort_seconds = start.elapsed().as_secs_f64();

    println!(
        "  {:<30} {:>8} {:>12} {:>10} {:>10}",
        "run", "tokens", "= reference", "accepted", "tokens/s"
    );
    let rate = |n: usize, s: f64| n as f64 / s.max(1e-9);
    let lines = [
        (
            "reference greedy",
            &want.tokens,
            true,
            None,
            want.decode_tokens_per_second(),
        ),
        (
            "ONNX Runtime greedy",
            &got.tokens,
            got.tokens == want.tokens,
            None,
            got.decode_tokens_per_second(),
        ),
        (
            "reference speculative",
            &ref_spec.tokens,
            ref_spec.tokens == want.tokens,
            Some(ref_spec.mean_accepted_length()),
            rate(ref_spec.tokens.len(), ref_seconds),
        ),
        (
            "ONNX Runtime speculative",
            &ort_spec.tokens,
            ort_spec.tokens == want.tokens,
            Some(ort_spec.mean_accepted_length()),
            rate(ort_spec.tokens.len(), ort_seconds),
        ),
    ];
    for (name, tokens, equal, accepted, tps) in lines {
        println!(
            "  {name:<30} {:>8} {:>12} {:>10} {tps:>10.1}",
            tokens.len(),
            if equal { "yes" } else { "NO" },
            accepted.map_or("-".to_string(), |a| format!("{a:.2}")),
        );
    }
    println!(
        "  (speculative tokens/s include the prompt's prefill; `m2r2 bench --onnx` times them apart)"
    );
    check(
        "ONNX Runtime greedy tokens == the reference's".into(),
        got.tokens == want.tokens,
    );
    check(
        format!(
            "max |logit ORT - reference| over {} steps = {max_diff:.1e} <= {LOGIT_TOL:.0e}",
            rows.len()
        ),
        max_diff <= LOGIT_TOL,
    );
    check(
        "ONNX Runtime speculative tokens == greedy tokens (lossless)".into(),
        ort_spec.tokens == want.tokens,
    );
    let same_rounds = ort_spec.rounds.len() == ref_spec.rounds.len()
        && ort_spec.rounds.iter().zip(&ref_spec.rounds).all(|(a, b)| {
            (a.start, &a.drafted, a.accepted, a.base_token)
                == (b.start, &b.drafted, b.accepted, b.base_token)
        });
    check(
        format!(
            "acceptance statistics == the reference's ({} rounds, {:.2} tokens per verification)",
            ort_spec.rounds.len(),
            ort_spec.mean_accepted_length()
        ),
        same_rounds,
    );
    Ok(())
}
