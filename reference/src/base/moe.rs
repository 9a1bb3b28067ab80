//! Sparse mixture of experts (HF `MixtralSparseMoeBlock`).
//!
//! Router logits `r = W_router x` (`[E]`), `p = softmax(r)` in f32 over ALL experts, keep the top-k,
//! renormalise them to sum to one, and `y = sum_e p_e * Expert_e(x)` with SwiGLU experts. The sum
//! runs in ascending expert index, like HF's `index_add_` loop, so a row's result does not depend on
//! the other rows of its chunk.

use crate::base::matmul::linear;
use crate::base::mlp::mlp;
use crate::base::ops::softmax_inplace;
use crate::base::weights::Moe;
use ndarray::{Array2, ArrayView2, Axis};

/// The experts chosen for one row (in top-k order: most probable first) and their renormalised
/// mixing weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Top-k routing of every row.
///
/// # Shapes
/// - `h`: `[T, D]` (already RMS-normed) -> T routings
pub fn route(moe: &Moe, h: ArrayView2<f32>) -> Vec<Routing> {
    let mut probs = linear(h, moe.router.view(), None); // [T, E]
    probs
        .rows_mut()
        .into_iter()
        .map(|mut p| {
            softmax_inplace(p.view_mut());
            top_k(p.as_slice().expect("contiguous row"), moe.top_k)
        })
        .collect()
}

/// The `k` largest probabilities (first index on ties, as `torch.topk` on CPU), renormalised.
pub fn top_k(probs: &[f32], k: usize) -> Routing {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // Stable sort: equal probabilities keep ascending index order.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    top_k_of(probs, &order[..k])
}

/// The given experts with their probabilities renormalised to sum to one, summed in the given order
/// (PyTorch `routing_weights /= routing_weights.sum(-1)` sums in top-k order).
pub fn top_k_of(probs: &[f32], experts: &[usize]) -> Routing {
    let mut total = 0.0f32;
    for &e in experts {
        total += probs[e];
    }
    Routing {
        weights: experts.iter().map(|&e| probs[e] / total).collect(),
        experts: experts.to_vec(),
    }
}

/// Mix the chosen experts' outputs for every row, given the routing (which may come from another
/// stream: a fast row reuses its slow row's experts, docs/m2r2/streams.md).
///
/// # Shapes
/// - `h`: `[T, D]`, `routing`: T entries -> `[T, D]`
pub fn mix_experts(moe: &Moe, h: ArrayView2<f32>, routing: &[Routing]) -> Array2<f32> {
    let mut y = Array2::zeros(h.raw_dim());
    for (e, expert) in moe.experts.iter().enumerate() {
        // Rows routed to expert e, and the weight each gives it.
        let (rows, weights): (Vec<usize>, Vec<f32>) = routing
            .iter()
            .enumerate()
            .filter_map(|(t, r)| {
                r.experts
                    .iter()
                    .position(|&x| x == e)
                    .map(|i| (t, r.weights[i]))
            })
            .unzip();
        if rows.is_empty() {
            continue;
        }
        let out = mlp(expert, h.select(Axis(0), &rows).view()); // [rows, D]
        for ((&t, &w), o) in rows.iter().zip(&weights).zip(out.rows()) {
            y.row_mut(t).scaled_add(w, &o);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weights::{Linear, Mlp};
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    #[test]
    fn top_k_hand_computed() {
        let r = top_k(&[0.1, 0.4, 0.2, 0.3], 2);
        assert_eq!(r.experts, vec![1, 3]); // most probable first
        assert_abs_diff_eq!(r.weights[0], 0.4 / 0.7, epsilon = 1e-7);
        assert_abs_diff_eq!(r.weights[1], 0.3 / 0.7, epsilon = 1e-7);
        // Ties go to the lower index.
        assert_eq!(top_k(&[0.25, 0.25, 0.25, 0.25], 2).experts, vec![0, 1]);
    }

    /// D = 1, I = 1, experts that compute `c * silu(x) * x` for different `c`: a hand-checkable mix.
    #[test]
    fn routing_and_mixing_hand_computed() {
        let lin = |v: f32| Linear {
            w: array![[v]],
            b: None,
        };
        let expert = |c: f32| Mlp {
            gate: lin(1.0),
            up: lin(1.0),
            down: lin(c),
        };
        let m = Moe {
            router: array![[0.0], [1.0], [2.0]], // logits [0, x, 2x]
            experts: vec![expert(1.0), expert(10.0), expert(100.0)],
            top_k: 2,
        };
        let x = 1.0f32;
        let h = array![[x]];
        let routing = route(&m, h.view());
        let y = mix_experts(&m, h.view(), &routing);
        // softmax([0, 1, 2]) = [0.09003, 0.24473, 0.66524]; keep experts 1 and 2.
        assert_eq!(routing[0].experts, vec![2, 1]);
        let (p1, p2) = (0.24472847f32, 0.66524096f32);
        let base = crate::base::ops::silu(x) * x;
        let want = (p1 * 10.0 + p2 * 100.0) / (p1 + p2) * base;
        assert_abs_diff_eq!(y[[0, 0]], want, epsilon = 1e-4);
    }
}
