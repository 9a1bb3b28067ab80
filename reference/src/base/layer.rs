//! One decoder layer over a chunk of rows of both residual streams (docs/m2r2/streams.md,
//! shared_kv.md and cost.md). Its equations for one row are `base/layer_naive.rs` (tested bitwise
//! equal); the work it reports is counted beside it, in `base/layer_work.rs`.
//!
//! Slow rows are the base model: `T` consecutive positions `pos0..pos0+T`, and they write their K/V
//! into the cache. Fast rows (M2R2's accelerated stream) ride along: fast row `i` belongs to the token
//! of slow row `slot[i]`, uses the same base weights plus its layer's accelerator adapter, and
//! attends to the cached SLOW keys/values of earlier positions plus its own key/value; it never writes
//! the cache. In MoE layers a fast row uses the experts its slow row chose.
//!
//! A sequence's rows may also be nodes of a token tree ([`TreeRows`], `base/tree.rs`): each at its
//! node's position, its K/V in its node's scratch slot, attending to the cache before the tree and
//! its ancestors only. A chain of nodes is exactly a chunk.
//!
//! FLOPs-aware: slow and fast rows are stacked into one matrix, so each weight matrix is read once
//! for both streams; adapter terms are computed for the fast rows only. With no fast rows this is
//! exactly the base model's layer.
//!
//! ```text
//! h      = RMSNorm([s; f])                              [T+Tf, D]
//! q,k,v  = h W^T (+ scale * h_f A^T B^T on fast rows)   RoPE at each row's position
//! s     += o_proj(attn(q_s | cache[..=p]))              (slow K/V written at p first)
//! f     += o_proj(attn(q_f | cache[..p] + own k_f,v_f)) (+ adapter)
//! h      = RMSNorm([s; f]);  s, f += FFN(h)             (adapters on fast rows; MoE: slow's experts)
//! ```

use crate::base::attention::{attend, attend_rows, window_start};
use crate::base::config::ModelConfig;
use crate::base::kv_cache::KvCache;
use crate::base::matmul::{linear, linear_many};
use crate::base::mlp::swiglu_mlp;
use crate::base::moe::{Routing, mix_experts, route, top_k_of};
use crate::base::ops::{rms_norm, softmax_inplace};
use crate::base::rope::Rope;
use crate::base::tree::TokenTree;
use crate::base::weight_names::{AttnProj, Target};
use crate::base::weights::{FeedForward, Layer, Linear, Moe};
use crate::base::work::Work;
use ndarray::{Array1, Array2, ArrayView2, Axis, concatenate, s};
use rayon::prelude::*;

/// Low-rank terms added to the fast rows' projections. M2R2's accelerator adapters
/// (`m2r2::accelerator::Accelerator`) implement it; the base model never needs one.
pub trait FastAdapter: Sync {
    /// The term added to projection `target` of layer `layer` for the fast input rows `x`; `None`
    /// where that projection has no adapter.
    ///
    /// # Shapes
    /// - `x`: `[Tf, in]` -> `[Tf, out]`
    fn delta(&self, layer: usize, target: Target, x: ArrayView2<f32>) -> Option<Array2<f32>>;

    /// The rank `r` of that term (`x A^T` with `A: [r, in]`, then `B: [out, r]`), `None` where
    /// there is none: what `base::layer_work` counts.
    fn rank(&self, layer: usize, target: Target) -> Option<usize>;
}

/// The fast rows entering a layer together with the slow chunk.
pub struct FastRows<'a> {
    /// `[Tf, D]` fast residual rows, updated in place
    pub f: &'a mut Array2<f32>,
    /// For each fast row, the index (within the chunk) of the slow row of the same token.
    pub slot: &'a [usize],
    /// Adapters of the fast stream (`None`: base weights only, the fast stream then equals the slow).
    pub adapter: Option<&'a dyn FastAdapter>,
}

/// What a layer call produced besides the updated rows.
#[derive(Clone, Debug)]
pub struct LayerOutput {
    /// The slow rows' expert routing (MoE layers).
    pub routing: Option<Vec<Routing>>,
    /// The work done, counted from the shapes multiplied (`base::layer_work`; checked against
    /// `m2r2::cost`).
    pub work: Work,
}

/// Decoder layer `index` with what it reads: the config, its weights and the RoPE tables.
#[derive(Clone, Copy)]
pub struct DecoderLayer<'a> {
    pub config: &'a ModelConfig,
    pub index: usize,
    pub weights: &'a Layer,
    pub rope: &'a Rope,
}

/// Multiplies `[slow; fast]` rows by a projection's weights: the base weight on every row (one
/// weight read for both streams), the adapter term on the fast rows only.
struct Projector<'a> {
    layer: usize,
    /// Rows `..slow` are slow, the rest fast.
    slow: usize,
    adapter: Option<&'a dyn FastAdapter>,
}

impl Projector<'_> {
    fn project(&self, lin: &Linear, target: Target, h: ArrayView2<f32>) -> Array2<f32> {
        let y = linear(h, lin.w.view(), lin.b.as_ref());
        self.finish(target, h, y)
    }

    /// [`Projector::project`] for several weights of the same rows in one parallel section
    /// (`matmul::linear_many`).
    fn project_many(&self, lins: &[(&Linear, Target)], h: ArrayView2<f32>) -> Vec<Array2<f32>> {
        let args: Vec<_> = lins
            .iter()
            .map(|(lin, _)| (lin.w.view(), lin.b.as_ref()))
            .collect();
        linear_many(h, &args)
            .into_iter()
            .zip(lins)
            .map(|(y, &(_, target))| self.finish(target, h, y))
            .collect()
    }

    /// Add the adapter term to the fast rows of the base product `y = h W^T`.
    fn finish(&self, target: Target, h: ArrayView2<f32>, mut y: Array2<f32>) -> Array2<f32> {
        if let Some(adapter) = self.adapter
            && let Some(delta) = adapter.delta(self.layer, target, h.slice(s![self.slow.., ..]))
        {
            let mut fast_part = y.slice_mut(s![self.slow.., ..]);
            fast_part += &delta;
        }
        y
    }
}

/// One sequence's slow rows in a batch of independent sequences (batched decoding): `rows`
/// consecutive rows of the stacked slow chunk at positions `pos0..pos0+rows`, whose K/V go into
/// its own `cache`; or, with `tree`, nodes of a token tree whose root sits at `pos0`.
pub struct Sequence<'a> {
    pub rows: usize,
    pub pos0: usize,
    pub cache: &'a mut KvCache,
    pub tree: Option<TreeRows<'a>>,
}

/// The rows of a [`Sequence`] as nodes `first..first + rows` of a token tree whose root sits at
/// position `pos0` (`base/tree.rs`): node `i` at position `pos0 + depth(i)`, its K/V written to
/// slot `pos0 + i`, attending to `cache[lo..pos0]` and its ancestors' slots (the nodes before
/// `first` written by earlier calls).
#[derive(Clone, Copy)]
pub struct TreeRows<'a> {
    pub tree: &'a TokenTree,
    pub first: usize,
}

impl Sequence<'_> {
    /// The first cache row the sequence writes (its rows write `rows` consecutive ones).
    fn first_slot(&self) -> usize {
        self.pos0 + self.tree.map_or(0, |tr| tr.first)
    }

    /// The position of row `t`.
    fn position(&self, t: usize) -> usize {
        match self.tree {
            None => self.pos0 + t,
            Some(tr) => tr.tree.position(tr.first + t, self.pos0),
        }
    }
}

impl DecoderLayer<'_> {
    /// Run the layer on slow rows `s` (positions `pos0..pos0+T`) and optional fast rows, in place.
    ///
    /// # Shapes
    /// - `s`: `[T, D]`, `fast.f`: `[Tf, D]`
    pub fn forward(
        &self,
        s: &mut Array2<f32>,
        pos0: usize,
        cache: &mut KvCache,
        fast: Option<FastRows<'_>>,
    ) -> LayerOutput {
        let seq = Sequence {
            rows: s.nrows(),
            pos0,
            cache,
            tree: None,
        };
        self.forward_batch(s, &mut [seq], fast)
    }

    /// [`DecoderLayer::forward`] on rows that are nodes of a token tree whose root sits at `pos0`
    /// ([`TreeRows`]), in place: every row's output is bitwise the one it gets in a
    /// one-token-at-a-time decode of its root-to-node path after the same cache.
    ///
    /// # Shapes
    /// - `s`: `[T, D]` (nodes `tree.first..tree.first+T`), `fast.f`: `[Tf, D]`
    pub fn forward_tree(
        &self,
        s: &mut Array2<f32>,
        pos0: usize,
        tree: TreeRows<'_>,
        cache: &mut KvCache,
        fast: Option<FastRows<'_>>,
    ) -> LayerOutput {
        debug_assert!(tree.first + s.nrows() <= tree.tree.nodes());
        let tree = Some(tree);
        let seq = Sequence {
            rows: s.nrows(),
            pos0,
            cache,
            tree,
        };
        self.forward_batch(s, &mut [seq], fast)
    }

    /// Run the layer on the slow rows of several independent sequences stacked in `s` (sequence
    /// after sequence, as `seqs` lists them) and optional fast rows (`slot` indexes the stacked
    /// rows), in place. Every row sees only its own sequence's cache; the projections multiply all
    /// rows at once, so each weight is read once for the batch, and batch invariance
    /// (`matmul::linear`) makes every row's result bitwise what it is alone.
    ///
    /// # Shapes
    /// - `s`: `[sum(rows), D]`, `fast.f`: `[Tf, D]`
    pub fn forward_batch(
        &self,
        s: &mut Array2<f32>,
        seqs: &mut [Sequence<'_>],
        fast: Option<FastRows<'_>>,
    ) -> LayerOutput {
        let (config, layer) = (self.config, self.weights);
        let eps = config.rms_norm_eps as f32;
        let ts = s.nrows();
        debug_assert_eq!(seqs.iter().map(|q| q.rows).sum::<usize>(), ts);
        let (mut f_empty, no_slot) = (Array2::zeros((0, config.hidden_size)), [0usize; 0]);
        let (f, slot, adapter) = match fast {
            Some(fr) => (fr.f, fr.slot, fr.adapter),
            None => (&mut f_empty, &no_slot[..], None),
        };
        let p = Projector {
            layer: self.index,
            slow: ts,
            adapter,
        };
        // (sequence, row within it, position) of each slow row; a fast row sits at its slow row's.
        let slow_at: Vec<(usize, usize, usize)> = seqs
            .iter()
            .enumerate()
            .flat_map(|(i, q)| (0..q.rows).map(move |t| (i, t, q.position(t))))
            .collect();
        let at = |row: usize| slow_at[if row < ts { row } else { slot[row - ts] }];

        // attention: h = RMSNorm([s; f]); q, k, v with RoPE at each row's position
        let h = stack(
            rms_norm(s.view(), &layer.attn_norm, eps),
            rms_norm(f.view(), &layer.attn_norm, eps),
        );
        let attn = &layer.attn;
        let qkv = [
            (&attn.q, Target::Attn(AttnProj::Q)),
            (&attn.k, Target::Attn(AttnProj::K)),
            (&attn.v, Target::Attn(AttnProj::V)),
        ];
        // [T+Tf, H*Dh], [T+Tf, Hkv*Dh] twice
        let [mut q, mut k, v]: [Array2<f32>; 3] = p
            .project_many(&qkv, h.view())
            .try_into()
            .expect("three projections");
        for row in 0..ts + slot.len() {
            let rows = s![row..row + 1, ..];
            let pos = at(row).2;
            self.rope.apply(q.slice_mut(rows), pos, config.head_dim);
            self.rope.apply(k.slice_mut(rows), pos, config.head_dim);
        }
        // Only the slow stream writes the cache; fast rows read it (docs/m2r2/shared_kv.md).
        let mut first = 0;
        for q in seqs.iter_mut() {
            let rows = s![first..first + q.rows, ..];
            q.cache
                .write(self.index, q.first_slot(), k.slice(rows), v.slice(rows));
            first += q.rows;
        }
        let caches: Vec<_> = seqs
            .iter()
            .map(|q| q.cache.layer(self.index, q.first_slot() + q.rows))
            .collect();
        let trees: Vec<_> = seqs.iter().map(|q| (q.pos0, q.tree)).collect();
        let ctx_rows: Vec<Array1<f32>> = (0..ts + slot.len())
            .into_par_iter()
            .map(|row| {
                let (seq, t, pos) = at(row);
                let (keys, values) = caches[seq];
                let lo = window_start(config, pos);
                let slow = row < ts;
                // a fast row's own key/value, at pos: it never writes the cache
                let own = (!slow).then(|| (k.row(row), v.row(row)));
                match trees[seq] {
                    (_, None) => {
                        // cached keys lo..=pos (a slow row: its own included), lo..pos (a fast row)
                        let visible = s![lo..pos + usize::from(slow), ..];
                        attend(
                            config,
                            q.row(row),
                            keys.slice(visible),
                            values.slice(visible),
                            own,
                        )
                    }
                    (root, Some(tr)) => {
                        // cached keys lo..root, then the path's slots (base/tree.rs)
                        let visible = tr.tree.key_slots(tr.first + t, root, lo, slow);
                        attend_rows(config, q.row(row), keys, values, &visible, own)
                    }
                }
            })
            .collect();
        let ctx = from_rows(&ctx_rows, config.q_dim()); // [T+Tf, H*Dh]
        let o = p.project(&attn.o, Target::Attn(AttnProj::O), ctx.view());
        *s += &o.slice(s![..ts, ..]);
        *f += &o.slice(s![ts.., ..]);

        // feed-forward: h = RMSNorm([s; f]); s, f += FFN(h)
        let h = stack(
            rms_norm(s.view(), &layer.mlp_norm, eps),
            rms_norm(f.view(), &layer.mlp_norm, eps),
        );
        let (y, routing) = match &layer.ffn {
            FeedForward::Dense(mlp) => {
                let y = swiglu_mlp(mlp, h.view(), |lins, x| {
                    let lins: Vec<_> = lins.iter().map(|&(l, m)| (l, Target::Mlp(m))).collect();
                    p.project_many(&lins, x)
                });
                (y, None)
            }
            FeedForward::Moe(moe) => {
                let (y, slow_routing) = moe_block(moe, h.view(), slot);
                (y, Some(slow_routing))
            }
        };
        *s += &y.slice(s![..ts, ..]);
        *f += &y.slice(s![ts.., ..]);
        let slow_positions: Vec<usize> = slow_at.iter().map(|&(_, _, pos)| pos).collect();
        let work = self.work(&slow_positions, slot, adapter, routing.as_deref());
        LayerOutput { routing, work }
    }
}

/// The sparse MoE block on `[slow; fast]` rows: slow rows route themselves; fast row `i` uses the
/// experts of slow row `slot[i]`, mixed by its own router probabilities renormalised over those
/// experts (docs/m2r2/streams.md). Returns the output and the slow rows' routing.
fn moe_block(moe: &Moe, h: ArrayView2<f32>, slot: &[usize]) -> (Array2<f32>, Vec<Routing>) {
    let ts = h.nrows() - slot.len();
    let slow_routing = route(moe, h.slice(s![..ts, ..]));
    let mut all = slow_routing.clone();
    if !slot.is_empty() {
        let mut probs = linear(h.slice(s![ts.., ..]), moe.router.view(), None); // [Tf, E]
        for (i, mut p) in probs.rows_mut().into_iter().enumerate() {
            softmax_inplace(p.view_mut());
            let chosen = &slow_routing[slot[i]].experts;
            all.push(top_k_of(p.as_slice().expect("contiguous"), chosen));
        }
    }
    (mix_experts(moe, h, &all), slow_routing)
}

/// `[a; b]` along rows.
fn stack(a: Array2<f32>, b: Array2<f32>) -> Array2<f32> {
    if b.nrows() == 0 {
        a
    } else {
        concatenate![Axis(0), a, b]
    }
}

fn from_rows(rows: &[Array1<f32>], width: usize) -> Array2<f32> {
    let mut out = Array2::zeros((rows.len(), width));
    for (t, row) in rows.iter().enumerate() {
        out.row_mut(t).assign(row);
    }
    out
}
