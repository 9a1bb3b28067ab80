//! `Y = X W^T` for narrow weights (`in <= NARROW_MAX_WIDTH`): an adapter's `B` (`[out, r]`, `r` 8 to
//! 64), whose dots are one or a few 16-lane chunks each. The tile path spends such a dot on its
//! sequential lane sum (16 dependent additions) and its per-row set-up: 22 ns per output, 34 µs for
//! SmolLM2's `[1, 16] x [1536, 16]^T`, about 0.8 ms of every draft step in all. Here a block of
//! `BLOCK` weight rows is transposed into a local buffer so that each step of [`dot`]'s order, the
//! lane sums over the chunks, then the lanes added left to right, then the tail, runs for
//! `BLOCK` outputs side by side (one vertical operation), which the compiler vectorises without
//! changing any output's order of operations: every value is bitwise [`dot`]'s (tested against
//! `linear_naive`).
//!
//! [`dot`]: super::dot

use super::kernel::Kernel;
use super::{LANES, bias_only, for_column_blocks};
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2};

/// Widths up to this take [`linear_narrow`] in [`linear`](super::linear).
pub const NARROW_MAX_WIDTH: usize = 64;
/// Weight rows transposed together (one AVX-512 register of outputs).
const BLOCK: usize = 16;
/// Products below which the blocks stay on the calling thread.
const PARALLEL_MIN_PRODUCTS: usize = 1 << 18;

/// [`linear`](super::linear) for `in <= NARROW_MAX_WIDTH`, the same bits.
///
/// # Shapes
/// - `x`: `[T, in]`, `w`: `[out, in]`, `b`: `[out]` -> `[T, out]`
///
/// # Panics
/// If the inner dimensions differ or `in > NARROW_MAX_WIDTH`.
pub fn linear_narrow(
    x: ArrayView2<f32>,
    w: ArrayView2<f32>,
    b: Option<&Array1<f32>>,
) -> Array2<f32> {
    let w = w.as_standard_layout();
    let data = w.as_slice().expect("standard layout");
    narrow_blocks(x, w.ncols(), w.nrows(), b, Weights::Rows(data))
}

/// [`linear_narrow`] from the transposed weight `w_t = W^T` (`[in, out]`, kept by its owner, e.g.
/// [`Lora`](crate::m2r2::accelerator::Lora)): a block's columns are then read in place, not
/// gathered. The same bits as `linear(x, W)`.
///
/// # Shapes
/// - `x`: `[T, in]`, `w_t`: `[in, out]`, `b`: `[out]` -> `[T, out]`
///
/// # Panics
/// If the inner dimensions differ or `in > NARROW_MAX_WIDTH`.
pub fn linear_narrow_t(
    x: ArrayView2<f32>,
    w_t: ArrayView2<f32>,
    b: Option<&Array1<f32>>,
) -> Array2<f32> {
    let w_t = w_t.as_standard_layout();
    let data = w_t.as_slice().expect("standard layout");
    narrow_blocks(x, w_t.nrows(), w_t.ncols(), b, Weights::Transposed(data))
}

/// Where the weights are: `W` (`[out, in]`) or `W^T` (`[in, out]`), row-major.
#[derive(Clone, Copy)]
enum Weights<'a> {
    Rows(&'a [f32]),
    Transposed(&'a [f32]),
}

/// `Y[t, o] = dot(x_t, w_o) (+ b[o])` in blocks of [`BLOCK`] outputs.
fn narrow_blocks(
    x: ArrayView2<f32>,
    width: usize,
    out: usize,
    b: Option<&Array1<f32>>,
    weights: Weights,
) -> Array2<f32> {
    super::check_widths(x.ncols(), width);
    assert!(width <= NARROW_MAX_WIDTH, "linear_narrow: width {width}");
    let x = x.as_standard_layout();
    let xs = x.as_slice().expect("standard layout");
    let t_rows = x.nrows();
    let kernel = Kernel::best();
    let mut y = Array2::<f32>::zeros((t_rows, out));
    if width == 0 {
        bias_only(&mut y, b, |o| o);
        return y;
    }
    let block = |(i, mut y_block): (usize, ArrayViewMut2<f32>)| {
        let o0 = i * BLOCK;
        let n = y_block.ncols();
        // The block's columns as rows of BLOCK floats, `stride` apart: in place for a whole block
        // of W^T, else copied (columns past the block's end stay zero and are not written out).
        // (The buffer is zeroed only where it is used: 4 KB a block would cost more than the dots.)
        let mut buffer;
        let (data, stride) = match weights {
            Weights::Transposed(w_t) if n == BLOCK => (&w_t[o0..], out),
            Weights::Transposed(w_t) => {
                buffer = [0.0f32; BLOCK * NARROW_MAX_WIDTH];
                for k in 0..width {
                    buffer[k * BLOCK..k * BLOCK + n].copy_from_slice(&w_t[k * out + o0..][..n]);
                }
                (&buffer[..], BLOCK)
            }
            Weights::Rows(w) => {
                buffer = [0.0f32; BLOCK * NARROW_MAX_WIDTH];
                for i in 0..n {
                    let row = &w[(o0 + i) * width..(o0 + i + 1) * width];
                    for (k, &v) in row.iter().enumerate() {
                        buffer[k * BLOCK + i] = v;
                    }
                }
                (&buffer[..], BLOCK)
            }
        };
        for (t, xr) in xs.chunks_exact(width).enumerate() {
            let sums = block_dots_with(kernel, xr, data, stride);
            for i in 0..n {
                y_block[[t, i]] = sums[i] + b.map_or(0.0, |b| b[o0 + i]);
            }
        }
    };
    let parallel = t_rows * out * width >= PARALLEL_MIN_PRODUCTS;
    for_column_blocks(&mut y, BLOCK, parallel, block);
    y
}

/// [`block_dots`] compiled for the widest registers of `kernel` (the same source, so the same order
/// of operations: no FMA, since LLVM does not contract `a * b + c` without fast-math); the choice
/// changes speed only, and the tests force each kernel this CPU runs.
///
/// # Panics
/// If `kernel` is not [available](Kernel::available) on this CPU.
fn block_dots_with(kernel: Kernel, x: &[f32], data: &[f32], stride: usize) -> [f32; BLOCK] {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            assert!(
                std::arch::is_x86_feature_detected!("avx512f"),
                "no AVX-512 here"
            );
            // SAFETY: AVX-512F is present (checked above).
            unsafe { block_dots_avx512(x, data, stride) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2 here");
            // SAFETY: AVX2 is present (checked above).
            unsafe { block_dots_avx2(x, data, stride) }
        }
        // Portable, and NEON (baseline on aarch64, so the portable build already uses it).
        _ => block_dots(x, data, stride),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn block_dots_avx512(x: &[f32], data: &[f32], stride: usize) -> [f32; BLOCK] {
    block_dots(x, data, stride)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_dots_avx2(x: &[f32], data: &[f32], stride: usize) -> [f32; BLOCK] {
    block_dots(x, data, stride)
}

/// `dot(x, w_i)` for the [`BLOCK`] outputs `i`, where `data[k * stride + i] = w_i[k]`, each in
/// [`dot`]'s order: lane `j` sums the products `k = j, j + 16, ...` of the whole chunks, the lanes
/// are added left to right onto zero, then the tail products left to right.
///
/// [`dot`]: super::dot
#[inline(always)]
fn block_dots(x: &[f32], data: &[f32], stride: usize) -> [f32; BLOCK] {
    let column = |k: usize| -> &[f32; BLOCK] {
        data[k * stride..k * stride + BLOCK]
            .try_into()
            .expect("BLOCK floats")
    };
    let whole = x.len() / LANES * LANES;
    let mut sum = [0.0f32; BLOCK];
    // With no whole chunk `dot`'s lanes are all zero and add nothing to its zero sum.
    if whole > 0 {
        for j in 0..LANES {
            let mut lane = [0.0f32; BLOCK];
            for k in (j..whole).step_by(LANES) {
                let w = column(k);
                for i in 0..BLOCK {
                    lane[i] += x[k] * w[i];
                }
            }
            for i in 0..BLOCK {
                sum[i] += lane[i];
            }
        }
    }
    for (k, &xk) in x.iter().enumerate().skip(whole) {
        let w = column(k);
        for i in 0..BLOCK {
            sum[i] += xk * w[i];
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::matmul::{linear, linear_naive};
    use proptest::prelude::*;

    fn bits(a: &Array2<f32>) -> Vec<u32> {
        a.iter().map(|v| v.to_bits()).collect()
    }

    /// Values from `seed`, with exact zeros of both signs mixed in (the lane sums start from +0.0
    /// like `dot`'s, so a -0.0 product must not change a bit).
    fn matrix(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
        let mut s = seed | 1;
        Array2::from_shape_fn((rows, cols), |_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match s % 11 {
                0 => 0.0,
                1 => -0.0,
                _ => ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0,
            }
        })
    }

    proptest! {
        /// Bitwise the definition for every narrow width (0 to 64: no chunk, chunks, tails), any
        /// number of outputs (whole and partial blocks) and rows, with and without a bias, and
        /// batch invariant; `linear` takes this path for these widths.
        #[test]
        fn narrow_equals_naive(t in 0usize..6, inner in 0usize..=NARROW_MAX_WIDTH, out in 0usize..70, bias in any::<bool>(), seed in any::<u64>()) {
            let x = matrix(t, inner, seed);
            let w = matrix(out, inner, seed ^ 0x9e37);
            let b = bias.then(|| Array1::from_iter((0..out).map(|i| i as f32 * 0.125 - 1.0)));
            let naive = linear_naive(x.view(), w.view(), b.as_ref());
            let narrow = linear_narrow(x.view(), w.view(), b.as_ref());
            prop_assert_eq!(narrow.dim(), naive.dim());
            prop_assert_eq!(bits(&narrow), bits(&naive));
            let w_t = w.t().as_standard_layout().into_owned();
            prop_assert_eq!(bits(&linear_narrow_t(x.view(), w_t.view(), b.as_ref())), bits(&naive));
            // each compiled form of the block, forced
            let xs = x.as_standard_layout().into_owned();
            for kernel in Kernel::available() {
                for o0 in (0..out).step_by(BLOCK) {
                    let n = BLOCK.min(out - o0);
                    let mut wt = [0.0f32; BLOCK * NARROW_MAX_WIDTH];
                    for i in 0..n {
                        for k in 0..inner {
                            wt[k * BLOCK + i] = w[[o0 + i, k]];
                        }
                    }
                    for r in 0..t {
                        let sums = block_dots_with(kernel, xs.row(r).as_slice().unwrap(), &wt, BLOCK);
                        for (i, sum) in sums.iter().take(n).enumerate() {
                            let w_row = w.row(o0 + i).to_vec();
                            let dot = crate::base::matmul::dot(xs.row(r).as_slice().unwrap(), &w_row);
                            prop_assert_eq!(sum.to_bits(), dot.to_bits(), "{:?}", kernel);
                        }
                    }
                }
            }
            prop_assert_eq!(bits(&linear(x.view(), w.view(), b.as_ref())), bits(&naive));
            for r in 0..t {
                let alone = linear_narrow(x.slice(ndarray::s![r..r + 1, ..]), w.view(), b.as_ref());
                prop_assert_eq!(bits(&alone), bits(&naive.slice(ndarray::s![r..r + 1, ..]).to_owned()));
            }
        }
    }

    /// The parallel blocks (a large product) give the same bits as the naive definition.
    #[test]
    fn large_products_split_over_threads_keep_the_bits() {
        let (rows, out, width) = (40, 1536, 16);
        assert!(rows * out * width >= PARALLEL_MIN_PRODUCTS);
        let (x, w) = (matrix(rows, width, 1), matrix(out, width, 2));
        let naive = linear_naive(x.view(), w.view(), None);
        assert_eq!(bits(&linear_narrow(x.view(), w.view(), None)), bits(&naive));
    }
}
