//! The fast residual stream (docs/m2r2/streams.md), run interval by interval next to the slow
//! stream. Its equations for one token are `m2r2/fast_stream_naive.rs` (tested bitwise equal).
//!
//! In interval `j` (code layers `e_j .. e_{j+1}`) the fast state starts from the slow residual,
//! `f <- s_{e_j}`, and runs the interval's layers with the base weights plus each layer's accelerator
//! adapter. At gate `j+1` its value `u_{j+1} = f` estimates the FINAL slow residual `s_N`, so the
//! exit logits are `LMHead(FinalNorm(u_{j+1}))`. Interval `j` covers `N - e_j` layers of slow depth in
//! `e_{j+1} - e_j` layers: the fast stream's rate is `(J+1)x` in the first interval, `2x` in the last
//! gated one.
//!
//! The fast rows ride in the same `DecoderLayer::forward_batch` calls as the slow rows (one weight
//! read), read the slow KV cache and never write it (docs/m2r2/shared_kv.md). They run only when
//! their output is consumed (docs/m2r2/cost.md): callers pass the slots that need a fast row.

use crate::base::kv_cache::KvCache;
use crate::base::layer::{FastRows, TreeRows};
use crate::base::model::Model;
use crate::base::moe::Routing;
use crate::base::work::Work;
use crate::m2r2::bridge::BridgeSite;
use crate::m2r2::weights::M2r2Weights;
use ndarray::{Array2, ArrayView2, Axis, s};

/// Per gate `g`: the fast exit state `u_g` and the slow residual `s_{e_g}`, `[T, D]` each.
pub type GateStates = Vec<(Array2<f32>, Array2<f32>)>;

/// A base model with its M2R2 weights.
#[derive(Clone, Copy)]
pub struct M2r2<'a> {
    pub model: &'a Model,
    pub weights: &'a M2r2Weights,
}

/// What one interval produced.
pub struct IntervalOutput {
    /// `[slots, D]` the fast exit states `u_{j+1}` of the requested slots (empty without slots)
    pub exit_states: Array2<f32>,
    /// Per layer of the interval: the slow rows' expert routing (MoE layers), for expert prefetch.
    pub routing: Vec<Option<Vec<Routing>>>,
    /// Work done by the interval's layers (counted from the shapes multiplied).
    pub work: Work,
}

impl<'a> M2r2<'a> {
    pub fn new(model: &'a Model, weights: &'a M2r2Weights) -> Self {
        M2r2 { model, weights }
    }

    /// Number of gates J.
    pub fn num_gates(&self) -> usize {
        self.weights.config.num_gates()
    }

    /// Run interval `j` on the slow chunk `s` (positions `pos0..pos0+T`), in place, with fast rows
    /// for the chunk rows listed in `slots`, initialised from `s` at the interval start.
    ///
    /// # Shapes
    /// - `s`: `[T, D]` slow residuals at `e_j` -> at `e_{j+1}`; returns `[slots.len(), D]` = `u_{j+1}`
    pub fn run_interval(
        &self,
        j: usize,
        s: &mut Array2<f32>,
        pos0: usize,
        cache: &mut KvCache,
        slots: &[usize],
    ) -> IntervalOutput {
        self.run_interval_from(j, s, pos0, cache, slots, None)
    }

    /// [`run_interval`](Self::run_interval) with `entry` added to the fast rows' starting states
    /// (the bridge's entry term, [`crate::m2r2::bridge`]): `f <- s_{e_j} + entry`.
    ///
    /// # Shapes
    /// - `entry`: `[slots.len(), D]`
    pub fn run_interval_from(
        &self,
        j: usize,
        s: &mut Array2<f32>,
        pos0: usize,
        cache: &mut KvCache,
        slots: &[usize],
        entry: Option<&Array2<f32>>,
    ) -> IntervalOutput {
        self.run_interval_rows(j, s, pos0, None, cache, slots, entry)
    }

    /// [`run_interval`](Self::run_interval) on rows that are nodes of a token tree whose root
    /// sits at `pos0` (`base/tree.rs`): each slow and fast row sees the cache before the tree and
    /// its node's ancestors only, so each is bitwise what it is in a decode of its node's path;
    /// `entry` (the bridge's entry term, one row per slot) is added to the fast rows' starting
    /// states.
    ///
    /// # Shapes
    /// - `s`: `[T, D]` (nodes `tree.first..tree.first+T`); returns `[slots.len(), D]`
    /// - `entry`: `[slots.len(), D]`
    #[allow(clippy::too_many_arguments)]
    pub fn run_interval_tree_from(
        &self,
        j: usize,
        s: &mut Array2<f32>,
        pos0: usize,
        tree: TreeRows<'_>,
        cache: &mut KvCache,
        slots: &[usize],
        entry: Option<&Array2<f32>>,
    ) -> IntervalOutput {
        self.run_interval_rows(j, s, pos0, Some(tree), cache, slots, entry)
    }

    /// Interval `j` on a chunk (`tree: None`) or on tree nodes.
    #[allow(clippy::too_many_arguments)]
    fn run_interval_rows(
        &self,
        j: usize,
        s: &mut Array2<f32>,
        pos0: usize,
        tree: Option<TreeRows<'_>>,
        cache: &mut KvCache,
        slots: &[usize],
        entry: Option<&Array2<f32>>,
    ) -> IntervalOutput {
        // f <- s_{e_j}: the fast stream restarts from the slow residual at every gate.
        let mut f = s.select(Axis(0), slots);
        if let Some(e) = entry {
            f += e;
        }
        let mut routing = Vec::new();
        let mut work = Work::default();
        for l in self.weights.config.interval_layers(j) {
            let fast = (!slots.is_empty()).then_some(FastRows {
                f: &mut f,
                slot: slots,
                adapter: Some(&self.weights.accelerator),
            });
            let layer = self.model.layer(l);
            let out = match tree {
                None => layer.forward(s, pos0, cache, fast),
                Some(tree) => layer.forward_tree(s, pos0, tree, cache, fast),
            };
            routing.push(out.routing);
            work += out.work;
        }
        IntervalOutput {
            exit_states: f,
            routing,
            work,
        }
    }

    /// The bridge's terms (entry, gate) for rows drafting at `draft_gate` whose previous states
    /// are `h` ([`crate::m2r2::bridge`]): `x̂ = FinalNorm(h)`, then each site's `c B A x̂`. Both
    /// `None` without a bridge read at that gate.
    ///
    /// # Shapes
    /// - `h`: `[R, D]` -> (`[R, D]`, `[R, D]`)
    pub fn bridge_terms(
        &self,
        draft_gate: usize,
        h: ArrayView2<f32>,
    ) -> (Option<Array2<f32>>, Option<Array2<f32>>) {
        let Some(bridge) = self.weights.bridge_at(draft_gate) else {
            return (None, None);
        };
        let xhat = self.model.final_norm(h);
        (
            bridge.term(BridgeSite::Entry, xhat.view()),
            bridge.term(BridgeSite::Gate, xhat.view()),
        )
    }

    /// Exit logits `LMHead(FinalNorm(u))` of fast exit states.
    ///
    /// # Shapes
    /// - `u`: `[R, D]` -> `[R, V]`
    pub fn exit_logits(&self, u: ArrayView2<f32>) -> Array2<f32> {
        self.model.head(u).logits
    }

    /// The fast exit states `u_1..u_J` of every position of `tokens` (one chunk, fresh cache), with
    /// the slow residual at each gate: what `analyze` and the tests look at.
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> J entries of (`u_g` `[T, D]`, `s_{e_g}` `[T, D]`)
    pub fn all_exit_states(&self, tokens: &[u32]) -> crate::Result<GateStates> {
        Ok(self.exit_trace(tokens, false)?.0)
    }

    /// [`M2r2::all_exit_states`] and the final slow residual `s_N` of every position, from the same
    /// slow stream: `model.head(s_N)` is bitwise the base model's logits (batch invariance), so a
    /// teacher needs no second forward.
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> (J entries of (`[T, D]`, `[T, D]`), `s_N` `[T, D]`)
    pub fn all_exit_states_and_final(
        &self,
        tokens: &[u32],
    ) -> crate::Result<(GateStates, Array2<f32>)> {
        self.exit_trace(tokens, true)
    }

    /// The draft's exit state at `draft_gate` (1-based) for every position of `tokens`, each with
    /// every earlier position verified (teacher forced: the first draft of a round), and the final
    /// slow residual `s_N`. With weights whose bridge is read at `draft_gate`, each row reads
    /// `FinalNorm(s_N)` of the previous position (zeros at position 0), as decoding's first draft
    /// of a round does; without one these are [`M2r2::all_exit_states_and_final`]'s.
    ///
    /// # Shapes
    /// - `tokens`: `[T]` -> (`u_{draft_gate}` `[T, D]`, `s_N` `[T, D]`)
    pub fn draft_states_and_final(
        &self,
        tokens: &[u32],
        draft_gate: usize,
    ) -> crate::Result<(Array2<f32>, Array2<f32>)> {
        let (mut states, finals) = self.all_exit_states_and_final(tokens)?;
        if self.weights.bridge_at(draft_gate).is_none() {
            return Ok((states.swap_remove(draft_gate - 1).0, finals));
        }
        // h_p = s_N[p-1], zeros at p = 0 (whose terms are then zero)
        let mut h = Array2::zeros(finals.raw_dim());
        let t = tokens.len();
        if t > 1 {
            h.slice_mut(s![1.., ..])
                .assign(&finals.slice(s![..t - 1, ..]));
        }
        let (entry, at_gate) = self.bridge_terms(draft_gate, h.view());
        let mut cache = self.model.new_cache(t)?;
        let mut s = self.model.embed(tokens);
        let slots: Vec<usize> = (0..t).collect();
        let mut u = Array2::zeros(finals.raw_dim());
        for j in 0..draft_gate {
            let from = entry.as_ref().filter(|_| j + 1 == draft_gate);
            u = self
                .run_interval_from(j, &mut s, 0, &mut cache, &slots, from)
                .exit_states;
        }
        if let Some(term) = at_gate {
            u += &term;
        }
        Ok((u, finals))
    }

    /// The gates' (exit state, slow residual), then the slow residual after the last interval,
    /// or after the last layer with `to_end`.
    fn exit_trace(&self, tokens: &[u32], to_end: bool) -> crate::Result<(GateStates, Array2<f32>)> {
        let mut cache = self.model.new_cache(tokens.len())?;
        self.model.check_input(tokens, 0, &cache)?;
        let mut s = self.model.embed(tokens);
        let slots: Vec<usize> = (0..tokens.len()).collect();
        let mut out = Vec::with_capacity(self.num_gates());
        let mut next_layer = 0;
        for j in 0..self.num_gates() {
            let interval = self.run_interval(j, &mut s, 0, &mut cache, &slots);
            out.push((interval.exit_states, s.clone()));
            next_layer = self.weights.config.interval_layers(j).end;
        }
        if to_end {
            for l in next_layer..self.model.config.num_hidden_layers {
                self.model.layer_forward(l, &mut s, 0, &mut cache);
            }
        }
        Ok((out, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use crate::m2r2::config::M2r2Config;
    use crate::m2r2::weights::M2r2Weights;

    /// The final slow residual of `all_exit_states_and_final` gives the base model's logits bit for
    /// bit, and its exit states are `all_exit_states`'.
    #[test]
    fn final_residual_gives_the_base_logits() {
        for name in builtin::BUILTIN_NAMES {
            let model = builtin::builtin(name).unwrap();
            let weights =
                M2r2Weights::random(&model.config, M2r2Config::default_for(&model.config), 3)
                    .unwrap();
            let m2r2 = M2r2::new(&model, &weights);
            let tokens = [3, 1, 4, 1, 5, 9, 2, 6];
            let (gates, last) = m2r2.all_exit_states_and_final(&tokens).unwrap();
            assert_eq!(gates, m2r2.all_exit_states(&tokens).unwrap());
            let want = model.teacher_forced_logits(&tokens).unwrap();
            assert_eq!(model.head(last.view()).logits, want, "{name}");
        }
    }

    /// With B = 0 the fast stream computes exactly the slow stream's layers, so each exit state
    /// equals the slow residual at its gate, bit for bit.
    #[test]
    fn zero_adapters_make_fast_equal_slow() {
        for name in builtin::BUILTIN_NAMES {
            let model = builtin::builtin(name).unwrap();
            let weights = M2r2Weights::zeros(&model.config);
            let m2r2 = M2r2::new(&model, &weights);
            for (g, (u, s)) in m2r2
                .all_exit_states(&[3, 1, 4, 1, 5, 9, 2, 6])
                .unwrap()
                .into_iter()
                .enumerate()
            {
                assert!(
                    u.iter()
                        .zip(s.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} gate {}",
                    g + 1
                );
            }
        }
    }

    /// Random adapters move the fast stream away from the slow one, and the fast rows never touch
    /// the cache: the slow states and cache equal the base model's.
    #[test]
    fn fast_rows_do_not_disturb_the_slow_stream() {
        let model = builtin::builtin("tiny-moe").unwrap();
        let weights = M2r2Weights::builtin_for("tiny-moe", &model.config).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let tokens = [7u32, 8, 9, 10, 11];
        let states = m2r2.all_exit_states(&tokens).unwrap();
        let (u, s) = &states[0];
        assert!(
            u.iter().zip(s.iter()).any(|(a, b)| a != b),
            "random adapters should change the fast state"
        );

        // The slow residual after the gated intervals equals the base model's, layer by layer.
        let mut cache = model.new_cache(tokens.len()).unwrap();
        let mut base = model.embed(&tokens);
        for l in 0..weights.config.gate_layer(m2r2.num_gates()) {
            model.layer_forward(l, &mut base, 0, &mut cache);
        }
        let last_slow = &states.last().unwrap().1;
        assert!(
            base.iter()
                .zip(last_slow.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}
