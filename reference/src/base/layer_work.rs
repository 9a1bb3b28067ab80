//! What one decoder layer call multiplied, counted from the weights' own shapes, the rows and the
//! experts they chose: the count that `m2r2::cost::CostModel`'s predictions (made from the configs
//! alone) are tested against. It sits beside the layer's forward, not inside it, so the forward
//! reads as the math.
//!
//! Per call with `T` slow rows and `Tf` fast rows (`base::work` has the units):
//!
//! ```text
//! norm weights       2 D read
//! every projection   (T + Tf) x [out, in] MACs, the matrix (and bias) read once
//! adapter terms      Tf x r (in + out) MACs, A and B read once, where the projection has one
//! attention          per row at p: 2 x (p + 1 - lo) x H x Dh MACs
//! MoE                router on every row; k experts per row; each expert any row uses read once
//! ```

use crate::base::attention::window_start;
use crate::base::layer::{DecoderLayer, FastAdapter};
use crate::base::moe::Routing;
use crate::base::weight_names::{AttnProj, MlpProj, Target};
use crate::base::weights::{FeedForward, Linear};
use crate::base::work::Work;

impl DecoderLayer<'_> {
    /// The work of a [`forward_batch`](DecoderLayer::forward_batch) call whose slow rows sit at
    /// `slow_positions`, with a fast row for each slow row listed in `slot` (adapters `adapter`),
    /// and whose slow rows chose the experts `routing` (MoE layers; fast rows use their slow row's).
    pub fn work(
        &self,
        slow_positions: &[usize],
        slot: &[usize],
        adapter: Option<&dyn FastAdapter>,
        routing: Option<&[Routing]>,
    ) -> Work {
        let (layer, config) = (self.weights, self.config);
        let rows = slow_positions.len() + slot.len();
        let fast_positions = slot.iter().map(|&i| slow_positions[i]);
        // a projection on every row, its adapter term on the fast rows
        let projection = |lin: &Linear, target: Target| {
            let (out, inp) = lin.w.dim();
            let base = Work::matmul(rows, out, inp, lin.b.is_some());
            let term = match adapter.and_then(|a| a.rank(self.index, target)) {
                Some(r) => {
                    Work::matmul(slot.len(), r, inp, false)
                        + Work::matmul(slot.len(), out, r, false)
                }
                None => Work::default(),
            };
            base + term
        };
        let attn = &layer.attn;
        let mut work = Work::read(layer.attn_norm.len() + layer.mlp_norm.len())
            + projection(&attn.q, Target::Attn(AttnProj::Q))
            + projection(&attn.k, Target::Attn(AttnProj::K))
            + projection(&attn.v, Target::Attn(AttnProj::V))
            + projection(&attn.o, Target::Attn(AttnProj::O));
        work += slow_positions
            .iter()
            .copied()
            .chain(fast_positions)
            .map(|p| Work::attention(config, p + 1 - window_start(config, p)))
            .sum();
        work += match &layer.ffn {
            FeedForward::Dense(mlp) => {
                projection(&mlp.gate, Target::Mlp(MlpProj::Gate))
                    + projection(&mlp.up, Target::Mlp(MlpProj::Up))
                    + projection(&mlp.down, Target::Mlp(MlpProj::Down))
            }
            FeedForward::Moe(moe) => {
                let routing = routing.expect("a MoE layer's routing");
                let expert = &moe.experts[0];
                let per_expert = expert.gate.w.len() + expert.up.w.len() + expert.down.w.len();
                // every expert some slow row chose (fast rows add none), read once
                let used = (0..moe.experts.len())
                    .filter(|e| routing.iter().any(|r| r.experts.contains(e)))
                    .count();
                let assignments: usize = routing.iter().map(|r| r.experts.len()).sum::<usize>()
                    + slot
                        .iter()
                        .map(|&i| routing[i].experts.len())
                        .sum::<usize>();
                let (e, d) = moe.router.dim();
                Work::matmul(rows, e, d, false)
                    + Work {
                        weight_macs: (assignments * per_expert) as u64,
                        ..Work::read(used * per_expert)
                    }
            }
        };
        work
    }
}
