//! The AVX2 tile of [`Kernel::tile`](super::kernel::Kernel::tile): [`dot`](super::dot)'s 16 lanes
//! as two 8-lane `__m256` accumulators per (weight row, input row) pair, `acc += w * x` as a
//! separate multiply and add (never FMA), so each lane sees the same roundings as the definition.

use super::LANES;
use super::lanes::{add_lanes, tail};
use std::arch::x86_64::{__m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps};

/// `out[r * T + t] = dot(w[r], x_t)`, one weight row at a time against tiles of 4 input rows (then
/// 2, then 1 for the end): AVX2 has 16 registers, and a 1 x 4 tile keeps its 8 accumulators, 4
/// input halves and a weight half in them. Input rows outer: a tile's 4 input rows (9 KB at width
/// 576) stay in L1 while the task's weight rows pass. Slice lengths are checked by the caller.
#[target_feature(enable = "avx2")]
pub(super) fn tile(x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
    let t_rows = out.len() / w.len().max(1);
    let tile = Tile {
        x,
        width,
        t_rows,
        w,
    };
    let mut t = 0;
    while t < t_rows {
        let inputs = match t_rows - t {
            4.. => 4,
            n @ (2 | 3) => n,
            _ => 1,
        };
        for r in 0..w.len() {
            match inputs {
                4 => tile.block::<4>(r, t, out),
                3 => tile.block::<3>(r, t, out),
                2 => tile.block::<2>(r, t, out),
                _ => tile.block::<1>(r, t, out),
            }
        }
        t += inputs;
    }
}

struct Tile<'a> {
    x: &'a [f32],
    width: usize,
    t_rows: usize,
    w: &'a [&'a [f32]],
}

impl Tile<'_> {
    /// Weight row `r` against input rows `t0..t0+T`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn block<const T: usize>(&self, r: usize, t0: usize, out: &mut [f32]) {
        let width = self.width;
        let whole = width / LANES * LANES;
        let x_rows: [&[f32]; T] =
            std::array::from_fn(|t| &self.x[(t0 + t) * width..(t0 + t + 1) * width]);
        let w_row = self.w[r];
        let x_ptrs: [*const f32; T] = std::array::from_fn(|t| x_rows[t].as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        let mut k = 0;
        while k < whole {
            // SAFETY: every row is `width` long (checked by the caller) and
            // `k + LANES <= whole <= width`.
            acc = unsafe { step(acc, &x_ptrs, w_row.as_ptr(), k) };
            k += LANES;
        }
        let mut lanes = [[0.0f32; LANES]; T];
        for t in 0..T {
            // SAFETY: two `__m256` are 16 f32 in lane order.
            lanes[t] = unsafe { std::mem::transmute::<[__m256; 2], [f32; LANES]>(acc[t]) };
        }
        let sums = add_lanes(&lanes);
        for t in 0..T {
            out[r * self.t_rows + t0 + t] = tail(sums[t], x_rows[t], w_row, whole);
        }
    }
}

/// One 16-lane step: `acc[t] += w[k..k+16] * x_t[k..k+16]` as two 8-lane halves. The accumulators
/// go by value so that LLVM keeps them in registers (updated in place as an array inside the loop,
/// some tiles' accumulators stayed in memory: a store after every add).
///
/// # Safety
/// Each pointer must be valid for 16 f32 reads from `k`.
#[target_feature(enable = "avx2")]
#[inline]
// `half` picks the weight chunk and the accumulator column at once; t runs inside it.
#[allow(clippy::needless_range_loop)]
unsafe fn step<const T: usize>(
    mut acc: [[__m256; 2]; T],
    x: &[*const f32; T],
    w: *const f32,
    k: usize,
) -> [[__m256; 2]; T] {
    for half in 0..2 {
        let k = k + 8 * half;
        // SAFETY: the caller's contract.
        let w_k = unsafe { _mm256_loadu_ps(w.add(k)) };
        for t in 0..T {
            // SAFETY: the caller's contract.
            let x_k = unsafe { _mm256_loadu_ps(x[t].add(k)) };
            acc[t][half] = _mm256_add_ps(acc[t][half], _mm256_mul_ps(x_k, w_k));
        }
    }
    acc
}
