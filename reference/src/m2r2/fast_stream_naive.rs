//! The fast residual stream as its equations, for one token: the naive twin of
//! [`M2r2::run_interval`] (`m2r2/fast_stream.rs`), written on the naive base layer
//! (`base/layer_naive.rs`); one row per stream, one thread, no work counting. The tests check
//! that it gives the fast path's exit states bit for bit.
//!
//! Interval `j` (code layers `e_j .. e_{j+1}`) for the token at position `p`, slow residual `s`:
//!
//! ```text
//! f = s                                                   the fast row restarts from s_{e_j}
//! for l in e_j .. e_{j+1}:
//!     s = Layer_l(s, p)                                   the base layer; writes cache_l[p]
//!     h = RMSNorm(f; w_attn)
//!     q, k, v = W h + c B (A h)                           adapter term where layer l has one
//!     q, k = RoPE(q, p), RoPE(k, p)
//!     f += W_o attn(q | cache_l[lo..p], (k, v)) + c B (A .)   slow keys before p, then its own
//!     h = RMSNorm(f; w_mlp)
//!     f += W_down (silu(W_gate h + ..) * (W_up h + ..)) + ..   dense, adapters on each map
//!       or sum_{e in slow's experts} p̂_e SwiGLU_e(h)      MoE: the slow row's experts, mixed by
//!                                                         f's own router probabilities renormalised
//! u_{j+1} = f                                             estimates the final residual s_N
//! ```
//!
//! `c = alpha / r` is the adapter's scale (`m2r2/accelerator.rs`). The fast row reads the slow
//! stream's cache and never writes it (docs/m2r2/shared_kv.md).

use crate::base::attention::{attend_naive, window_start};
use crate::base::kv_cache::KvCache;
use crate::base::layer_naive::{
    layer_naive, matvec, mix_experts_row, project, rms_norm_row, rope, router_probs,
};
use crate::base::model_naive::embed_naive;
use crate::base::moe::{Routing, top_k_of};
use crate::base::ops::silu;
use crate::base::weight_names::{AttnProj, MlpProj, Target};
use crate::base::weights::{FeedForward, Linear};
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array1, s};

/// Interval `j` for the token at position `p`: the slow row `s` runs the interval's base layers
/// (writing the cache), the fast row starts from `s` and runs the same layers with their adapters.
/// Returns the fast exit state `u_{j+1}`.
///
/// # Shapes
/// - `s`: `[D]` at `e_j` -> at `e_{j+1}`; returns `[D]`
pub fn interval_naive(
    m2r2: M2r2<'_>,
    j: usize,
    s: &mut Array1<f32>,
    p: usize,
    cache: &mut KvCache,
) -> Array1<f32> {
    let mut f = s.clone();
    for l in m2r2.weights.config.interval_layers(j) {
        let slow_routing = layer_naive(m2r2.model, l, s, p, cache);
        fast_layer_naive(m2r2, l, &mut f, p, cache, slow_routing.as_ref());
    }
    f
}

/// Layer `l` on the fast row `f` of the token at position `p`, in place: the base weights plus
/// the layer's adapter terms; attention over the slow cache before `p` and the row's own key and
/// value; in MoE layers the slow row's experts (`slow_routing`).
///
/// # Shapes
/// - `f`: `[D]`
pub fn fast_layer_naive(
    m2r2: M2r2<'_>,
    l: usize,
    f: &mut Array1<f32>,
    p: usize,
    cache: &KvCache,
    slow_routing: Option<&Routing>,
) {
    let (model, config) = (m2r2.model, &m2r2.model.config);
    let w = &model.weights.layers[l];
    let eps = config.rms_norm_eps as f32;
    let freqs = model.rope().frequencies();
    let adapted = |lin: &Linear, target: Target, x: &Array1<f32>| adapted(m2r2, l, lin, target, x);

    // attention rmsnorm; adapted q, k, v; RoPE at p
    let h = rms_norm_row(f, &w.attn_norm, eps);
    let mut q = adapted(&w.attn.q, Target::Attn(AttnProj::Q), &h); // [H*Dh]
    let mut k = adapted(&w.attn.k, Target::Attn(AttnProj::K), &h); // [Hkv*Dh]
    let v = adapted(&w.attn.v, Target::Attn(AttnProj::V), &h); // [Hkv*Dh]
    rope(&mut q, p, freqs, config.head_dim);
    rope(&mut k, p, freqs, config.head_dim);
    // The slow keys and values of lo..p (read, never written), then the row's own at p.
    let (keys, values) = cache.layer(l, p);
    let visible = s![window_start(config, p)..p, ..];
    let o = attend_naive(
        config,
        q.view(),
        keys.slice(visible),
        values.slice(visible),
        Some((k.view(), v.view())),
    ); // [H*Dh]
    *f += &adapted(&w.attn.o, Target::Attn(AttnProj::O), &o);

    // ffn rmsnorm; the adapted MLP, or the slow row's experts
    let h = rms_norm_row(f, &w.mlp_norm, eps);
    match &w.ffn {
        FeedForward::Dense(mlp) => {
            let gate = adapted(&mlp.gate, Target::Mlp(MlpProj::Gate), &h); // [I]
            let up = adapted(&mlp.up, Target::Mlp(MlpProj::Up), &h); // [I]
            let a = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
            *f += &adapted(&mlp.down, Target::Mlp(MlpProj::Down), &a);
        }
        FeedForward::Moe(moe) => {
            let slow = slow_routing.expect("a MoE layer's slow row chose experts");
            let probs = router_probs(moe, &h); // [E]
            let routing = top_k_of(probs.as_slice().expect("owned vector"), &slow.experts);
            *f += &mix_experts_row(moe, &h, &routing);
        }
    }
}

/// `W x (+ b) + c B (A x)`: a projection of a fast row, with layer `l`'s adapter term on `target`
/// where it has one.
///
/// # Shapes
/// - `x`: `[in]` -> `[out]`
pub fn adapted(
    m2r2: M2r2<'_>,
    l: usize,
    lin: &Linear,
    target: Target,
    x: &Array1<f32>,
) -> Array1<f32> {
    let mut y = project(lin, x);
    let accelerator = &m2r2.weights.accelerator;
    if let Some(lora) = accelerator.lora(l, target) {
        let c = accelerator.scale(lora);
        let ax = matvec(lora.a().view(), None, x); // [r]
        let bax = matvec(lora.b().view(), None, &ax); // [out]
        y += &bax.mapv(|v| c * v);
    }
    y
}

/// The token `token` at position `p = cache.len()` through the whole model with a fast row in
/// every gated interval; advances the cache. Returns the exit states `u_1..u_J` and the final
/// slow residual `s_N` (whose head gives the base model's logits).
///
/// # Shapes
/// -> (J of `[D]`, `[D]`)
pub fn exit_states_naive(
    m2r2: M2r2<'_>,
    token: u32,
    cache: &mut KvCache,
) -> (Vec<Array1<f32>>, Array1<f32>) {
    let p = cache.len();
    let config = &m2r2.weights.config;
    let mut s = embed_naive(m2r2.model, token);
    let exit_states = (0..config.num_gates())
        .map(|j| interval_naive(m2r2, j, &mut s, p, cache))
        .collect();
    // after the last gate nothing reads the fast stream: the slow row alone
    for l in config.interval_layers(config.num_gates()) {
        layer_naive(m2r2.model, l, &mut s, p, cache);
    }
    cache.set_len(p + 1);
    (exit_states, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::ModelConfig;
    use crate::base::model::Model;
    use crate::io::builtin::{self, random_model};
    use crate::m2r2::config::M2r2Config;
    use crate::m2r2::weights::M2r2Weights;

    fn assert_bits_eq<'a>(
        a: impl IntoIterator<Item = &'a f32>,
        b: impl IntoIterator<Item = &'a f32>,
        what: &str,
    ) {
        let a: Vec<u32> = a.into_iter().map(|v| v.to_bits()).collect();
        let b: Vec<u32> = b.into_iter().map(|v| v.to_bits()).collect();
        assert!(a == b, "{what}: the bits differ");
    }

    /// The built-in models with their seeded adapters, and a windowed, biased dense model with
    /// random ones.
    fn adapted_models() -> Vec<(String, Model, M2r2Weights)> {
        let mut out: Vec<_> = builtin::BUILTIN_NAMES
            .iter()
            .map(|&name| {
                let model = builtin::builtin(name).unwrap();
                let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
                (name.to_string(), model, weights)
            })
            .collect();
        let config = ModelConfig {
            qkv_bias: true,
            o_bias: true,
            sliding_window: Some(3),
            ..builtin::tiny_config()
        };
        let model = random_model(config.clone(), 21).unwrap();
        let weights = M2r2Weights::random(&config, M2r2Config::default_for(&config), 22).unwrap();
        out.push(("biased windowed dense".into(), model, weights));
        out
    }

    /// One token at a time, the naive streams give the exit states `u_g`, the slow residuals at
    /// the gates and the final residual of `M2r2::all_exit_states_and_final` (one chunk, fast rows
    /// for every position) bit for bit.
    #[test]
    fn naive_fast_stream_is_the_fast_path_bitwise() {
        for (name, model, weights) in adapted_models() {
            let m2r2 = M2r2::new(&model, &weights);
            let tokens = [3u32, 1, 4, 1, 5, 9, 2, 6];
            let (gates, last) = m2r2.all_exit_states_and_final(&tokens).unwrap();
            let mut cache = model.new_cache(tokens.len()).unwrap();
            let config = &weights.config;
            for (p, &token) in tokens.iter().enumerate() {
                let mut s = embed_naive(&model, token);
                for (j, (u_fast, s_fast)) in gates.iter().enumerate() {
                    let u = interval_naive(m2r2, j, &mut s, p, &mut cache);
                    assert_bits_eq(u_fast.row(p), &u, &format!("{name}: u_{} at {p}", j + 1));
                    assert_bits_eq(
                        s_fast.row(p),
                        &s,
                        &format!("{name}: s at gate {} at {p}", j + 1),
                    );
                }
                for l in config.interval_layers(config.num_gates()) {
                    layer_naive(&model, l, &mut s, p, &mut cache);
                }
                cache.set_len(p + 1);
                assert_bits_eq(last.row(p), &s, &format!("{name}: s_N at {p}"));
            }
        }
    }

    /// `exit_states_naive` decoding token by token after a prompt gives what a one-token
    /// `run_interval` per interval gives on the fast path, and the same cache.
    #[test]
    fn exit_states_naive_is_run_interval_per_token() {
        for (name, model, weights) in adapted_models() {
            let m2r2 = M2r2::new(&model, &weights);
            let config = &weights.config;
            let mut fast_cache = model.new_cache(12).unwrap();
            let mut naive_cache = model.new_cache(12).unwrap();
            for (p, token) in [5u32, 3, 7, 2, 9, 4].into_iter().enumerate() {
                let mut s = model.embed(&[token]);
                let u_fast: Vec<_> = (0..config.num_gates())
                    .map(|j| {
                        m2r2.run_interval(j, &mut s, p, &mut fast_cache, &[0])
                            .exit_states
                    })
                    .collect();
                for l in config.interval_layers(config.num_gates()) {
                    model.layer_forward(l, &mut s, p, &mut fast_cache);
                }
                fast_cache.set_len(p + 1);
                let (u_naive, s_naive) = exit_states_naive(m2r2, token, &mut naive_cache);
                for (g, (a, b)) in u_fast.iter().zip(&u_naive).enumerate() {
                    assert_bits_eq(a, b, &format!("{name}: u_{} at {p}", g + 1));
                }
                assert_bits_eq(&s, &s_naive, &format!("{name}: s_N at {p}"));
            }
            assert!(naive_cache.prefix_equals(&fast_cache, 6), "{name}: caches");
        }
    }
}
