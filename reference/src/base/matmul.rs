//! The linear-layer kernel `Y = X W^T`, batch invariant by construction.
//!
//! Every output element `Y[t, o]` is one call of [`dot`] on row `t` of `X` and row `o` of `W`, with
//! a fixed reduction order that does not depend on how many rows are computed together. So a
//! position's logits are bitwise identical whether it is decoded alone or inside a prefill chunk,
//! which is what makes greedy self-speculative decoding exactly lossless
//! (docs/m2r2/speculative.md). A BLAS gemm would not give this: it picks different code paths (and
//! summation orders) for one row and for many.
//!
//! Two kernels, tested bitwise equal:
//! - [`linear_naive`]: the definition, one loop nest, one thread.
//! - [`linear`]: the same dots, parallel over blocks of output rows. Each weight row is read from
//!   memory once per call and dotted with every input row while it is in cache, by a SIMD tile
//!   ([`kernel::Kernel`]: AVX2 on x86-64, NEON on aarch64, chosen at run time) that keeps several
//!   rows' accumulators in registers; decode (`T = 1`) is memory bound, and a verify chunk of up to
//!   16 rows stays close to it because the tile's arithmetic is wide.
//!
//! - [`narrow::linear_narrow`]: what [`linear`] runs for widths up to 64 (an adapter's `B`): the
//!   same dots for 16 weight rows side by side, without the tile's per-row lane sum.
//!
//! [`linear_out_rows`] is [`linear`] restricted to some rows of `W` (the pruned draft head): the
//! same dots, so its values are bitwise the matching columns.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod kernel;
mod lanes;
pub mod narrow;
#[cfg(target_arch = "aarch64")]
mod neon;

use kernel::Kernel;
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2, Axis};
use rayon::prelude::*;

/// Partial sums kept by [`dot`]: products `k ≡ j (mod LANES)` accumulate in lane `j`. 16 lanes let
/// the compiler keep several SIMD accumulators in flight without changing the result.
pub const LANES: usize = 16;

/// Output rows per parallel task in [`linear`] for decode (`T = 1`): measured best for streaming.
const ROWS_PER_TASK: usize = 8;
/// A task's tile results up to this many floats stay on the stack.
const TILE_ON_STACK: usize = 512;

/// Products (`rows x out x in` multiply-adds) below which [`linear`] stays on the calling thread.
const PARALLEL_MIN_PRODUCTS: usize = 1 << 16;

/// Output rows per parallel task for chunks (`T > 1`): the AVX-512 blocks prefetch the next block
/// of a task's rows, so a task's first block is the one that waits on memory; fewer, longer tasks
/// cut that (a 5-row chunk of SmolLM2 1.42x -> 1.16x a decode step's products, side by side).
const ROWS_PER_CHUNK_TASK: usize = 32;

/// `sum_k a[k] * b[k]` in the crate's one canonical order: lane `j` sums the products at
/// `k = j, j + LANES, ...` over the whole chunks, the lanes are added left to right, then the tail
/// (`len % LANES` products) is added left to right. No fused multiply-add, so every build and CPU
/// gives the same bits.
///
/// # Panics
/// If `a.len() != b.len()`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of slices of different lengths");
    let mut lanes = [0.0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (ca, cb) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for j in 0..LANES {
            lanes[j] += ca[j] * cb[j];
        }
    }
    let mut sum = 0.0f32;
    for lane in lanes {
        sum += lane;
    }
    for k in whole..a.len() {
        sum += a[k] * b[k];
    }
    sum
}

/// Floats in one 64-byte cache line.
const LINE_FLOATS: usize = 16;

/// `data` as a `[rows, cols]` matrix whose first element starts a 64-byte cache line (copied once
/// if it does not already). Rows of SmolLM2-like widths (multiples of 16 floats) then all start a
/// line, and a 16-lane load never straddles two: the allocator's usual 16-byte alignment made every
/// AVX-512 load of a weight row a split load. Where the data lives does not change a bit of the
/// result.
///
/// # Panics
/// If `data.len() != rows * cols`.
pub fn cache_aligned(rows: usize, cols: usize, data: Vec<f32>) -> Array2<f32> {
    assert_eq!(data.len(), rows * cols, "cache_aligned: {rows} x {cols}");
    let skew = |p: *const f32| (p as usize / std::mem::size_of::<f32>()) % LINE_FLOATS;
    let (buffer, offset) = if skew(data.as_ptr()) == 0 {
        (data, 0)
    } else {
        let mut buffer = Vec::with_capacity(data.len() + LINE_FLOATS);
        let offset = (LINE_FLOATS - skew(buffer.as_ptr())) % LINE_FLOATS;
        buffer.resize(offset, 0.0);
        buffer.extend_from_slice(&data); // within capacity: the buffer does not move
        (buffer, offset)
    };
    Array1::from_vec(buffer)
        .slice_move(ndarray::s![offset..])
        .into_shape_with_order((rows, cols))
        .expect("rows * cols floats")
}

/// The products' one shape rule: the input's width is the weight's.
///
/// # Panics
/// If they differ (shapes are validated at load, so this is a bug).
#[track_caller]
fn check_widths(input: usize, weight: usize) {
    assert_eq!(
        input, weight,
        "linear: input width {input} vs weight width {weight}"
    );
}

/// `Y = X W^T (+ b)`: the definition. `linear` must equal it bit for bit.
///
/// # Shapes
/// - `x`: `[T, in]`, `w`: `[out, in]`, `b`: `[out]` -> `[T, out]`
///
/// # Panics
/// If the inner dimensions differ (shapes are validated at load, so this is a bug).
pub fn linear_naive(
    x: ArrayView2<f32>,
    w: ArrayView2<f32>,
    b: Option<&Array1<f32>>,
) -> Array2<f32> {
    check_widths(x.ncols(), w.ncols());
    let mut y = Array2::zeros((x.nrows(), w.nrows()));
    for (t, xr) in x.rows().into_iter().enumerate() {
        let xs = xr.to_vec();
        for (o, wr) in w.rows().into_iter().enumerate() {
            let ws = wr.to_vec();
            y[[t, o]] = dot(&xs, &ws) + b.map_or(0.0, |b| b[o]);
        }
    }
    y
}

/// `Y = X W^T (+ b)`, the fast twin of [`linear_naive`] (same bits, tested): output rows are split
/// into blocks computed in parallel; within a block each weight row is dotted with every input row.
///
/// # Shapes
/// - `x`: `[T, in]`, `w`: `[out, in]`, `b`: `[out]` -> `[T, out]`
///
/// # Panics
/// If the inner dimensions differ.
pub fn linear(x: ArrayView2<f32>, w: ArrayView2<f32>, b: Option<&Array1<f32>>) -> Array2<f32> {
    if w.ncols() <= narrow::NARROW_MAX_WIDTH {
        return narrow::linear_narrow(x, w, b);
    }
    linear_with(Kernel::best(), x, w, b)
}

/// [`linear`] on a chosen kernel (tests force each one; benchmarks compare them).
///
/// # Panics
/// As [`linear`], and if `kernel` is not available on this CPU.
pub fn linear_with(
    kernel: Kernel,
    x: ArrayView2<f32>,
    w: ArrayView2<f32>,
    b: Option<&Array1<f32>>,
) -> Array2<f32> {
    linear_selected(kernel, x, w, b, w.nrows(), |o| o)
}

/// Columns `out_rows` of `X W^T`: the same dots as [`linear`] for a subset of the weight's rows
/// (the pruned draft head), so each value is bitwise the matching column of `linear(x, w)`.
///
/// # Shapes
/// - `x`: `[T, in]`, `w`: `[out, in]`, `out_rows`: `[K]` -> `[T, K]`
///
/// # Panics
/// If the inner dimensions differ or an index is `>= out` (validated at load, so this is a bug).
pub fn linear_out_rows(x: ArrayView2<f32>, w: ArrayView2<f32>, out_rows: &[u32]) -> Array2<f32> {
    assert!(
        out_rows.iter().all(|&o| (o as usize) < w.nrows()),
        "linear_out_rows: a row index is >= {}",
        w.nrows()
    );
    linear_selected(Kernel::best(), x, w, None, out_rows.len(), |k| {
        out_rows[k] as usize
    })
}

/// `Y[t, k] = x_t . w_{row(k)} (+ b[row(k)])` for `k < count`, parallel over blocks of `k`.
fn linear_selected(
    kernel: Kernel,
    x: ArrayView2<f32>,
    w: ArrayView2<f32>,
    b: Option<&Array1<f32>>,
    count: usize,
    row: impl Fn(usize) -> usize + Sync,
) -> Array2<f32> {
    check_widths(x.ncols(), w.ncols());
    let t_rows = x.nrows();
    let x = x.as_standard_layout();
    let w = w.as_standard_layout();
    let xs = x.as_slice().expect("standard layout");
    let ws = w.as_slice().expect("standard layout");
    let width = w.ncols();
    let rows_per_task = rows_per_task(t_rows);
    let mut y = Array2::<f32>::zeros((t_rows, count));
    if t_rows == 0 || count == 0 {
        return y;
    }
    if width == 0 {
        bias_only(&mut y, b, row);
        return y;
    }
    let task = |(block, y_block): (usize, ArrayViewMut2<f32>)| {
        let weights = Block { ws, width, bias: b };
        weights.compute(kernel, xs, block * rows_per_task, &row, y_block);
    };
    // A small product (an adapter's A or B) costs less than handing it to the thread pool.
    let parallel = count * t_rows * width >= PARALLEL_MIN_PRODUCTS;
    for_column_blocks(&mut y, rows_per_task, parallel, task);
    y
}

/// `task((i, block))` for each block `i` of `size` columns of `y`, on the thread pool when
/// `parallel`.
fn for_column_blocks(
    y: &mut Array2<f32>,
    size: usize,
    parallel: bool,
    task: impl Fn((usize, ArrayViewMut2<f32>)) + Sync + Send,
) {
    if parallel {
        y.axis_chunks_iter_mut(Axis(1), size)
            .into_par_iter()
            .enumerate()
            .for_each(task);
    } else {
        y.axis_chunks_iter_mut(Axis(1), size)
            .enumerate()
            .for_each(task);
    }
}

/// Empty dots (`in = 0`): column `k` of `y` is the bias of weight row `row(k)`, or zero.
fn bias_only(y: &mut Array2<f32>, b: Option<&Array1<f32>>, row: impl Fn(usize) -> usize) {
    for (k, mut col) in y.axis_iter_mut(Axis(1)).enumerate() {
        col.fill(b.map_or(0.0, |b| b[row(k)]));
    }
}

/// Output rows per parallel task for a chunk of `t_rows` rows.
fn rows_per_task(t_rows: usize) -> usize {
    if t_rows == 1 {
        ROWS_PER_TASK
    } else {
        ROWS_PER_CHUNK_TASK
    }
}

/// One weight matrix (row-major `[out, width]`) and its bias, as a task sees them.
struct Block<'a> {
    ws: &'a [f32],
    width: usize,
    bias: Option<&'a Array1<f32>>,
}

impl Block<'_> {
    /// Columns `k0..k0 + n` of `Y` into `y_block` (`[T, n]`, `n <= ROWS_PER_CHUNK_TASK`): the tile in
    /// its `[k, t]` order in a buffer of the task's own, then written into the columns, so `Y` is
    /// never transposed whole.
    fn compute(
        &self,
        kernel: Kernel,
        xs: &[f32],
        k0: usize,
        row: &impl Fn(usize) -> usize,
        mut y_block: ArrayViewMut2<f32>,
    ) {
        let (t_rows, n) = y_block.dim();
        let width = self.width;
        let mut outs = [0usize; ROWS_PER_CHUNK_TASK];
        let mut w_rows: [&[f32]; ROWS_PER_CHUNK_TASK] = [&[]; ROWS_PER_CHUNK_TASK];
        for i in 0..n {
            outs[i] = row(k0 + i);
            w_rows[i] = &self.ws[outs[i] * width..(outs[i] + 1) * width];
        }
        let mut on_stack = [0.0f32; TILE_ON_STACK];
        let mut on_heap = Vec::new();
        let tile = if n * t_rows <= TILE_ON_STACK {
            &mut on_stack[..n * t_rows]
        } else {
            on_heap.resize(n * t_rows, 0.0);
            &mut on_heap[..]
        };
        kernel.tile(xs, width, &w_rows[..n], tile);
        let mut biases = [0.0f32; ROWS_PER_CHUNK_TASK];
        if let Some(b) = self.bias {
            for (bias, &o) in biases.iter_mut().zip(&outs[..n]) {
                *bias = b[o];
            }
        }
        // Row by row: each of Y's rows gets `n` adjacent values (the tile, `[k, t]`, is in L1).
        for (t, mut y_row) in y_block.rows_mut().into_iter().enumerate() {
            for (i, y) in y_row.iter_mut().enumerate() {
                *y = tile[i * t_rows + t] + biases[i];
            }
        }
    }
}

/// `[linear(x, w_i, b_i)]` for several weights of one input (a layer's q, k and v; gate and up) in
/// one parallel section: every output's blocks are tasks of one pool job, so the section's fork,
/// join and tail (one thread idle while the other ends its last block) are paid once, not once per
/// weight. The same tasks as [`linear`], so the same bits.
///
/// # Shapes
/// - `x`: `[T, in]`, `ws[i]`: (`[out_i, in]`, `[out_i]`) -> `[T, out_i]` each
///
/// # Panics
/// As [`linear`].
pub fn linear_many(
    x: ArrayView2<f32>,
    ws: &[(ArrayView2<f32>, Option<&Array1<f32>>)],
) -> Vec<Array2<f32>> {
    let width = x.ncols();
    let t_rows = x.nrows();
    let plain = ws
        .iter()
        .any(|(w, _)| w.ncols() != width || width <= narrow::NARROW_MAX_WIDTH);
    if plain || t_rows == 0 {
        return ws.iter().map(|(w, b)| linear(x, *w, *b)).collect();
    }
    let kernel = Kernel::best();
    let x = x.as_standard_layout();
    let xs = x.as_slice().expect("standard layout");
    let standard: Vec<_> = ws.iter().map(|(w, _)| w.as_standard_layout()).collect();
    let blocks: Vec<Block> = standard
        .iter()
        .zip(ws)
        .map(|(w, (_, bias))| Block {
            ws: w.as_slice().expect("standard layout"),
            width,
            bias: *bias,
        })
        .collect();
    let mut ys: Vec<Array2<f32>> = ws
        .iter()
        .map(|(w, _)| Array2::zeros((t_rows, w.nrows())))
        .collect();
    let rows_per_task = rows_per_task(t_rows);
    let products: usize = ws.iter().map(|(w, _)| w.len()).sum::<usize>() * t_rows;
    let tasks: Vec<(usize, usize, ArrayViewMut2<f32>)> = ys
        .iter_mut()
        .enumerate()
        .flat_map(|(i, y)| {
            y.axis_chunks_iter_mut(Axis(1), rows_per_task)
                .enumerate()
                .map(move |(block, y_block)| (i, block, y_block))
        })
        .collect();
    let task = |(i, block, y_block): (usize, usize, ArrayViewMut2<f32>)| {
        blocks[i].compute(kernel, xs, block * rows_per_task, &|o| o, y_block);
    };
    if products < PARALLEL_MIN_PRODUCTS {
        tasks.into_iter().for_each(task);
    } else {
        tasks.into_par_iter().for_each(task);
    }
    ys
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use proptest::prelude::*;

    #[test]
    fn hand_computed() {
        let x = array![[1.0f32, 2.0, 3.0], [0.5, -1.0, 0.0]];
        let w = array![[1.0f32, 0.0, -1.0], [2.0, 1.0, 0.5]];
        let b = array![0.25f32, -1.0];
        let want = array![
            [1.0 - 3.0 + 0.25, 2.0 + 2.0 + 1.5 - 1.0],
            [0.5 + 0.25, 1.0 - 1.0 - 1.0]
        ];
        assert_eq!(linear(x.view(), w.view(), Some(&b)), want);
        assert_eq!(linear_naive(x.view(), w.view(), Some(&b)), want);
    }

    #[test]
    fn cache_aligned_keeps_the_values_and_starts_a_line() {
        for (rows, cols) in [(3, 5), (4, 16), (1, 1), (0, 7)] {
            let data: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5).collect();
            let m = cache_aligned(rows, cols, data.clone());
            assert_eq!(m.dim(), (rows, cols));
            assert_eq!(m.as_slice().expect("standard layout"), &data[..]);
            if rows * cols > 0 {
                assert_eq!(m.as_ptr() as usize % 64, 0);
            }
        }
    }

    #[test]
    fn dot_order_is_the_documented_one() {
        // 17 elements: one whole chunk of 16 lanes plus a tail of one.
        let a: Vec<f32> = (0..17).map(|i| 1.0 + i as f32 * 1e-3).collect();
        let b: Vec<f32> = (0..17)
            .map(|i| if i % 2 == 0 { 1e4 } else { -1e4 + 0.5 })
            .collect();
        let mut lanes = [0.0f32; LANES];
        for k in 0..16 {
            lanes[k] += a[k] * b[k];
        }
        let mut want = 0.0f32;
        for l in lanes {
            want += l;
        }
        want += a[16] * b[16];
        assert_eq!(dot(&a, &b).to_bits(), want.to_bits());
    }

    fn matrix(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
        // A small LCG keeps the test free of extra dependencies.
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Array2::from_shape_fn((rows, cols), |_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
    }

    proptest! {
        /// The fast kernel equals the naive one bit for bit, and a row's result does not depend on
        /// the other rows in the chunk (batch invariance).
        #[test]
        fn fast_equals_naive_and_is_batch_invariant(t in 1usize..7, inner in 1usize..70, out in 1usize..80, seed in any::<u64>()) {
            let x = matrix(t, inner, seed);
            let w = matrix(out, inner, seed ^ 1);
            let b = Array1::from_iter((0..out).map(|i| i as f32 * 0.01));
            let naive = linear_naive(x.view(), w.view(), Some(&b));
            for kernel in Kernel::available() {
                let fast = linear_with(kernel, x.view(), w.view(), Some(&b));
                prop_assert!(fast.iter().zip(naive.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "{kernel:?}");
                for r in 0..t {
                    let alone = linear_with(kernel, x.slice(ndarray::s![r..r + 1, ..]), w.view(), Some(&b));
                    prop_assert!(alone.row(0).iter().zip(fast.row(r).iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "{kernel:?}");
                }
            }
        }

        /// Every kernel, forced, equals the definition on chunks of 0 to 17 rows (0 to 11 weight rows) and widths with
        /// and without whole 16-lane chunks and tails (0 to 15 products past the last chunk).
        #[test]
        fn every_kernel_equals_naive(t in 0usize..18, inner in 0usize..200, out in 0usize..12, seed in any::<u64>()) {
            let x = matrix(t, inner, seed);
            let w = matrix(out, inner, seed ^ 2) * 3.0;
            let naive = linear_naive(x.view(), w.view(), None);
            for kernel in Kernel::available() {
                let fast = linear_with(kernel, x.view(), w.view(), None);
                prop_assert_eq!(fast.dim(), naive.dim());
                for (a, b) in fast.iter().zip(naive.iter()) {
                    prop_assert_eq!(a.to_bits(), b.to_bits(), "{:?} t {} inner {} out {}", kernel, t, inner, out);
                }
            }
        }

        /// Several weights of one input in one section: each output is bitwise the naive product
        /// (widths on both sides of the narrow limit, chunks of 0 to 6 rows, 1 to 4 weights).
        #[test]
        fn many_equals_naive(t in 0usize..7, inner in 1usize..150, outs in proptest::collection::vec(1usize..90, 1..5), seed in any::<u64>()) {
            let x = matrix(t, inner, seed);
            let ws: Vec<Array2<f32>> = outs.iter().enumerate().map(|(i, &o)| matrix(o, inner, seed ^ (i as u64 + 3))).collect();
            let bs: Vec<Array1<f32>> = outs.iter().map(|&o| Array1::from_iter((0..o).map(|k| k as f32 * 0.03))).collect();
            let args: Vec<_> = ws.iter().zip(&bs).enumerate().map(|(i, (w, b))| (w.view(), (i % 2 == 0).then_some(b))).collect();
            let many = linear_many(x.view(), &args);
            prop_assert_eq!(many.len(), ws.len());
            for (y, (w, b)) in many.iter().zip(&args) {
                let naive = linear_naive(x.view(), *w, *b);
                prop_assert_eq!(y.dim(), naive.dim());
                prop_assert!(y.iter().zip(naive.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }

        /// A subset of the weight's rows gives exactly those columns of the naive product.
        #[test]
        fn out_rows_are_columns_of_naive(t in 1usize..5, inner in 1usize..40, out in 1usize..60, pick in proptest::collection::vec(any::<u32>(), 0..30), seed in any::<u64>()) {
            let x = matrix(t, inner, seed);
            let w = matrix(out, inner, seed ^ 1);
            let rows: Vec<u32> = pick.iter().map(|p| p % out as u32).collect();
            let naive = linear_naive(x.view(), w.view(), None);
            for kernel in Kernel::available() {
                let sub = linear_selected(kernel, x.view(), w.view(), None, rows.len(), |k| rows[k] as usize);
                prop_assert_eq!(sub.dim(), (t, rows.len()));
                for r in 0..t {
                    for (k, &o) in rows.iter().enumerate() {
                        prop_assert_eq!(sub[[r, k]].to_bits(), naive[[r, o as usize]].to_bits());
                    }
                }
            }
        }
    }
}
