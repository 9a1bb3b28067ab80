//! One cost model: FLOPs and weight bytes read, for every decoding mode (docs/m2r2/cost.md).
//!
//! [`Work`] counts multiply-accumulates (MACs; FLOPs = 2 MACs) in weight products and in attention,
//! and the f32 weight bytes read from memory, each matrix counted once per call however many rows
//! share it (that is the point of stacking slow and fast rows, and of verifying drafts in a chunk).
//!
//! [`CostModel`] predicts the work of each step from the configs and a few facts about the step
//! (rows, positions, which gate): this file is the one home of the arithmetic (`m2r2 bench`'s bytes
//! per decode step and `moe_aot`'s layer times read it too). Beside the forward, not inside it,
//! `base::layer_work` counts what each layer call really multiplied from the weights' own shapes
//! (and `Model::head`, the embedding and the draft head count theirs); the decoding modes report
//! that count, and the tests check that the two agree exactly (MoE expert bytes: the prediction is
//! `min(E, rows * k)` experts per call, an upper bound that is exact for one row, where the count
//! reads the experts the rows chose).
//!
//! Every decoding mode has its predictor: [`CostModel::greedy_step`], [`CostModel::speculative`]
//! (from the rounds) and [`CostModel::early_exit`] (from the exit trace).
//!
//! Not counted: RMSNorm / RoPE / softmax arithmetic (O(D) per row), KV-cache reads, activations, ARLA
//! (`J * (d_lat * D + 3 d_lat^2)` MACs per token, under 0.1% of a layer for the default sizes).

use crate::base::config::ModelConfig;
use crate::base::work::Work;
use crate::m2r2::weights::M2r2Weights;

/// Predicts [`Work`] from the configs.
#[derive(Clone, Copy)]
pub struct CostModel<'a> {
    pub model: &'a ModelConfig,
    /// The adapters and gates; `None` for the base model alone.
    pub m2r2: Option<&'a M2r2Weights>,
}

impl<'a> CostModel<'a> {
    pub fn new(model: &'a ModelConfig, m2r2: Option<&'a M2r2Weights>) -> Self {
        CostModel { model, m2r2 }
    }

    /// Layer `l` on `positions.len()` slow rows (the positions they sit at) and fast rows at
    /// `fast_positions`: its two norm weights, the attention projections and attention of every
    /// row, the feed-forward (the slow rows choose the experts), and the fast rows' adapter terms.
    pub fn layer(&self, l: usize, positions: &[usize], fast_positions: &[usize]) -> Work {
        let rows = positions.len() + fast_positions.len();
        let mut w = self.layer_norms()
            + self.attention_projections(rows)
            + self.attention(positions.iter().chain(fast_positions).copied())
            + self.feed_forward(rows, positions.len());
        if !fast_positions.is_empty() {
            w += self.adapter(l, fast_positions.len());
        }
        w
    }

    /// The two RMSNorm weights of a layer (input and post-attention), read once per call.
    pub fn layer_norms(&self) -> Work {
        Work::read(2 * self.model.hidden_size)
    }

    /// The q, k, v and o projections (with their biases) on `rows` rows.
    pub fn attention_projections(&self, rows: usize) -> Work {
        let c = self.model;
        let d = c.hidden_size;
        Work::matmul(rows, c.q_dim(), d, c.qkv_bias)
            + Work::matmul(rows, c.kv_dim(), d, c.qkv_bias)
            + Work::matmul(rows, c.kv_dim(), d, c.qkv_bias)
            + Work::matmul(rows, d, c.q_dim(), c.o_bias)
    }

    /// Attention of one row per position in `positions`, each over the keys it sees
    /// (`lo..=p`, within the sliding window).
    pub fn attention(&self, positions: impl IntoIterator<Item = usize>) -> Work {
        let c = self.model;
        positions
            .into_iter()
            .map(|p| Work::attention(c, p + 1 - crate::base::attention::window_start(c, p)))
            .sum()
    }

    /// The feed-forward on `rows` rows of which `slow_rows` are slow: the dense SwiGLU MLP, or the
    /// MoE router and experts.
    pub fn feed_forward(&self, rows: usize, slow_rows: usize) -> Work {
        match &self.model.moe {
            None => self.mlp(rows),
            Some(_) => self.router(rows) + self.experts(rows, slow_rows),
        }
    }

    /// The dense SwiGLU MLP (gate, up, down, with their biases) on `rows` rows.
    pub fn mlp(&self, rows: usize) -> Work {
        let c = self.model;
        let (d, i) = (c.hidden_size, c.intermediate_size);
        Work::matmul(rows, i, d, c.mlp_bias)
            + Work::matmul(rows, i, d, c.mlp_bias)
            + Work::matmul(rows, d, i, c.mlp_bias)
    }

    /// The MoE router `[E, D]` on `rows` rows (none in a dense model).
    pub fn router(&self, rows: usize) -> Work {
        let c = self.model;
        match &c.moe {
            None => Work::default(),
            Some(moe) => Work::matmul(rows, moe.num_local_experts, c.hidden_size, false),
        }
    }

    /// The routed experts (SwiGLU, no biases) on `rows` rows of which `slow_rows` are slow: `k`
    /// experts per row, the experts read being at most `min(E, slow_rows * k)` (fast rows use their
    /// slow row's experts; exact for one slow row). None in a dense model.
    pub fn experts(&self, rows: usize, slow_rows: usize) -> Work {
        let c = self.model;
        let Some(moe) = &c.moe else {
            return Work::default();
        };
        let per_expert = self.expert_weights();
        let k = moe.num_experts_per_tok;
        let experts_read = moe.num_local_experts.min(slow_rows * k);
        Work {
            weight_macs: (rows * k * per_expert) as u64,
            ..Work::read(experts_read * per_expert)
        }
    }

    /// The weights of one routed expert: gate, up and down, `3 D I`.
    pub fn expert_weights(&self) -> usize {
        3 * self.model.hidden_size * self.model.intermediate_size
    }

    /// Adapter terms `scale * B (A x)` of layer `l` for `rows` fast rows (none without an adapter).
    pub fn adapter(&self, l: usize, rows: usize) -> Work {
        let Some(layer) = self
            .m2r2
            .and_then(|m| m.accelerator.layers.get(l))
            .and_then(Option::as_ref)
        else {
            return Work::default();
        };
        layer
            .loras
            .iter()
            .map(|(t, lora)| {
                let (out, inp) = t.shape(self.model);
                let rank = lora.rank();
                Work::matmul(rows, rank, inp, false) + Work::matmul(rows, out, rank, false)
            })
            .sum()
    }

    /// Final norm and LM head on `rows` rows.
    pub fn head(&self, rows: usize) -> Work {
        self.final_norm() + self.lm_head(rows)
    }

    /// The final RMSNorm's weight.
    pub fn final_norm(&self) -> Work {
        Work::read(self.model.hidden_size)
    }

    /// The LM head `[V, D]` (the embedding when tied) on `rows` rows.
    pub fn lm_head(&self, rows: usize) -> Work {
        Work::matmul(rows, self.model.vocab_size, self.model.hidden_size, false)
    }

    /// `fast-kv` early exit: the k and v projections (and the input norm's weight) of `layers`
    /// on one exit state, filling the cache of the layers a token skipped.
    pub fn kv_fill(&self, layers: std::ops::Range<usize>) -> Work {
        let c = self.model;
        layers
            .map(|_| {
                Work::read(c.hidden_size)
                    + Work::matmul(1, c.kv_dim(), c.hidden_size, c.qkv_bias)
                    + Work::matmul(1, c.kv_dim(), c.hidden_size, c.qkv_bias)
            })
            .sum()
    }

    /// Embedding rows of `rows` tokens.
    pub fn embed(&self, rows: usize) -> Work {
        Work::read(rows * self.model.hidden_size)
    }

    /// The whole model on one chunk of rows at `positions`: plain decoding / prefill / verify.
    pub fn base_chunk(&self, layers: std::ops::Range<usize>, positions: &[usize]) -> Work {
        layers.map(|l| self.layer(l, positions, &[])).sum()
    }

    /// One plain greedy decode step of the token at position `p`.
    pub fn greedy_step(&self, p: usize) -> Work {
        self.embed(1) + self.base_chunk(0..self.model.num_hidden_layers, &[p]) + self.head(1)
    }

    /// One draft step at position `p` through gates `1..=draft_gate`; when proposing, with fast rows
    /// in the listed intervals (0-based) and the exit head.
    pub fn draft_step(
        &self,
        p: usize,
        draft_gate: usize,
        fast_intervals: &[usize],
        propose: bool,
    ) -> Work {
        let m2r2 = &self.m2r2.expect("draft cost needs the M2R2 weights").config;
        let mut w = self.embed(1);
        for j in 0..draft_gate {
            let fast: &[usize] = if propose && fast_intervals.contains(&j) {
                &[p]
            } else {
                &[]
            };
            for l in m2r2.interval_layers(j) {
                w += self.layer(l, &[p], fast);
            }
        }
        if propose {
            w += self.draft_head(1);
            if let Some(bridge) = self.m2r2.and_then(|m| m.bridge_at(draft_gate))
                && p > 0
            {
                w += bridge.work(self.model.hidden_size);
            }
        }
        w
    }

    /// Final norm and the draft's exit head on `rows` rows: the pruned head's `K` rows when the
    /// M2R2 weights carry one ([`crate::m2r2::draft_head`]), else the full head.
    pub fn draft_head(&self, rows: usize) -> Work {
        match self.m2r2.and_then(|w| w.draft_head.as_ref()) {
            Some(head) => {
                Work::read(self.model.hidden_size)
                    + Work::matmul(rows, head.len(), self.model.hidden_size, false)
            }
            None => self.head(rows),
        }
    }

    /// Verification of the drafted positions `positions` from the draft gate up.
    pub fn verify(&self, draft_gate: usize, positions: &[usize]) -> Work {
        let m2r2 = &self
            .m2r2
            .expect("verify cost needs the M2R2 weights")
            .config;
        self.base_chunk(
            m2r2.gate_layer(draft_gate)..self.model.num_hidden_layers,
            positions,
        ) + self.head(positions.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::{Architecture, MoeConfig, RopeScaling};
    use crate::base::model::Model;
    use crate::decode::draft_verify::ReferenceSpeculation;
    use crate::decode::speculative::{
        DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
    };
    use crate::io::builtin::random_model;
    use crate::m2r2::config::M2r2Config;
    use crate::m2r2::exit_gate::GateKind;
    use crate::m2r2::fast_stream::M2r2;

    fn small(moe: bool, window: Option<usize>) -> (Model, M2r2Weights) {
        let config = ModelConfig {
            architecture: if moe {
                Architecture::Mixtral
            } else {
                Architecture::Llama
            },
            vocab_size: 50,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: 6,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            max_position_embeddings: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::Default,
            qkv_bias: true,
            o_bias: false,
            mlp_bias: false,
            tie_word_embeddings: false,
            sliding_window: window,
            moe: moe.then_some(MoeConfig {
                num_local_experts: 4,
                num_experts_per_tok: 2,
            }),
            bos_token_id: None,
            eos_token_ids: vec![],
        };
        let model = random_model(config.clone(), 5).unwrap();
        let weights = M2r2Weights::random(&config, M2r2Config::default_for(&config), 6).unwrap();
        (model, weights)
    }

    /// Plain decoding: the work the forward pass counts equals the cost model's, step by step.
    #[test]
    fn greedy_counts_equal_the_model() {
        for (moe, window) in [(false, None), (false, Some(3)), (true, None)] {
            let (model, weights) = small(moe, window);
            let cost = CostModel::new(&model.config, Some(&weights));
            let mut cache = model.new_cache(20).unwrap();
            let prefill = model.forward(&[1, 2, 3, 4], &mut cache).unwrap().work;
            let mut predicted = cost.embed(4) + cost.base_chunk(0..6, &[0, 1, 2, 3]) + cost.head(4);
            if moe {
                // Chunked MoE calls read the distinct experts; the model counts min(E, rows * k).
                assert_eq!(prefill.weight_macs, predicted.weight_macs);
                assert!(prefill.weight_bytes <= predicted.weight_bytes);
                predicted = prefill;
            }
            assert_eq!(prefill, predicted, "prefill, moe {moe} window {window:?}");
            for p in 4..12 {
                let step = model
                    .forward(&[(p * 7 % 50) as u32], &mut cache)
                    .unwrap()
                    .work;
                assert_eq!(
                    step,
                    cost.greedy_step(p),
                    "step at {p}, moe {moe} window {window:?}"
                );
            }
        }
    }

    /// Early exit: the work counted by the decoder equals the cost model's replay of its exit trace,
    /// for both KV policies, over thresholds that give no exits, some, and all at gate 1.
    #[test]
    fn early_exit_counts_equal_the_model() {
        use crate::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
        for window in [None, Some(4)] {
            let (model, weights) = small(false, window);
            let cost = CostModel::new(&model.config, Some(&weights));
            for kv_policy in [KvPolicy::Exact, KvPolicy::FastKv] {
                for (gate, threshold) in [
                    (GateKind::Confidence, 2.0),
                    (GateKind::Arla, 0.5),
                    (GateKind::Entropy, 0.2),
                    (GateKind::Confidence, 0.0),
                ] {
                    let options = EarlyExitOptions {
                        max_new_tokens: 16,
                        stop_tokens: vec![],
                        gate,
                        threshold: threshold.into(),
                        kv_policy,
                        sampling: None,
                    };
                    let prompt = [2u32, 7, 1];
                    let out = early_exit_generate(M2r2::new(&model, &weights), &prompt, &options)
                        .unwrap();
                    let predicted = cost.early_exit(prompt.len(), &out.trace, kv_policy);
                    assert_eq!(
                        out.work, predicted,
                        "{kv_policy} {gate} >= {threshold}, window {window:?}"
                    );
                }
            }
        }
    }

    /// Self-speculation: the draft and verify work counted by the reference backend equals the cost
    /// model's prediction from the rounds alone (dense; fixed and dynamic drafts, every draft gate).
    #[test]
    fn speculative_counts_equal_the_model() {
        let (model, plain) = small(false, None);
        // Also with a pruned draft head: its K rows are counted instead of V.
        let pruned = M2r2Weights {
            draft_head: Some(
                crate::m2r2::draft_head::DraftHead::new(vec![1, 4, 9, 30], 50, "t").unwrap(),
            ),
            ..plain.clone()
        };
        // And with a bridge at both sites: its norm and products are counted per proposal.
        let bridged = plain
            .clone()
            .with_bridge(
                &model.config,
                crate::m2r2::bridge::BridgeConfig::new(
                    1,
                    2,
                    crate::m2r2::bridge::BridgeSite::ALL.to_vec(),
                ),
                5,
                0.5,
            )
            .unwrap();
        for weights in [&plain, &pruned, &bridged] {
            speculative_counts_for(&model, weights);
        }
    }

    fn speculative_counts_for(model: &Model, weights: &M2r2Weights) {
        let (model, weights) = (model, weights.clone());
        let cost = CostModel::new(&model.config, Some(&weights));
        let dense = |d: DraftLength, gate: usize| {
            let kind = match &d {
                DraftLength::Dynamic { gate, .. } => Some(*gate),
                DraftLength::Fixed(_) => None,
            };
            let mut backend =
                ReferenceSpeculation::new(M2r2::new(model, &weights), gate, kind, 64).unwrap();
            let options = SpeculativeOptions {
                max_new_tokens: 20,
                stop_tokens: vec![],
                draft_length: d,
                sampling: None,
            };
            let out = speculative_generate(&mut backend, &[3, 1, 4], &options).unwrap();
            let predicted = cost.speculative(&out.rounds, gate, kind == Some(GateKind::Arla));
            assert_eq!(backend.work(), predicted, "gate {gate} kind {kind:?}");
            assert!(backend.len() > 3);
        };
        for gate in 1..=weights.config.num_gates() {
            dense(DraftLength::Fixed(3), gate);
            dense(
                DraftLength::Dynamic {
                    max: 4,
                    gate: GateKind::Confidence,
                    threshold: 0.3,
                },
                gate,
            );
            dense(
                DraftLength::Dynamic {
                    max: 4,
                    gate: GateKind::Arla,
                    threshold: 0.5,
                },
                gate,
            );
        }
    }
}
