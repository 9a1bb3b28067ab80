//! What the reference computes on the probe, chunk by chunk ([`ReferenceRun`]), and the probe
//! itself ([`probe_tokens`]).

use crate::error::{Error, Result};
use ndarray::Array2;
use reference::KvCache;
use reference::base::model::Model;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

/// What the reference computes for the probe, chunk by chunk.
pub(super) struct ReferenceRun {
    /// per chunk `[T_c, V]`
    pub(super) logits: Vec<Array2<f32>>,
    /// per chunk `[T_c, V]`, or `[T_c, K]` with a pruned draft head
    pub(super) draft_logits: Vec<Array2<f32>>,
    /// per chunk `[T_c]` (when ARLA weights exist)
    pub(super) exit_prob: Vec<Option<Vec<f32>>>,
    /// per chunk `[T_c, D]` slow residual at `e`
    pub(super) hidden: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` the final slow residual `s_N`
    pub(super) finals: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` what the bridge reads: `s_N` of each row's previous position (zeros
    /// at position 0)
    pub(super) bridge_states: Vec<Array2<f32>>,
    /// per chunk `[T_c, D]` the draft gate's exit state `u_{g_d}` (with the bridge's terms)
    pub(super) exit_states: Vec<Array2<f32>>,
    /// the base model's cache after the probe (all layers)
    pub(super) cache: KvCache,
    /// the cache written by the draft's slow rows (layers `0..e`)
    pub(super) draft_cache: KvCache,
}

pub(super) fn reference_run(
    model: &Model,
    m2r2: &M2r2Weights,
    draft_gate: usize,
    chunks: &[&[u32]],
) -> Result<ReferenceRun> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut cache = model.new_cache(total)?;
    let mut draft_cache = model.new_cache(total)?;
    let m = M2r2::new(model, m2r2);
    let eps = model.config.rms_norm_eps as f32;
    let mut run = ReferenceRun {
        logits: vec![],
        draft_logits: vec![],
        exit_prob: vec![],
        hidden: vec![],
        finals: vec![],
        bridge_states: vec![],
        exit_states: vec![],
        cache: model.new_cache(0)?,
        draft_cache: model.new_cache(0)?,
    };
    // s_N of every position, teacher forced: what the bridge reads when all earlier positions are
    // verified
    let finals = m.all_exit_states_and_final(&chunks.concat())?.1;
    let d = model.config.hidden_size;
    for chunk in chunks {
        run.logits.push(model.forward(chunk, &mut cache)?.logits);
        let pos0 = draft_cache.len();
        model.check_input(chunk, pos0, &draft_cache)?;
        let mut s = model.embed(chunk);
        let slots: Vec<usize> = (0..chunk.len()).collect();
        let mut h = Array2::zeros((chunk.len(), d));
        for (t, mut row) in h.rows_mut().into_iter().enumerate() {
            if let Some(prev) = (pos0 + t).checked_sub(1) {
                row.assign(&finals.row(prev));
            }
        }
        let (entry, at_gate) = m.bridge_terms(draft_gate, h.view());
        let mut exits = Vec::new();
        for j in 0..draft_gate {
            let last = j + 1 == draft_gate;
            let from = entry.as_ref().filter(|_| last);
            let mut u = m
                .run_interval_from(j, &mut s, pos0, &mut draft_cache, &slots, from)
                .exit_states;
            if last && let Some(t) = &at_gate {
                u += t;
            }
            exits.push(u);
        }
        draft_cache.set_len(pos0 + chunk.len());
        run.finals.push(
            finals
                .slice(ndarray::s![pos0..pos0 + chunk.len(), ..])
                .to_owned(),
        );
        run.bridge_states.push(h);
        run.exit_states
            .push(exits.last().expect("draft_gate >= 1").clone());
        let u = exits.last().expect("draft_gate >= 1");
        run.draft_logits.push(match &m2r2.draft_head {
            // draft.onnx outputs the subset's K scores only
            Some(head) => head.subset_logits(model, u.view()).logits,
            None => m.exit_logits(u.view()),
        });
        run.exit_prob.push(m2r2.arla.as_ref().map(|arla| {
            (0..chunk.len())
                .map(|t| {
                    let states: Vec<_> = exits.iter().map(|u| u.row(t)).collect();
                    arla.exit_prob(&states, eps)
                })
                .collect()
        }));
        run.hidden.push(s);
    }
    run.cache = cache;
    run.draft_cache = draft_cache;
    Ok(run)
}

/// The probe `--check` feeds: a short English sentence when the model has a tokenizer, else fixed
/// ids; split in the middle.
pub fn probe_tokens(
    model: &Model,
    tokenizer: Option<&reference::io::tokenizer::Tokenizer>,
) -> Result<Vec<u32>> {
    let tokens = match tokenizer {
        Some(t) => t.encode("The quick brown fox jumps over the lazy dog.", false)?,
        None => vec![3, 1, 4, 1, 5, 9, 2, 6],
    };
    let tokens: Vec<u32> = tokens
        .into_iter()
        .map(|t| t % model.config.vocab_size as u32)
        .collect();
    if tokens.len() < 2 {
        return Err(Error::Invalid(
            "the probe sequence needs at least 2 tokens".into(),
        ));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reference::io::builtin;
    use reference::m2r2::bridge::BridgeSite;
    use reference::m2r2::bridge_config::BridgeConfig;
    use reference::m2r2::config::M2r2Config;

    /// `M2r2::draft_states_and_final` (one teacher-forced pass, what `draft-head` measures) gives
    /// the draft's exit states this probe computes chunk by chunk for the export check (which
    /// the ONNX draft graph is compared with), with and without a bridge, at every draft gate.
    #[test]
    fn teacher_forced_draft_states_are_the_probes() {
        let model = builtin::builtin("tiny").unwrap();
        let config = M2r2Config::default_for(&model.config);
        let plain = M2r2Weights::random(&model.config, config, 7).unwrap();
        let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 320).collect();
        for gate in 1..=plain.config.num_gates() {
            let bridge = BridgeConfig::new(gate, 4, BridgeSite::ALL.to_vec());
            let bridged = plain
                .clone()
                .with_bridge(&model.config, bridge, 3, 0.5)
                .unwrap();
            let mut drafts = vec![];
            for weights in [&plain, &bridged] {
                let run =
                    reference_run(&model, weights, gate, &[&tokens[..5], &tokens[5..]]).unwrap();
                let probe = ndarray::concatenate(
                    ndarray::Axis(0),
                    &[run.exit_states[0].view(), run.exit_states[1].view()],
                )
                .unwrap();
                let (u, finals) = M2r2::new(&model, weights)
                    .draft_states_and_final(&tokens, gate)
                    .unwrap();
                let diff = (&u - &probe).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
                assert!(diff < 1e-5, "gate {gate}: {diff}");
                assert_eq!(finals.nrows(), tokens.len());
                drafts.push(u);
            }
            // the bridge changes every row but the first, which reads zeros
            let moved = (&drafts[0] - &drafts[1]).mapv(f32::abs);
            assert!(moved.row(0).iter().all(|&x| x == 0.0), "gate {gate}");
            assert!(
                moved
                    .rows()
                    .into_iter()
                    .skip(1)
                    .all(|r| r.iter().any(|&x| x > 1e-4))
            );
        }
    }
}
