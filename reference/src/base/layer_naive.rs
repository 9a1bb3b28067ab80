//! One decoder layer as its equations: one row (one token of one sequence), the slow stream only,
//! one thread, no work counting. [`DecoderLayer::forward_batch`](super::layer::DecoderLayer)
//! computes the same thing for many rows and sequences at once, with fast rows beside them, SIMD
//! kernels, threads and FLOP counting; the tests check that the two give the same bits
//! (`base/model_naive.rs`).
//!
//! Layer `l` on the residual `s` (`[D]`) of the token at position `p`:
//!
//! ```text
//! h      = RMSNorm(s; w_attn) = w_attn * s / sqrt(mean(s^2) + eps)           [D]
//! q      = W_q h (+ b_q),  k = W_k h (+ b_k),  v = W_v h (+ b_v)            [H*Dh], [Hkv*Dh] x2
//! q, k   = RoPE(q, p), RoPE(k, p)                                           every head rotated
//! cache_l[p] = (k, v)                                                       written before attending
//! o_h    = sum_{j=lo..=p} softmax_j(q_h . k_j^{g(h)} / sqrt(Dh)) v_j^{g(h)}  query head h     [Dh]
//! s     += W_o [o_1 .. o_H] (+ b_o)                                         [D]
//! h      = RMSNorm(s; w_mlp)
//! s     += W_down (silu(W_gate h) * W_up h)                                 dense SwiGLU MLP
//!       or sum_{e in top_k(softmax(W_router h))} p̂_e SwiGLU_e(h)            MoE, experts ascending
//! ```
//!
//! `g(h) = h / (H / Hkv)` is the key/value head that query head `h` reads (grouped-query
//! attention); `lo = 0`, or `p + 1 - w` with a sliding window `w`; `p̂` are the top-k
//! probabilities renormalised to sum to one.
//!
//! Bitwise equal to the fast layer, not merely close: every product here is one [`dot`] in the
//! crate's one summation order (which `matmul::linear`'s SIMD kernels keep, tested), attention is
//! [`attend_naive`] (which `attention::attend` equals bit for bit, tested), and the norms, RoPE,
//! SiLU and softmax are the same row-wise f32 expressions. A chunk of rows gives each row the bits
//! it gets alone (batch invariance), so running a sequence here one token at a time reproduces a
//! chunked forward exactly.

use crate::base::attention::{attend_naive, window_start};
use crate::base::kv_cache::KvCache;
use crate::base::matmul::dot;
use crate::base::model::Model;
use crate::base::moe::{Routing, top_k};
use crate::base::ops::{rms_norm_inplace, silu, softmax_inplace};
use crate::base::weights::{FeedForward, Linear, Mlp, Moe};
use ndarray::{Array1, ArrayView2, Axis, s};

/// Layer `l` of the base model on the slow row `s` of the token at position `p`, in place. Writes
/// the row's key and value into `cache` at `p` (positions before `p` must be there already) and
/// returns the experts it chose in MoE layers.
///
/// # Shapes
/// - `s`: `[D]`
pub fn layer_naive(
    model: &Model,
    l: usize,
    s: &mut Array1<f32>,
    p: usize,
    cache: &mut KvCache,
) -> Option<Routing> {
    let (config, w) = (&model.config, &model.weights.layers[l]);
    let eps = config.rms_norm_eps as f32;
    let freqs = model.rope().frequencies();

    // attention rmsnorm
    let h = rms_norm_row(s, &w.attn_norm, eps); // [D]
    // qkv matmuls, then RoPE at p
    let mut q = project(&w.attn.q, &h); // [H*Dh]
    let mut k = project(&w.attn.k, &h); // [Hkv*Dh]
    let v = project(&w.attn.v, &h); // [Hkv*Dh]
    rope(&mut q, p, freqs, config.head_dim);
    rope(&mut k, p, freqs, config.head_dim);
    // The slow stream writes its key and value first, then attends over lo..=p, itself included.
    cache.write(l, p, row(&k), row(&v));
    let (keys, values) = cache.layer(l, p + 1);
    let visible = s![window_start(config, p)..=p, ..];
    let o = attend_naive(
        config,
        q.view(),
        keys.slice(visible),
        values.slice(visible),
        None,
    ); // [H*Dh]
    // output projection, residual
    *s += &project(&w.attn.o, &o);

    // ffn rmsnorm, then the MLP or the routed experts, residual
    let h = rms_norm_row(s, &w.mlp_norm, eps); // [D]
    match &w.ffn {
        FeedForward::Dense(mlp) => {
            *s += &swiglu(mlp, &h);
            None
        }
        FeedForward::Moe(moe) => {
            let probs = router_probs(moe, &h); // [E]
            let routing = top_k(probs.as_slice().expect("owned vector"), moe.top_k);
            *s += &mix_experts_row(moe, &h, &routing);
            Some(routing)
        }
    }
}

/// `y = W x (+ b)`: output `o` is one [`dot`] of `x` with row `o` of `W`, plus its bias (or
/// `0.0`, as `matmul::linear_naive` adds).
///
/// # Shapes
/// - `w`: `[out, in]`, `b`: `[out]`, `x`: `[in]` -> `[out]`
pub fn matvec(w: ArrayView2<f32>, b: Option<&Array1<f32>>, x: &Array1<f32>) -> Array1<f32> {
    let x = x.as_slice().expect("owned vector");
    w.rows()
        .into_iter()
        .enumerate()
        .map(|(o, w_o)| {
            dot(x, w_o.as_slice().expect("row-major weights")) + b.map_or(0.0, |b| b[o])
        })
        .collect()
}

/// A projection `W x (+ b)` with PyTorch's `nn.Linear` layout.
///
/// # Shapes
/// - `x`: `[in]` -> `[out]`
pub fn project(lin: &Linear, x: &Array1<f32>) -> Array1<f32> {
    matvec(lin.w.view(), lin.b.as_ref(), x)
}

/// `RMSNorm(x; w) = w * x / sqrt(mean(x^2) + eps)`.
///
/// # Shapes
/// - `x`, `w`: `[D]` -> `[D]`
pub fn rms_norm_row(x: &Array1<f32>, w: &Array1<f32>, eps: f32) -> Array1<f32> {
    let mut h = x.clone();
    rms_norm_inplace(h.view_mut(), w, eps);
    h
}

/// RoPE at position `p`, every head of `x` in place (HF's rotate-half): with `x1`, `x2` the halves
/// of a head and `a_i = p * f_i`, `x1' = x1 cos a - x2 sin a`, `x2' = x2 cos a + x1 sin a`.
///
/// # Shapes
/// - `x`: `[heads * Dh]`, `freqs`: `[Dh/2]`
pub fn rope(x: &mut Array1<f32>, p: usize, freqs: &[f32], head_dim: usize) {
    let half = head_dim / 2;
    for head in x
        .as_slice_mut()
        .expect("owned vector")
        .chunks_exact_mut(head_dim)
    {
        for (i, &f) in freqs.iter().enumerate() {
            let angle = p as f32 * f; // PyTorch: position_ids.float() * inv_freq, in f32
            let (cos, sin) = (angle.cos(), angle.sin());
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * cos - x2 * sin;
            head[i + half] = x2 * cos + x1 * sin;
        }
    }
}

/// The SwiGLU MLP: `W_down (silu(W_gate h) * W_up h)`.
///
/// # Shapes
/// - `h`: `[D]` -> `[D]` (through `[I]`)
pub fn swiglu(mlp: &Mlp, h: &Array1<f32>) -> Array1<f32> {
    let gate = project(&mlp.gate, h); // [I]
    let up = project(&mlp.up, h); // [I]
    let a = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
    project(&mlp.down, &a)
}

/// The router's probabilities over all experts: `softmax(W_router h)`.
///
/// # Shapes
/// - `h`: `[D]` -> `[E]`
pub fn router_probs(moe: &Moe, h: &Array1<f32>) -> Array1<f32> {
    let mut probs = matvec(moe.router.view(), None, h);
    softmax_inplace(probs.view_mut());
    probs
}

/// `sum_e p̂_e SwiGLU_e(h)` over the experts `routing` chose, summed in ascending expert index
/// (HF's `index_add_` loop), whatever order the routing lists them in.
///
/// # Shapes
/// - `h`: `[D]` -> `[D]`
pub fn mix_experts_row(moe: &Moe, h: &Array1<f32>, routing: &Routing) -> Array1<f32> {
    let mut y = Array1::zeros(h.len());
    for (e, expert) in moe.experts.iter().enumerate() {
        if let Some(i) = routing.experts.iter().position(|&chosen| chosen == e) {
            y.scaled_add(routing.weights[i], &swiglu(expert, h));
        }
    }
    y
}

/// A vector as a one-row matrix (what the cache stores rows of).
fn row(x: &Array1<f32>) -> ArrayView2<'_, f32> {
    x.view().insert_axis(Axis(0))
}
