//! The AVX2 tile of [`Kernel::tile`](super::kernel::Kernel::tile): [`dot`](super::dot)'s 16 lanes
//! as two 8-lane `__m256` accumulators per (weight row, input row) pair, `acc += w * x` as a
//! separate multiply and add (never FMA), so each lane sees the same roundings as the definition.

use super::LANES;
use super::kernel::{add_lanes, tail};
use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

/// `out[r * T + t] = dot(w[r], x_t)`, one weight row at a time against tiles of 4 input rows (then
/// 2, then 1 for the end). One weight row in flight, not several: on the development machine (AMD
/// EPYC, Zen 4) interleaving two weight rows halved the streaming read rate of a decode step
/// (docs/PERFORMANCE.md), while the input rows of a chunk stay in L1. Slice lengths are checked by
/// the caller.
#[target_feature(enable = "avx2")]
pub(super) fn tile(x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
    let t_rows = out.len() / w.len().max(1);
    let tile = Tile {
        x,
        width,
        t_rows,
        w,
    };
    // Input rows outer: a tile's 4 input rows (9 KB at width 576) and the task's weight rows
    // stay in L1 together; the other order re-streams a 16-row chunk from L2 for every weight row.
    let mut t = 0;
    while t + 4 <= t_rows {
        for r in 0..w.len() {
            tile.block::<1, 4>(r, t, out);
        }
        t += 4;
    }
    if t + 2 <= t_rows {
        for r in 0..w.len() {
            tile.block::<1, 2>(r, t, out);
        }
        t += 2;
    }
    if t < t_rows {
        for r in 0..w.len() {
            tile.block::<1, 1>(r, t, out);
        }
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
    #[target_feature(enable = "avx2")]
    #[inline]
    fn block<const R: usize, const T: usize>(&self, r0: usize, t0: usize, out: &mut [f32]) {
        let width = self.width;
        let whole = width / LANES * LANES;
        let x_rows: [&[f32]; T] =
            std::array::from_fn(|t| &self.x[(t0 + t) * width..(t0 + t + 1) * width]);
        let w_rows: [&[f32]; R] = std::array::from_fn(|r| self.w[r0 + r]);
        let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
        let mut k = 0;
        while k < whole {
            let mut xs = [[_mm256_setzero_ps(); 2]; T];
            for t in 0..T {
                xs[t] = [load(x_rows[t], k), load(x_rows[t], k + 8)];
            }
            for r in 0..R {
                let ws = [load(w_rows[r], k), load(w_rows[r], k + 8)];
                for t in 0..T {
                    for half in 0..2 {
                        let product = _mm256_mul_ps(xs[t][half], ws[half]);
                        acc[r][t][half] = _mm256_add_ps(acc[r][t][half], product);
                    }
                }
            }
            k += LANES;
        }
        for r in 0..R {
            let mut lanes = [[0.0f32; LANES]; T];
            for t in 0..T {
                let (lo, hi) = lanes[t].split_at_mut(8);
                // SAFETY: each half of `lanes[t]` holds 8 f32.
                unsafe {
                    _mm256_storeu_ps(lo.as_mut_ptr(), acc[r][t][0]);
                    _mm256_storeu_ps(hi.as_mut_ptr(), acc[r][t][1]);
                }
            }
            let sums = add_lanes(&lanes);
            for t in 0..T {
                out[(r0 + r) * self.t_rows + t0 + t] = tail(sums[t], x_rows[t], w_rows[r], whole);
            }
        }
    }
}

/// Eight floats of `row` from `k`.
#[target_feature(enable = "avx2")]
#[inline]
fn load(row: &[f32], k: usize) -> __m256 {
    let eight = &row[k..k + 8];
    // SAFETY: `eight` holds 8 f32; the load is unaligned.
    unsafe { _mm256_loadu_ps(eight.as_ptr()) }
}
