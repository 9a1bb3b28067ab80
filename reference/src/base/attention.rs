//! Causal grouped-query self-attention (HF `LlamaAttention`, eager): the per-row kernel. The block
//! around it (projections, RoPE, cache writes) is
//! [`DecoderLayer::forward_batch`](super::layer::DecoderLayer::forward_batch).
//!
//! Row `t` of a chunk sits at absolute position `p = pos0 + t` and attends to cached positions
//! `lo..=p`, where `lo = 0`, or `p + 1 - w` with a sliding window `w` (Mistral: key `j` is visible
//! when `p - j < w`). Query head `h` reads key/value head `h / (H / Hkv)`.
//!
//! Two implementations, tested bitwise equal: [`attend_naive`], the definition head by head with
//! one [`dot`] per key, and [`attend`], which computes the same dots for all query heads of a
//! key/value head at once with the SIMD tile of the linear layers ([`Kernel::tile`]) and the
//! weighted sum of values with [`Kernel::axpys`], in the definition's order. Attention is a few
//! percent of a decode step, but an eighth of a batched step of 16 sequences, where every row
//! attends to its own cache.

use crate::base::config::ModelConfig;
use crate::base::matmul::dot;
use crate::base::matmul::kernel::Kernel;
use crate::base::ops::softmax_inplace;
use ndarray::{Array1, ArrayView1, ArrayView2};

/// First visible key position for a query at position `p`.
pub fn window_start(config: &ModelConfig, p: usize) -> usize {
    match config.sliding_window {
        Some(w) => (p + 1).saturating_sub(w),
        None => 0,
    }
}

/// Attention of one query row over visible keys/values, all heads: [`attend_naive`]'s bits on
/// this CPU's kernel.
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
    attend_with(Kernel::best(), config, q, keys, values, own)
}

/// [`attend`] on `kernel`. Per key/value head `g`, its query heads `g * G .. (g + 1) * G` (`G =
/// H / Hkv`, adjacent in `q`) are the tile's `G` input rows and the visible keys its weight rows,
/// so `scores[j * G + t] = dot(q_h, k_j)` for `h = g * G + t`: the definition's dots.
///
/// # Panics
/// If `kernel` is not available on this CPU.
pub fn attend_with(
    kernel: Kernel,
    config: &ModelConfig,
    q: ArrayView1<f32>,
    keys: ArrayView2<f32>,
    values: ArrayView2<f32>,
    own: Option<(ArrayView1<f32>, ArrayView1<f32>)>,
) -> Array1<f32> {
    // Whole cache rows `[Hkv*Dh]`, the row's own entry last.
    let key_rows: Vec<&[f32]> = keys
        .outer_iter()
        .map(|r| r.to_slice().expect("contiguous key"))
        .chain(own.map(|(k, _)| k.to_slice().expect("contiguous own key")))
        .collect();
    let value_rows: Vec<&[f32]> = values
        .outer_iter()
        .map(|r| r.to_slice().expect("contiguous value"))
        .chain(own.map(|(_, v)| v.to_slice().expect("contiguous own value")))
        .collect();
    attend_key_rows(kernel, config, q, &key_rows, &value_rows)
}

/// [`attend`] over the rows `rows` of `keys` and `values`, in that order, then `own`: a row of a
/// token tree, which sees the cache before the tree and its ancestors' slots
/// ([`TokenTree::key_slots`](super::tree::TokenTree::key_slots)), never its siblings. The keys it
/// skips take no part in any sum, so the result is bitwise [`attend_naive`] of the selected rows
/// stacked, as a path decode attends to them.
///
/// # Shapes
/// - `q`: `[H*Dh]`, `keys`, `values`: `[S, Hkv*Dh]`, `rows`: `[S_vis]` (each `< S`),
///   `own`: (`[Hkv*Dh]`, `[Hkv*Dh]`) -> `[H*Dh]`
pub fn attend_rows(
    config: &ModelConfig,
    q: ArrayView1<f32>,
    keys: ArrayView2<f32>,
    values: ArrayView2<f32>,
    rows: &[usize],
    own: Option<(ArrayView1<f32>, ArrayView1<f32>)>,
) -> Array1<f32> {
    let key_rows = pick_rows(&keys, rows, own.map(|(k, _)| k));
    let value_rows = pick_rows(&values, rows, own.map(|(_, v)| v));
    attend_key_rows(Kernel::best(), config, q, &key_rows, &value_rows)
}

/// Rows `rows` of `m`, then `own`, as slices.
fn pick_rows<'a>(
    m: &'a ArrayView2<'_, f32>,
    rows: &[usize],
    own: Option<ArrayView1<'a, f32>>,
) -> Vec<&'a [f32]> {
    rows.iter()
        .map(|&j| m.row(j).to_slice().expect("contiguous cache row"))
        .chain(own.map(|r| r.to_slice().expect("contiguous own row")))
        .collect()
}

/// The body of [`attend_with`] on whole key and value rows `[Hkv*Dh]`, in key order.
fn attend_key_rows(
    kernel: Kernel,
    config: &ModelConfig,
    q: ArrayView1<f32>,
    key_rows: &[&[f32]],
    value_rows: &[&[f32]],
) -> Array1<f32> {
    let dh = config.head_dim;
    let group = config.num_attention_heads / config.num_key_value_heads;
    let scale = (dh as f32).powf(-0.5);
    let q = q.as_slice().expect("contiguous query");
    let visible = key_rows.len();
    let mut out = Array1::zeros(config.q_dim());
    let out_all = out.as_slice_mut().expect("fresh array");
    let mut tile = vec![0.0f32; visible * group];
    let (mut k_g, mut v_g): (Vec<&[f32]>, Vec<&[f32]>) = Default::default();
    let mut scores = Array1::zeros(visible);
    for g in 0..config.num_key_value_heads {
        let part = g * dh..(g + 1) * dh;
        k_g.clear();
        k_g.extend(key_rows.iter().map(|k| &k[part.clone()]));
        v_g.clear();
        v_g.extend(value_rows.iter().map(|v| &v[part.clone()]));
        kernel.tile(
            &q[g * group * dh..(g + 1) * group * dh],
            dh,
            &k_g,
            &mut tile,
        );
        for t in 0..group {
            let h = g * group + t;
            for (j, score) in scores.iter_mut().enumerate() {
                *score = tile[j * group + t] * scale;
            }
            softmax_inplace(scores.view_mut());
            let weights = scores.as_slice().expect("fresh array");
            kernel.axpys(weights, &v_g, &mut out_all[h * dh..(h + 1) * dh]);
        }
    }
    out
}

/// The definition: `softmax(q.k_j / sqrt(Dh)) . v` per head, one [`dot`] per key, the values
/// summed in key order; keys are `keys` rows followed by `own` (a row's own key/value when it is
/// not in the cache: a fast row, which reads the slow stream's cache and never writes it).
///
/// # Shapes
/// As [`attend`].
pub fn attend_naive(
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
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every kernel's `attend_with` gives the definition's bits: grouped heads, head widths
        /// with and without a 16-lane tail, with and without the row's own key/value.
        #[test]
        fn attend_with_every_kernel_is_the_definition(
            kv_heads in 1usize..4,
            group in 1usize..4,
            dh in 1usize..40,
            cached in 0usize..12,
            has_own in any::<bool>(),
            seed in any::<u64>(),
        ) {
            prop_assume!(cached > 0 || has_own);
            let mut config = builtin::tiny_config();
            config.num_key_value_heads = kv_heads;
            config.num_attention_heads = kv_heads * group;
            config.head_dim = dh;
            let kv = kv_heads * dh;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut draw = |n: usize| Array1::from_shape_fn(n, |_| rng.random_range(-3.0f32..3.0));
            let q = draw(config.q_dim());
            let keys = draw(cached * kv).into_shape_with_order((cached, kv)).unwrap();
            let values = draw(cached * kv).into_shape_with_order((cached, kv)).unwrap();
            let (own_k, own_v) = (draw(kv), draw(kv));
            let own = has_own.then(|| (own_k.view(), own_v.view()));
            let want = attend_naive(&config, q.view(), keys.view(), values.view(), own);
            for kernel in Kernel::available() {
                let got = attend_with(kernel, &config, q.view(), keys.view(), values.view(), own);
                let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "{kernel:?}: {got} vs {want}");
            }
        }

        /// `attend_rows` is the definition on the rows it picks, stacked in its order (a token
        /// tree's keys: a subset of the cache), with and without the row's own key/value.
        #[test]
        fn attend_rows_is_the_definition_on_its_rows(
            cached in 1usize..12,
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
            has_own in any::<bool>(),
            seed in any::<u64>(),
        ) {
            prop_assume!(!picks.is_empty() || has_own);
            let config = builtin::tiny_config();
            let kv = config.kv_dim();
            let mut rng = StdRng::seed_from_u64(seed);
            let mut draw = |n: usize| Array1::from_shape_fn(n, |_| rng.random_range(-3.0f32..3.0));
            let q = draw(config.q_dim());
            let keys = draw(cached * kv).into_shape_with_order((cached, kv)).unwrap();
            let values = draw(cached * kv).into_shape_with_order((cached, kv)).unwrap();
            let (own_k, own_v) = (draw(kv), draw(kv));
            let own = has_own.then(|| (own_k.view(), own_v.view()));
            let rows: Vec<usize> = picks.iter().map(|i| i.index(cached)).collect();
            let got = attend_rows(&config, q.view(), keys.view(), values.view(), &rows, own);
            let (k_rows, v_rows) = (keys.select(ndarray::Axis(0), &rows), values.select(ndarray::Axis(0), &rows));
            let want = attend_naive(&config, q.view(), k_rows.view(), v_rows.view(), own);
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{got} vs {want}");
        }

        /// `Kernel::axpys` is the loop `y[d] += a_j * x_j[d]` (rows in turn) bit for bit on
        /// every kernel, for lengths with and without a vector tail.
        #[test]
        fn axpys_of_every_kernel_is_the_loop(
            len in 0usize..70,
            rows in 0usize..5,
            seed in any::<u64>(),
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect() };
            let a = draw(rows);
            let xs: Vec<Vec<f32>> = (0..rows).map(|_| draw(len)).collect();
            let y0 = draw(len);
            let mut want = y0.clone();
            for (a, x) in a.iter().zip(&xs) {
                for (y, x) in want.iter_mut().zip(x) {
                    *y += a * x;
                }
            }
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            let x_rows: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            for kernel in Kernel::available() {
                let mut y = y0.clone();
                kernel.axpys(&a, &x_rows, &mut y);
                let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                prop_assert_eq!(&got, &want, "{:?}", kernel);
            }
        }
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
