//! The NEON tile of [`Kernel::tile`](super::kernel::Kernel::tile) (aarch64, where NEON is part of
//! the baseline): [`dot`](super::dot)'s 16 lanes as four 4-lane `float32x4_t` accumulators per
//! (weight row, input row) pair, `acc += w * x` as a separate multiply and add (`vmulq` then
//! `vaddq`, never `vfmaq`), so each lane sees the same roundings as the definition.

use super::LANES;
use super::lanes::{add_lanes, tail};
use std::arch::aarch64::{float32x4_t, vaddq_f32, vdupq_n_f32, vld1q_f32, vmulq_f32, vst1q_f32};

/// `out[r * T + t] = dot(w[r], x_t)` in tiles of 2 weight rows x 2 input rows, with 1-wide tiles for
/// the ends. Slice lengths are checked by the caller.
#[target_feature(enable = "neon")]
pub(super) fn tile(x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
    let t_rows = out.len() / w.len().max(1);
    let tile = Tile {
        x,
        width,
        t_rows,
        w,
    };
    let mut r = 0;
    while r < w.len() {
        let two_rows = r + 2 <= w.len();
        let mut t = 0;
        while t < t_rows {
            let two_inputs = t + 2 <= t_rows;
            match (two_rows, two_inputs) {
                (true, true) => tile.block::<2, 2>(r, t, out),
                (true, false) => tile.block::<2, 1>(r, t, out),
                (false, true) => tile.block::<1, 2>(r, t, out),
                (false, false) => tile.block::<1, 1>(r, t, out),
            }
            t += if two_inputs { 2 } else { 1 };
        }
        r += if two_rows { 2 } else { 1 };
    }
}

struct Tile<'a> {
    x: &'a [f32],
    width: usize,
    t_rows: usize,
    w: &'a [&'a [f32]],
}

impl Tile<'_> {
    /// Weight rows `r0..r0+R` against input rows `t0..t0+T`.
    #[target_feature(enable = "neon")]
    #[inline]
    fn block<const R: usize, const T: usize>(&self, r0: usize, t0: usize, out: &mut [f32]) {
        let width = self.width;
        let whole = width / LANES * LANES;
        let x_rows: [&[f32]; T] =
            std::array::from_fn(|t| &self.x[(t0 + t) * width..(t0 + t + 1) * width]);
        let w_rows: [&[f32]; R] = std::array::from_fn(|r| self.w[r0 + r]);
        let zero = vdupq_n_f32(0.0);
        let mut acc = [[[zero; 4]; T]; R];
        let mut k = 0;
        while k < whole {
            let mut xs = [[zero; 4]; T];
            for t in 0..T {
                for q in 0..4 {
                    xs[t][q] = load(x_rows[t], k + 4 * q);
                }
            }
            for r in 0..R {
                for q in 0..4 {
                    let wq = load(w_rows[r], k + 4 * q);
                    for t in 0..T {
                        acc[r][t][q] = vaddq_f32(acc[r][t][q], vmulq_f32(xs[t][q], wq));
                    }
                }
            }
            k += LANES;
        }
        for r in 0..R {
            let mut lanes = [[0.0f32; LANES]; T];
            for t in 0..T {
                for (q, four) in lanes[t].chunks_exact_mut(4).enumerate() {
                    // SAFETY: `four` holds 4 f32.
                    unsafe { vst1q_f32(four.as_mut_ptr(), acc[r][t][q]) };
                }
            }
            let sums = add_lanes(&lanes);
            for t in 0..T {
                out[(r0 + r) * self.t_rows + t0 + t] = tail(sums[t], x_rows[t], w_rows[r], whole);
            }
        }
    }
}

/// Four floats of `row` from `k`.
#[target_feature(enable = "neon")]
#[inline]
fn load(row: &[f32], k: usize) -> float32x4_t {
    let four = &row[k..k + 4];
    // SAFETY: `four` holds 4 f32.
    unsafe { vld1q_f32(four.as_ptr()) }
}
