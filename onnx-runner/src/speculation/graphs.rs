//! One run of each graph of a speculative export: draft.onnx (proposals, scores, kept residuals,
//! exit states), feed.onnx (kept residuals only) and verifier.onnx (logits, final states), their
//! outputs read and checked, the KV stores grown.

use super::{BRIDGE_STATES, EXIT_PROB, EXIT_STATES, FINAL_STATES, OnnxSpeculation};
use crate::error::{Error, Result};
use crate::greedy::logits_rows;
use crate::session::Input;
use crate::spec_cache::Rows;
use crate::step::check_tokens;
use ndarray::{Array1, Array2, Array3, Axis};
use reference::m2r2::draft_head::DraftHead;

impl OnnxSpeculation {
    /// Run draft.onnx on `tokens` at the next positions, with `bridge_states` `[T, D]` when the
    /// export has a bridge (zeros where nothing is read): `(draft_logits [T, V] (or [T, K] with a
    /// pruned draft head), exit_prob [T] when exported, hidden_states [T, D], exit_states [T, D]
    /// with a bridge)`; the lower store grows by `T`.
    #[allow(clippy::type_complexity)]
    pub(super) fn run_draft(
        &mut self,
        tokens: &[u32],
        bridge_states: Option<Array2<f32>>,
        at: Rows<'_>,
    ) -> Result<(
        Array2<f32>,
        Option<Array1<f32>>,
        Array2<f32>,
        Option<Array2<f32>>,
    )> {
        check_tokens(
            &self.config,
            tokens,
            at.first_position(self.cache.lower_len()),
        )?;
        let t = tokens.len();
        let c = &self.config;
        let bridge_states: Option<Array3<f32>> = self.bridge.then(|| {
            bridge_states
                .unwrap_or_else(|| Array2::zeros((t, c.hidden_size)))
                .insert_axis(Axis(0)) // [1, T, D]
        });
        let extra: Vec<(&str, Input<'_>)> = bridge_states
            .iter()
            .map(|b| (BRIDGE_STATES, Input::F32(b.view().into_dyn())))
            .collect();
        let mut out = self.cache.run_lower(&mut self.draft, tokens, &extra, at)?;
        let file = self.draft.file().to_string();
        let scored = self
            .draft_head
            .as_ref()
            .map_or(c.vocab_size, DraftHead::len);
        let logits = logits_rows(out.take("draft_logits")?, t, scored, &file, "draft_logits")?;
        let hidden = logits_rows(
            out.take("hidden_states")?,
            t,
            c.hidden_size,
            &file,
            "hidden_states",
        )?;
        let exit_states = match self.bridge {
            true => Some(logits_rows(
                out.take(EXIT_STATES)?,
                t,
                c.hidden_size,
                &file,
                EXIT_STATES,
            )?),
            false => None,
        };
        let exit_prob = if self.has_arla {
            let p = out.take(EXIT_PROB)?;
            if p.shape() != [1, t] {
                return Err(Error::WrongShape {
                    file,
                    tensor: EXIT_PROB.into(),
                    expected: format!("[1, {t}]"),
                    actual: p.shape().to_vec(),
                });
            }
            Some(
                p.index_axis_move(Axis(0), 0)
                    .into_dimensionality()
                    .expect("rank 1"),
            )
        } else {
            None
        };
        Ok((logits, exit_prob, hidden, exit_states))
    }

    /// The slow residuals `[T, D]` at the draft gate of `tokens` at the next positions, through
    /// feed.onnx (or draft.onnx, whose other outputs are dropped, in an export without it); the
    /// lower store grows by `T`.
    pub(super) fn run_feed(&mut self, tokens: &[u32], at: Rows<'_>) -> Result<Array2<f32>> {
        let Some(feed) = &mut self.feed else {
            return Ok(self.run_draft(tokens, None, at)?.2);
        };
        check_tokens(
            &self.config,
            tokens,
            at.first_position(self.cache.lower_len()),
        )?;
        let mut out = self.cache.run_lower(feed, tokens, &[], at)?;
        let hidden = out.take("hidden_states")?;
        logits_rows(
            hidden,
            tokens.len(),
            self.config.hidden_size,
            feed.file(),
            "hidden_states",
        )
    }

    /// Run verifier.onnx on slow residuals `[m, D]` after the verified positions (or on tree
    /// nodes): logits `[m, V]`, and with a bridge the final residuals (`final_states`, `[m, D]`);
    /// the upper store grows by `m` (not for tree nodes).
    pub(super) fn run_verifier(
        &mut self,
        hidden: Array2<f32>,
        at: Rows<'_>,
    ) -> Result<(Array2<f32>, Option<Array2<f32>>)> {
        let m = hidden.nrows();
        let hidden: Array3<f32> = hidden.insert_axis(Axis(0)); // [1, m, D]
        let mut out = self
            .cache
            .run_upper(&mut self.verifier, hidden.view(), at)?;
        let file = self.verifier.file().to_string();
        let logits = logits_rows(
            out.take("logits")?,
            m,
            self.config.vocab_size,
            &file,
            "logits",
        )?;
        let finals = match self.bridge {
            true => {
                let d = self.config.hidden_size;
                Some(logits_rows(
                    out.take(FINAL_STATES)?,
                    m,
                    d,
                    &file,
                    FINAL_STATES,
                )?)
            }
            false => None,
        };
        Ok((logits, finals))
    }

    /// [`run_verifier`](Self::run_verifier) on the next positions, its final residuals handed
    /// to the bridge's memory.
    pub(super) fn verify_next(&mut self, hidden: Array2<f32>, bound: bool) -> Result<Array2<f32>> {
        let start = self.cache.upper_len();
        let (logits, finals) = self.run_verifier(hidden, Rows::Next { bound })?;
        if let Some(finals) = finals {
            self.bridge_memory.verified(start, finals);
        }
        Ok(logits)
    }
}
