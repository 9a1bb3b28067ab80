//! One decoder layer over a chunk of rows of both residual streams (spec sections 1, 2 and 7).
//!
//! Slow rows are the base model: `T` consecutive positions `pos0..pos0+T`, and they write their K/V
//! into the cache. Fast rows (M2R2's accelerated stream) ride along: fast row `i` belongs to the token
//! of slow row `slot[i]`, uses the same base weights plus its layer's accelerator adapter, and
//! attends to the cached SLOW keys/values of earlier positions plus its own key/value; it never writes
//! the cache. In MoE layers a fast row uses the experts its slow row chose.
//!
//! FLOPs-aware (spec section 7): slow and fast rows are stacked into one matrix, so each weight
//! matrix is read once for both streams; adapter terms are computed for the fast rows only.
//! With no fast rows this is exactly the base model's layer.
//!
//! ```text
//! h      = RMSNorm([s; f])                              [T+Tf, D]
//! q,k,v  = h W^T (+ scale * h_f A^T B^T on fast rows)   RoPE at each row's position
//! s     += o_proj(attn(q_s | cache[..=p]))              (slow K/V written at p first)
//! f     += o_proj(attn(q_f | cache[..p] + own k_f,v_f)) (+ adapter)
//! h      = RMSNorm([s; f]);  s, f += FFN(h)             (adapters on fast rows; MoE: slow's experts)
//! ```

use crate::accelerator::Accelerator;
use crate::attention::{attend, window_start};
use crate::cost::Work;
use crate::kv_cache::KvCache;
use crate::m2r2_config::Target;
use crate::matmul::linear;
use crate::model::Model;
use crate::moe::{Routing, mix_experts, route, top_k_of};
use crate::ops::{rms_norm, softmax_inplace, swiglu_inplace};
use crate::weight_names::{AttnProj, MlpProj};
use crate::weights::{FeedForward, Linear};
use ndarray::{Array1, Array2, ArrayView2, Axis, concatenate, s};
use rayon::prelude::*;
use std::cell::Cell;

/// The fast rows entering a layer together with the slow chunk.
pub struct FastRows<'a> {
    /// `[Tf, D]` fast residual rows, updated in place
    pub f: &'a mut Array2<f32>,
    /// For each fast row, the index (within the chunk) of the slow row of the same token.
    pub slot: &'a [usize],
    /// Adapters of the fast stream (`None`: base weights only, the fast stream then equals the slow).
    pub accelerator: Option<&'a Accelerator>,
}

/// What a layer call produced besides the updated rows.
#[derive(Clone, Debug)]
pub struct LayerOutput {
    /// The slow rows' expert routing (MoE layers).
    pub routing: Option<Vec<Routing>>,
    /// The work done, counted from the shapes actually multiplied (checked against `cost::CostModel`).
    pub work: Work,
}

/// Run layer `l` on slow rows `s` (positions `pos0..pos0+T`) and optional fast rows, in place.
///
/// # Shapes
/// - `s`: `[T, D]`, `fast.f`: `[Tf, D]`
pub fn decoder_layer(
    model: &Model,
    l: usize,
    s: &mut Array2<f32>,
    pos0: usize,
    cache: &mut KvCache,
    fast: Option<FastRows<'_>>,
) -> LayerOutput {
    let config = &model.config;
    let layer = &model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    let ts = s.nrows();
    let (mut f_empty, no_slot) = (Array2::zeros((0, config.hidden_size)), [0usize; 0]);
    let (f, slot, accelerator) = match fast {
        Some(fr) => (fr.f, fr.slot, fr.accelerator),
        None => (&mut f_empty, &no_slot[..], None),
    };
    let work = Cell::new(Work::read(2 * config.hidden_size)); // the two norm weights
    let count = |w: Work| work.set(work.get() + w);
    // Base weights on all rows, plus the adapter term on the fast rows (rows ts..).
    let project = |lin: &Linear, target: Target, h: ArrayView2<f32>| -> Array2<f32> {
        let mut y = linear(h, lin.w.view(), lin.b.as_ref());
        count(Work::matmul(
            h.nrows(),
            lin.w.nrows(),
            lin.w.ncols(),
            lin.b.is_some(),
        ));
        if let Some(acc) = accelerator
            && let Some(delta) = acc.delta(l, target, h.slice(s![ts.., ..]))
        {
            let lora = acc.lora(l, target).expect("delta came from this adapter");
            let fast_rows = h.nrows() - ts;
            count(Work::matmul(
                fast_rows,
                lora.a.nrows(),
                lora.a.ncols(),
                false,
            ));
            count(Work::matmul(
                fast_rows,
                lora.b.nrows(),
                lora.b.ncols(),
                false,
            ));
            let mut fast_part = y.slice_mut(s![ts.., ..]);
            fast_part += &delta;
        }
        y
    };

    // attention rmsnorm, qkv matmuls (one weight read for both streams)
    let h = stack(
        rms_norm(s.view(), &layer.attn_norm, eps),
        rms_norm(f.view(), &layer.attn_norm, eps),
    );
    let attn = &layer.attn;
    let mut q = project(&attn.q, Target::Attn(AttnProj::Q), h.view()); // [T+Tf, H*Dh]
    let mut k = project(&attn.k, Target::Attn(AttnProj::K), h.view()); // [T+Tf, Hkv*Dh]
    let v = project(&attn.v, Target::Attn(AttnProj::V), h.view()); // [T+Tf, Hkv*Dh]
    let position = |row: usize| {
        if row < ts {
            pos0 + row
        } else {
            pos0 + slot[row - ts]
        }
    };
    for row in 0..ts + slot.len() {
        let p = position(row);
        model
            .rope()
            .apply(q.slice_mut(s![row..row + 1, ..]), p, config.head_dim);
        model
            .rope()
            .apply(k.slice_mut(s![row..row + 1, ..]), p, config.head_dim);
    }
    // Only the slow stream writes the cache (spec section 2).
    cache.write(l, pos0, k.slice(s![..ts, ..]), v.slice(s![..ts, ..]));
    let (keys, values) = cache.layer(l, pos0 + ts);
    let ctx_rows: Vec<Array1<f32>> = (0..ts + slot.len())
        .into_par_iter()
        .map(|row| {
            let p = position(row);
            let lo = window_start(config, p);
            if row < ts {
                // slow row: cached keys lo..=p, its own included (p + 1 - lo keys, as for fast rows)
                attend(
                    config,
                    q.row(row),
                    keys.slice(s![lo..=p, ..]),
                    values.slice(s![lo..=p, ..]),
                    None,
                )
            } else {
                // fast row: slow keys lo..p, then its own key/value at p
                let own = (k.row(row), v.row(row));
                attend(
                    config,
                    q.row(row),
                    keys.slice(s![lo..p, ..]),
                    values.slice(s![lo..p, ..]),
                    Some(own),
                )
            }
        })
        .collect();
    for row in 0..ts + slot.len() {
        let p = position(row);
        count(Work::attention(config, p + 1 - window_start(config, p)));
    }
    let ctx = from_rows(&ctx_rows, config.q_dim()); // [T+Tf, H*Dh]
    let o = project(&attn.o, Target::Attn(AttnProj::O), ctx.view());
    *s += &o.slice(s![..ts, ..]);
    *f += &o.slice(s![ts.., ..]);

    // ffn rmsnorm, ffn
    let h = stack(
        rms_norm(s.view(), &layer.mlp_norm, eps),
        rms_norm(f.view(), &layer.mlp_norm, eps),
    );
    let (y, routing) = match &layer.ffn {
        FeedForward::Dense(m) => {
            let mut gate = project(&m.gate, Target::Mlp(MlpProj::Gate), h.view()); // [T+Tf, I]
            let up = project(&m.up, Target::Mlp(MlpProj::Up), h.view());
            swiglu_inplace(&mut gate, &up);
            (
                project(&m.down, Target::Mlp(MlpProj::Down), gate.view()),
                None,
            )
        }
        FeedForward::Moe(moe) => {
            let slow_routing = route(moe, h.slice(s![..ts, ..]));
            count(Work::matmul(
                h.nrows(),
                moe.router.nrows(),
                moe.router.ncols(),
                false,
            ));
            // Fast rows: the slow row's experts, mixed by the fast row's own router probabilities
            // renormalised over those experts (spec section 1).
            let mut all = slow_routing.clone();
            if !slot.is_empty() {
                let mut probs = linear(h.slice(s![ts.., ..]), moe.router.view(), None); // [Tf, E]
                for (i, mut p) in probs.rows_mut().into_iter().enumerate() {
                    softmax_inplace(p.view_mut());
                    let chosen = &slow_routing[slot[i]].experts;
                    all.push(top_k_of(p.as_slice().expect("contiguous"), chosen));
                }
            }
            let expert = &moe.experts[0];
            let per_row = expert.gate.w.len() + expert.up.w.len() + expert.down.w.len();
            let used = (0..moe.experts.len())
                .filter(|e| all.iter().any(|r| r.experts.contains(e)))
                .count();
            let assignments: usize = all.iter().map(|r| r.experts.len()).sum();
            count(Work {
                weight_macs: (assignments * per_row) as u64,
                ..Work::read(used * per_row)
            });
            (mix_experts(moe, h.view(), &all), Some(slow_routing))
        }
    };
    *s += &y.slice(s![..ts, ..]);
    *f += &y.slice(s![ts.., ..]);
    LayerOutput {
        routing,
        work: work.get(),
    }
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
