//! The check of a static `model.onnx` (`--static-cache`) through the runner's own loop.

use super::compare::{Comparison, batch1, compare, kv_layout};
use super::runner_error;
use crate::error::Result;
use crate::graphs::{self, LOGITS};
use ndarray::{ArrayD, Axis};
use onnx_runner::ep::EpConfig;
use reference::base::model::Model;

/// A static model.onnx through the runner: `chunks[0]` as one run, then each token of the later
/// chunks as a run of its own, each against the reference's same step; then the buffers' filled
/// positions against the reference's cache. Returns the logits per chunk (`[1, T_c, V]`).
pub(super) fn check_static_model(
    export: &onnx_runner::manifest::ExportDir,
    model: &Model,
    chunks: &[&[u32]],
    rows: &mut Vec<Comparison>,
) -> Result<Vec<ArrayD<f32>>> {
    let graph = "model.onnx (static)";
    let mut onnx =
        onnx_runner::greedy::OnnxModel::load(export, &EpConfig::cpu()).map_err(runner_error)?;
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut cache = model.new_cache(total)?;
    let mut per_chunk = Vec::new();
    for (c, chunk) in chunks.iter().enumerate() {
        let steps: Vec<&[u32]> = if c == 0 {
            vec![chunk]
        } else {
            chunk.chunks(1).collect()
        };
        let mut got_rows = Vec::new();
        for step in steps {
            let pos = cache.len();
            let want = model.forward(step, &mut cache)?.logits;
            let got = onnx.forward(step).map_err(runner_error)?;
            let tag = format!("{LOGITS} (positions {pos}..{})", pos + step.len());
            rows.push(compare(
                graph,
                &tag,
                &batch1(got.view()),
                &batch1(want.view()),
            ));
            got_rows.push(got);
        }
        let views: Vec<_> = got_rows.iter().map(|r| r.view()).collect();
        let logits = ndarray::concatenate(Axis(0), &views).expect("same vocab in every step");
        per_chunk.push(batch1(logits.view()));
    }
    let kv = onnx.kv().map_err(runner_error)?;
    let c = &model.config;
    for l in 0..c.num_hidden_layers {
        let (k, v) = cache.layer(l, total);
        let (ok, ov) = kv.layer(l);
        let (kn, vn) = graphs::present_names(l);
        let filled = format!("filled positions 0..{total}");
        rows.push(compare(
            graph,
            &format!("{kn} ({filled})"),
            &ok.clone().into_dyn(),
            &kv_layout(k, c.num_key_value_heads, c.head_dim),
        ));
        rows.push(compare(
            graph,
            &format!("{vn} ({filled})"),
            &ov.clone().into_dyn(),
            &kv_layout(v, c.num_key_value_heads, c.head_dim),
        ));
    }
    Ok(per_chunk)
}
