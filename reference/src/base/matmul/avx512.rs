//! The AVX-512 tile of [`Kernel::tile`](super::kernel::Kernel::tile): one `__m512` register holds
//! exactly [`dot`](super::dot)'s 16 lanes, so a (weight row, input row) pair needs one accumulator,
//! and AVX-512's 32 registers hold a register block of 4 weight rows x up to 5 input rows (20
//! accumulators, 5 input chunks, one weight chunk). `acc += w * x` is a separate multiply and add
//! (never FMA), so each lane sees the same roundings as the definition.
//!
//! Why a block and not one weight row at a time: with one weight row against `T` input rows every
//! multiply needs its own input load, and the tile is bound by loads at about 1.25 loads per
//! multiply. A 4 x 5 block loads 9 chunks for 20 multiplies, so a verify chunk stays close to the
//! cost of streaming the weights once (docs/PERFORMANCE.md has the measurements). Decode (`T = 1`)
//! has nothing to share and streams one weight row at a time.

use super::LANES;
use super::lanes::{add_lanes, tail};
use std::arch::x86_64::{
    __m512, _MM_HINT_T1, _mm_prefetch, _mm512_add_ps, _mm512_loadu_ps, _mm512_mul_ps,
    _mm512_setzero_ps,
};

/// Weight rows in a register block (for chunks of more than one input row).
const BLOCK_ROWS: usize = 4;
/// Chunks of up to this many input rows take one weight row at a time: decode only. A 2-row chunk
/// (every draft step's slow and fast row, every one-draft verification) streamed one weight row at
/// a time against both rows cost 1.14x a 3-row chunk's blocks; in the blocks it costs 1.09x
/// (SmolLM2's 211 products, 10 of 10 alternating runs faster, 2026-11-26; docs/PERFORMANCE.md).
const SEQUENTIAL_INPUTS: usize = 1;
/// Chunks of exactly this many input rows take each weight row through one pass per input row
/// (the second pass reads the row from L1): SmolLM2's products at `T = 2` measured 12-14 % faster
/// than in the 4 x 2 blocks on the quieter runs (13 of 20 alternating pairs faster, 2 ties; 3-row
/// chunks are faster in the blocks; docs/PERFORMANCE.md, "2-row chunks in two passes").
const TWO_PASS_INPUTS: usize = 2;
/// Input rows in a register block at most.
const BLOCK_INPUTS: usize = 6;

/// `out[r * T + t] = dot(w[r], x_t)`. Decode (`T = 1`): one weight row at a time, so
/// the task's rows (adjacent in memory) are one sequential stream for the hardware prefetcher.
/// Two rows: the same stream, each weight row dotted with one input row and then the other.
/// Larger chunks: blocks
/// of [`BLOCK_ROWS`] weight rows (then single rows) outer, each against all input rows in blocks of
/// at most [`BLOCK_INPUTS`]; the block's rows are read from memory once and reused from L1 by every
/// input block, and while the first input block runs the next weight block is prefetched (four
/// rows read side by side are four short streams, which the hardware prefetcher does not follow).
/// Slice lengths are checked by the caller.
#[target_feature(enable = "avx512f")]
pub(super) fn tile(x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
    let t_rows = out.len() / w.len().max(1);
    let tile = Tile {
        x,
        width,
        t_rows,
        w,
    };
    if t_rows <= SEQUENTIAL_INPUTS {
        for r in 0..w.len() {
            tile.block_of::<1>(r, 0, t_rows, None, out);
        }
        return;
    }
    if t_rows == TWO_PASS_INPUTS {
        for r in 0..w.len() {
            for t in 0..t_rows {
                tile.block_of::<1>(r, t, 1, None, out);
            }
        }
        return;
    }
    let mut r = 0;
    while r < w.len() {
        let rows = if r + BLOCK_ROWS <= w.len() {
            BLOCK_ROWS
        } else {
            1
        };
        let mut t = 0;
        while t < t_rows {
            let inputs = (t_rows - t).min(BLOCK_INPUTS);
            // The next block's rows, or none past the task's last row.
            let next = (t == 0).then_some(r + rows).filter(|&n| n < w.len());
            if rows == BLOCK_ROWS {
                tile.block_of::<BLOCK_ROWS>(r, t, inputs, next, out);
            } else {
                tile.block_of::<1>(r, t, inputs, next, out);
            }
            t += inputs;
        }
        r += rows;
    }
}

struct Tile<'a> {
    x: &'a [f32],
    width: usize,
    t_rows: usize,
    w: &'a [&'a [f32]],
}

impl Tile<'_> {
    /// Weight rows `r0..r0+R` against input rows `t0..t0+inputs` (`1 <= inputs <= BLOCK_INPUTS`),
    /// prefetching rows `next..next+R` (those that exist) meanwhile.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn block_of<const R: usize>(
        &self,
        r0: usize,
        t0: usize,
        inputs: usize,
        next: Option<usize>,
        out: &mut [f32],
    ) {
        let prefetch: [*const f32; R] = std::array::from_fn(|r| {
            next.and_then(|n| self.w.get(n + r))
                .map_or(std::ptr::null(), |row| row.as_ptr())
        });
        match inputs {
            1 => self.block::<R, 1>(r0, t0, &prefetch, out),
            2 => self.block::<R, 2>(r0, t0, &prefetch, out),
            3 => self.block::<R, 3>(r0, t0, &prefetch, out),
            4 => self.block::<R, 4>(r0, t0, &prefetch, out),
            5 => self.block::<R, 5>(r0, t0, &prefetch, out),
            6 => self.block::<R, 6>(r0, t0, &prefetch, out),
            _ => unreachable!("input blocks hold 1 to {BLOCK_INPUTS} rows"),
        }
    }

    /// Weight rows `r0..r0+R` against input rows `t0..t0+T`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn block<const R: usize, const T: usize>(
        &self,
        r0: usize,
        t0: usize,
        prefetch: &[*const f32; R],
        out: &mut [f32],
    ) {
        let width = self.width;
        let whole = width / LANES * LANES;
        let x_rows: [&[f32]; T] =
            std::array::from_fn(|t| &self.x[(t0 + t) * width..(t0 + t + 1) * width]);
        let w_rows: [&[f32]; R] = std::array::from_fn(|r| self.w[r0 + r]);
        // Raw pointers in the loop: with a bounds check per load LLVM keeps the accumulators in
        // memory (a store after every add) and the block runs at half speed.
        let x_ptrs: [*const f32; T] = std::array::from_fn(|t| x_rows[t].as_ptr());
        let w_ptrs: [*const f32; R] = std::array::from_fn(|r| w_rows[r].as_ptr());
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut k = 0;
        while k < whole {
            // SAFETY: every row is `width` long (checked by the caller) and
            // `k + LANES <= whole <= width`.
            acc = unsafe { step(acc, &x_ptrs, &w_ptrs, k) };
            for p in prefetch.iter().filter(|p| !p.is_null()) {
                // SAFETY: `p` is a weight row of `width` floats and `k < whole <= width`; a prefetch
                // only hints the cache and cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(k).cast::<i8>()) };
            }
            k += LANES;
        }
        for r in 0..R {
            let mut lanes = [[0.0f32; LANES]; T];
            for t in 0..T {
                // SAFETY: an `__m512` is 16 f32 in lane order.
                lanes[t] = unsafe { std::mem::transmute::<__m512, [f32; LANES]>(acc[r][t]) };
            }
            let sums = add_lanes(&lanes);
            for t in 0..T {
                out[(r0 + r) * self.t_rows + t0 + t] = tail(sums[t], x_rows[t], w_rows[r], whole);
            }
        }
    }
}

/// One 16-lane step of a block: `acc[r][t] += w_r[k..k+16] * x_t[k..k+16]`, the accumulators
/// passed by value so that LLVM keeps them in registers (as an array updated in place inside the
/// loop it kept some blocks' accumulators in memory, a store after every add).
///
/// # Safety
/// Each pointer must be valid for 16 f32 reads from `k`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn step<const R: usize, const T: usize>(
    mut acc: [[__m512; T]; R],
    x: &[*const f32; T],
    w: &[*const f32; R],
    k: usize,
) -> [[__m512; T]; R] {
    let mut xs = [_mm512_setzero_ps(); T];
    for t in 0..T {
        // SAFETY: the caller's contract.
        xs[t] = unsafe { _mm512_loadu_ps(x[t].add(k)) };
    }
    for r in 0..R {
        // SAFETY: the caller's contract.
        let w_k = unsafe { _mm512_loadu_ps(w[r].add(k)) };
        for t in 0..T {
            acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_mul_ps(xs[t], w_k));
        }
    }
    acc
}
