//! The bridge ([`reference::m2r2::bridge`]) in training: its input per fast row, its two sites'
//! terms and their gradients.
//!
//! In training every earlier position is verified, so the row at position `p` reads the final slow
//! residual of `p - 1` from its sample (teacher forcing: the first draft of every round sees
//! exactly this; later drafts read the draft's own estimate instead). The input is detached (the
//! base model is frozen), so only the maps get gradients:
//! ```text
//! x̂  = RMSNorm_final(s_N[p-1])   (zeros at p = 0)            [R, D]
//! xa = x̂ A^T                                                  [R, r]
//! y  = c xa B^T                                               [R, D]  added at the entry or the gate
//! dB = c dy^T xa                                              [D, r]
//! dA = c (dy B)^T x̂                                           [r, D]
//! ```

use crate::adapters::Adapters;
use crate::fast_stream::{self, Batch, FrozenBase, IntervalTape};
use crate::linear::LoraPair;
use crate::real::Real;
use crate::rmsnorm;
use ndarray::{Array2, ArrayView2};
use reference::m2r2::bridge::BridgeSite;
use std::ops::Range;

/// `x̂` of every row of the batch: the final norm of the previous position's final slow residual,
/// zeros for a row at position 0.
///
/// # Shapes
/// -> `[R, D]`
pub fn inputs<F: Real>(base: &FrozenBase<F>, batch: Batch<'_, F>) -> Array2<F> {
    let Batch { samples, rows } = batch;
    let d = base.config.hidden_size;
    let mut h = Array2::zeros((rows.len(), d));
    for (mut dst, row) in h.rows_mut().into_iter().zip(rows) {
        if let Some(prev) = row.pos.checked_sub(1) {
            dst.assign(&samples[row.sample].last.row(prev));
        }
    }
    let (mut xhat, _) = rmsnorm::forward(h.view(), base.head.norm.view(), base.eps);
    // RMSNorm of a zero row is zero already; keep it exactly zero whatever eps does
    for (mut dst, row) in xhat.rows_mut().into_iter().zip(rows) {
        if row.pos == 0 {
            dst.fill(F::zero());
        }
    }
    xhat
}

/// The term `c x̂ A^T B^T` and `xa = x̂ A^T` (kept for [`backward`]).
///
/// # Shapes
/// - `xhat`: `[R, D]` -> (`[R, D]`, `[R, r]`)
pub fn forward<F: Real>(pair: &LoraPair<F>, c: F, xhat: ArrayView2<F>) -> (Array2<F>, Array2<F>) {
    let xa = xhat.dot(&pair.a.t());
    (xa.dot(&pair.b.t()) * c, xa)
}

/// The map's gradient from `dy`, the gradient of the state the term was added to.
///
/// # Shapes
/// - `dy`, `xhat`: `[R, D]`, `xa`: `[R, r]` -> (`[r, D]`, `[D, r]`)
pub fn backward<F: Real>(
    pair: &LoraPair<F>,
    c: F,
    xhat: ArrayView2<F>,
    xa: ArrayView2<F>,
    dy: ArrayView2<F>,
) -> LoraPair<F> {
    let dyb = dy.dot(&pair.b) * c; // [R, r]: c dy B
    LoraPair {
        a: dyb.t().dot(&xhat),
        b: dy.t().dot(&xa) * c,
    }
}

/// What [`interval_forward`] keeps for [`interval_backward`].
pub struct BridgedTape<F> {
    pub interval: IntervalTape<F>,
    /// `[R, D]` x̂, when `adapters` has bridge maps
    xhat: Option<Array2<F>>,
    /// `x̂ A^T` of the entry and gate sites that exist
    entry_xa: Option<Array2<F>>,
    gate_xa: Option<Array2<F>>,
}

/// Interval `j` (`layers`) on the batch's fast rows from their starting states `s_{e_j}`, with the
/// bridge's terms when `adapters` carries its maps (the draft gate's interval): the exit states
/// `u` and the tape.
///
/// # Shapes
/// -> `[R, D]`
pub fn interval_forward<F: Real>(
    base: &FrozenBase<F>,
    adapters: &Adapters<F>,
    j: usize,
    layers: Range<usize>,
    batch: Batch<'_, F>,
) -> (Array2<F>, BridgedTape<F>) {
    let mut f = fast_stream::start_states(batch, j);
    let xhat = (!adapters.bridge.is_empty()).then(|| inputs(base, batch));
    let site = |s: BridgeSite| {
        adapters
            .bridge
            .get(&s)
            .zip(xhat.as_ref())
            .map(|(pair, x)| forward(pair, adapters.bridge_scales[&s], x.view()))
    };
    let (entry, gate) = (site(BridgeSite::Entry), site(BridgeSite::Gate));
    if let Some((term, _)) = &entry {
        f += term;
    }
    let (mut u, interval) = fast_stream::forward(base, adapters, layers, batch, f);
    if let Some((term, _)) = &gate {
        u += term;
    }
    let tape = BridgedTape {
        interval,
        xhat,
        entry_xa: entry.map(|e| e.1),
        gate_xa: gate.map(|g| g.1),
    };
    (u, tape)
}

/// The gradients of [`interval_forward`]'s adapters and bridge maps from `du` (and `d_inner`,
/// as [`fast_stream::backward`]), accumulated into `grads`. With `bridge_only` the adapters'
/// gradients are not wanted: when no entry term needs the gradient of the interval's start, the
/// backward through the interval is skipped (their slots keep what they held).
#[allow(clippy::too_many_arguments)]
pub fn interval_backward<F: Real>(
    base: &FrozenBase<F>,
    adapters: &Adapters<F>,
    layers: Range<usize>,
    batch: Batch<'_, F>,
    tape: &BridgedTape<F>,
    du: Array2<F>,
    d_inner: &[Array2<F>],
    grads: &mut Adapters<F>,
    bridge_only: bool,
) {
    let add = |grads: &mut Adapters<F>, s: BridgeSite, xa: &Array2<F>, dy: &Array2<F>| {
        let x = tape.xhat.as_ref().expect("a bridge term has its input");
        let c = adapters.bridge_scales[&s];
        let g = backward(&adapters.bridge[&s], c, x.view(), xa.view(), dy.view());
        let acc = grads.bridge.get_mut(&s).expect("gradient slot");
        acc.a += &g.a;
        acc.b += &g.b;
    };
    if let Some(xa) = &tape.gate_xa {
        add(grads, BridgeSite::Gate, xa, &du);
    }
    if bridge_only && tape.entry_xa.is_none() {
        return;
    }
    let df = fast_stream::backward(
        base,
        adapters,
        layers,
        batch,
        &tape.interval,
        du,
        d_inner,
        grads,
    );
    if let Some(xa) = &tape.entry_xa {
        add(grads, BridgeSite::Entry, xa, &df);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::matrix;
    use proptest::prelude::*;

    /// The term equals the reference's `Bridge::term` (one `Lora::delta` at scale 1).
    #[test]
    fn forward_equals_reference() {
        let pair = LoraPair::<f32> {
            a: matrix(3, 8, 1),
            b: matrix(8, 3, 2),
        };
        let xhat = matrix::<f32>(4, 8, 3);
        let (y, _) = forward(&pair, 0.5, xhat.view());
        let lora = reference::m2r2::accelerator::Lora::new(pair.a.clone(), pair.b.clone(), 1.5);
        approx::assert_abs_diff_eq!(y, lora.delta(xhat.view(), 0.5), epsilon = 1e-5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// dA, dB against central differences of `sum(c * y)`.
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, d in 1usize..7, r in 1usize..4, seed in 0u64..1000) {
            let pair = LoraPair::<f64> { a: matrix(r, d, seed), b: matrix(d, r, seed + 1) };
            let xhat = matrix::<f64>(rows, d, seed + 2);
            let c = matrix::<f64>(rows, d, seed + 3);
            let scale = 0.7;
            let loss = |p: &LoraPair<f64>| (&forward(p, scale, xhat.view()).0 * &c).sum();
            let (_, xa) = forward(&pair, scale, xhat.view());
            let g = backward(&pair, scale, xhat.view(), xa.view(), c.view());
            let nda = numeric_gradient(pair.a.view().into_dyn(), |a| {
                loss(&LoraPair { a: a.clone().into_dimensionality().unwrap(), b: pair.b.clone() })
            });
            let ndb = numeric_gradient(pair.b.view().into_dyn(), |b| {
                loss(&LoraPair { a: pair.a.clone(), b: b.clone().into_dimensionality().unwrap() })
            });
            for (name, a, n) in [("dA", g.a.into_dyn(), nda), ("dB", g.b.into_dyn(), ndb)] {
                let r = compare(name, a.view(), n.view(), 1e-7, 1e-6);
                prop_assert!(r.ok, "{}", r);
            }
        }
    }
}
