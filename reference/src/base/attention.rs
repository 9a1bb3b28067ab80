//! Causal grouped-query self-attention (HF `LlamaAttention`, eager): the per-row kernel. The block
//! around it (projections, RoPE, cache writes) is `layer::decoder_layer`.
//!
//! Row `t` of a chunk sits at absolute position `p = pos0 + t` and attends to cached positions
//! `lo..=p`, where `lo = 0`, or `p + 1 - w` with a sliding window `w` (Mistral: key `j` is visible
//! when `p - j < w`). Query head `h` reads key/value head `h / (H / Hkv)`.

use crate::base::config::ModelConfig;
use crate::base::matmul::dot;
use crate::base::ops::softmax_inplace;
use ndarray::{Array1, ArrayView1, ArrayView2};

/// First visible key position for a query at position `p`.
pub fn window_start(config: &ModelConfig, p: usize) -> usize {
    match config.sliding_window {
        Some(w) => (p + 1).saturating_sub(w),
        None => 0,
    }
}

/// Attention of one query row over visible keys/values, all heads.
/// `softmax(q.k_j / sqrt(Dh)) . v` per head; keys are `keys` rows followed by `own` (a row's own
/// key/value when it is not in the cache: the fast stream of spec section 2).
///
/// # Shapes
/// - `q`: `[H*Dh]`, `keys`, `values`: `[S_vis, Hkv*Dh]`, `own`: (`[Hkv*Dh]`, `[Hkv*Dh]`) -> `[H*Dh]`
pub fn attend(
    config: &ModelConfig,
    q: ArrayView1<f32>,
    keys: ArrayView2<f32>,
    values: ArrayView2<f32>,
    own: Option<(ArrayView1<f32>, ArrayView1<f32>)>,
) -> Array1<f32> {
    let dh = config.head_dim;
    let group = config.num_attention_heads / config.num_key_value_heads;
    let scale = (dh as f32).powf(-0.5);
    let visible = keys.nrows() + usize::from(own.is_some());
    let q = q.as_slice().expect("contiguous query");
    let key = |j: usize| {
        if j < keys.nrows() {
            keys.row(j)
        } else {
            own.expect("own row").0
        }
    };
    let value = |j: usize| {
        if j < values.nrows() {
            values.row(j)
        } else {
            own.expect("own row").1
        }
    };

    let mut out = Array1::zeros(config.q_dim());
    let mut scores = Array1::zeros(visible);
    for h in 0..config.num_attention_heads {
        let g = h / group;
        let q_h = &q[h * dh..(h + 1) * dh];
        // PyTorch: attn_weights = (q @ k^T) * scaling; softmax in f32
        for j in 0..visible {
            let k_j = key(j);
            let k_j = k_j.as_slice().expect("contiguous key");
            scores[j] = dot(q_h, &k_j[g * dh..(g + 1) * dh]) * scale;
        }
        softmax_inplace(scores.view_mut());
        // out_h = sum_j a_j v_j
        let out_h = out.slice_mut(ndarray::s![h * dh..(h + 1) * dh]);
        let out_h = out_h.into_slice().expect("contiguous output");
        for j in 0..visible {
            let v_j = value(j);
            let v_j = &v_j.as_slice().expect("contiguous value")[g * dh..(g + 1) * dh];
            for d in 0..dh {
                out_h[d] += scores[j] * v_j[d];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    /// One head, Dh = 2, two visible keys: hand-computed softmax weights.
    #[test]
    fn attend_hand_computed() {
        let mut config = builtin::tiny_config();
        config.num_attention_heads = 1;
        config.num_key_value_heads = 1;
        config.head_dim = 2;
        let q = array![1.0f32, 0.0];
        let keys = array![[2.0f32, 0.0], [0.0, 1.0]];
        let values = array![[1.0f32, 10.0], [3.0, 30.0]];
        // scores = [2, 0] / sqrt(2) = [1.4142135, 0]; a = softmax = [0.80435, 0.19565]
        let out = attend(&config, q.view(), keys.view(), values.view(), None);
        let a0 = 1.0 / (1.0 + (-std::f32::consts::SQRT_2).exp());
        assert_abs_diff_eq!(
            out,
            array![a0 * 1.0 + (1.0 - a0) * 3.0, a0 * 10.0 + (1.0 - a0) * 30.0],
            epsilon = 1e-5
        );
        // The same key supplied as the row's own entry gives the same result.
        let own = (keys.row(1), values.row(1));
        let split = attend(
            &config,
            q.view(),
            keys.slice(ndarray::s![..1, ..]),
            values.slice(ndarray::s![..1, ..]),
            Some(own),
        );
        assert_eq!(split, out);
    }

    /// GQA: heads 0 and 1 share kv head 0, heads 2 and 3 share kv head 1.
    #[test]
    fn grouped_heads_read_their_kv_head() {
        let mut config = builtin::tiny_config();
        config.num_attention_heads = 4;
        config.num_key_value_heads = 2;
        config.head_dim = 1;
        let q = array![1.0f32, 1.0, 1.0, 1.0];
        let keys = array![[0.0f32, 0.0]];
        let values = array![[5.0f32, 7.0]];
        let out = attend(&config, q.view(), keys.view(), values.view(), None);
        assert_eq!(out, array![5.0f32, 5.0, 7.0, 7.0]);
    }

    #[test]
    fn sliding_window_start() {
        let mut config = builtin::tiny_config();
        config.sliding_window = Some(4);
        assert_eq!(window_start(&config, 2), 0);
        assert_eq!(window_start(&config, 3), 0);
        assert_eq!(window_start(&config, 4), 1); // keys 1..=4: p - j < 4
        config.sliding_window = None;
        assert_eq!(window_start(&config, 100), 0);
    }
}
