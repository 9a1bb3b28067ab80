//! The base model as its equations, one token at a time (llama2.c's `forward`): M2R2's slow
//! residual stream for one sequence, one thread, no work counting.
//!
//! ```text
//! s_0    = E[token]                          [D]
//! s_l+1  = Layer_l(s_l, p)                   l = 0..N (base::layer_naive), writes cache_l[p]
//! logits = W_head RMSNorm(s_N; w_final)      [V]      (W_head = E when the embeddings are tied)
//! ```
//!
//! [`Model::forward`] runs a whole chunk through each layer at once; [`forward_naive`] feeds the
//! same tokens one by one and gives the same logits and the same KV cache, bit for bit (tested
//! below on the built-in dense and MoE models and on variants with biases, a sliding window and
//! an untied head).

use crate::base::kv_cache::KvCache;
use crate::base::layer_naive::{layer_naive, matvec, rms_norm_row};
use crate::base::model::Model;
use crate::error::Result;
use ndarray::{Array1, Array2};

/// `s_0 = E[token]`, the embedding row (`token` already checked).
///
/// # Shapes
/// -> `[D]`
pub fn embed_naive(model: &Model, token: u32) -> Array1<f32> {
    model.weights.embed.row(token as usize).to_owned()
}

/// `logits = W_head RMSNorm(s; w_final)`.
///
/// # Shapes
/// - `s`: `[D]` -> `[V]`
pub fn head_naive(model: &Model, s: &Array1<f32>) -> Array1<f32> {
    let eps = model.config.rms_norm_eps as f32;
    let h = rms_norm_row(s, &model.weights.final_norm, eps);
    matvec(model.weights.lm_head().view(), None, &h)
}

/// Feed `token` at position `p = cache.len()` through every layer and advance the cache. Returns
/// the final residual `s_N` (the head's input).
///
/// # Shapes
/// -> `[D]`
pub fn token_naive(model: &Model, token: u32, cache: &mut KvCache) -> Array1<f32> {
    let p = cache.len();
    let mut s = embed_naive(model, token);
    for l in 0..model.config.num_hidden_layers {
        layer_naive(model, l, &mut s, p, cache);
    }
    cache.set_len(p + 1);
    s
}

/// [`Model::forward`], one token at a time: the logits of every token of `tokens`, appended to the
/// cache.
///
/// # Shapes
/// - `tokens`: `[T]` -> `[T, V]`
pub fn forward_naive(model: &Model, tokens: &[u32], cache: &mut KvCache) -> Result<Array2<f32>> {
    model.check_input(tokens, cache.len(), cache)?;
    let mut logits = Array2::zeros((tokens.len(), model.config.vocab_size));
    for (t, &token) in tokens.iter().enumerate() {
        let s = token_naive(model, token, cache);
        logits.row_mut(t).assign(&head_naive(model, &s));
    }
    Ok(logits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::config::{ModelConfig, RopeScaling};
    use crate::io::builtin::{self, random_model};
    use ndarray::s;

    /// The same bits, element by element (`==` on floats would let -0.0 pass for 0.0).
    pub(crate) fn assert_bits_eq<'a>(
        a: impl IntoIterator<Item = &'a f32>,
        b: impl IntoIterator<Item = &'a f32>,
        what: &str,
    ) {
        let a: Vec<u32> = a.into_iter().map(|v| v.to_bits()).collect();
        let b: Vec<u32> = b.into_iter().map(|v| v.to_bits()).collect();
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            panic!(
                "{what}: element {i} differs: {} vs {}",
                f32::from_bits(a[i]),
                f32::from_bits(b[i])
            );
        }
    }

    /// The built-in models and variants that reach every branch of the layer: biases on every
    /// projection, a sliding window shorter than the sequence, an untied head, llama3 RoPE scaling.
    fn models() -> Vec<(String, Model)> {
        let mut out: Vec<(String, Model)> = builtin::BUILTIN_NAMES
            .iter()
            .map(|&name| (name.to_string(), builtin::builtin(name).unwrap()))
            .collect();
        let dense = ModelConfig {
            qkv_bias: true,
            o_bias: true,
            mlp_bias: true,
            tie_word_embeddings: false,
            sliding_window: Some(3),
            rope_scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
            ..builtin::tiny_config()
        };
        let moe = ModelConfig {
            sliding_window: Some(4),
            qkv_bias: true,
            ..builtin::tiny_moe_config()
        };
        out.push((
            "biased windowed dense".into(),
            random_model(dense, 11).unwrap(),
        ));
        out.push(("windowed moe".into(), random_model(moe, 12).unwrap()));
        out
    }

    /// A prompt as one chunk, then single decode steps, then a chunk of two: the naive forward,
    /// one token at a time, gives the fast forward's logits and KV cache bit for bit.
    #[test]
    fn naive_forward_is_the_fast_forward_bitwise() {
        for (name, model) in models() {
            let mut fast_cache = model.new_cache(16).unwrap();
            let mut naive_cache = model.new_cache(16).unwrap();
            let pieces: [&[u32]; 5] = [&[3, 1, 4, 1, 5, 9, 2], &[6], &[5], &[3], &[5, 8]];
            for (i, tokens) in pieces.into_iter().enumerate() {
                let fast = model.forward(tokens, &mut fast_cache).unwrap().logits;
                let naive = forward_naive(&model, tokens, &mut naive_cache).unwrap();
                assert_bits_eq(&fast, &naive, &format!("{name}, piece {i} logits"));
            }
            assert_eq!(naive_cache.len(), fast_cache.len());
            assert!(
                naive_cache.prefix_equals(&fast_cache, fast_cache.len()),
                "{name}: caches"
            );
        }
    }

    /// Layer by layer on a chunk: `layer_naive` row by row (in position order) gives
    /// `DecoderLayer::forward`'s hidden states, cache rows and expert routing bit for bit.
    #[test]
    fn naive_layer_is_the_fast_layer_bitwise() {
        for (name, model) in models() {
            let tokens = [7u32, 1, 8, 2, 8, 1];
            let mut fast_cache = model.new_cache(tokens.len()).unwrap();
            let mut naive_cache = model.new_cache(tokens.len()).unwrap();
            let mut fast = model.embed(&tokens); // [T, D]
            let mut naive: Vec<Array1<f32>> =
                tokens.iter().map(|&t| embed_naive(&model, t)).collect();
            for l in 0..model.config.num_hidden_layers {
                let out = model.layer_forward(l, &mut fast, 0, &mut fast_cache);
                let routing: Vec<_> = naive
                    .iter_mut()
                    .enumerate()
                    .map(|(p, s)| layer_naive(&model, l, s, p, &mut naive_cache))
                    .collect();
                for (p, s) in naive.iter().enumerate() {
                    assert_bits_eq(fast.row(p), s, &format!("{name}, layer {l}, row {p}"));
                }
                match out.routing {
                    Some(fast_routing) => {
                        let naive_routing: Vec<_> = routing.into_iter().flatten().collect();
                        assert_eq!(fast_routing, naive_routing, "{name}, layer {l} routing");
                    }
                    None => assert!(routing.iter().all(Option::is_none)),
                }
                let (fk, fv) = fast_cache.layer(l, tokens.len());
                let (nk, nv) = naive_cache.layer(l, tokens.len());
                assert_bits_eq(fk, nk, &format!("{name}, layer {l} keys"));
                assert_bits_eq(fv, nv, &format!("{name}, layer {l} values"));
            }
            let head = model.head(fast.view()).logits;
            let last = tokens.len() - 1;
            assert_bits_eq(
                head.slice(s![last, ..]),
                &head_naive(&model, &naive[last]),
                &format!("{name}, head"),
            );
        }
    }
}
