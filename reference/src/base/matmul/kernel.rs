//! The micro-kernel under [`linear`](super::linear): a tile of dot products `out[r][t] = dot(w_r,
//! x_t)` for several weight rows against every input row of a chunk, with each weight row read from
//! memory once.
//!
//! Every implementation computes exactly [`dot`]'s sum in [`dot`]'s order
//! (16 lanes of separately rounded products and sums, lanes added left to right, then the tail left
//! to right, no fused multiply-add), so they give the same bits on every input; the tests compare
//! each one, forced, with [`linear_naive`](super::linear_naive). What differs is how many lanes an
//! instruction carries and how many accumulators stay in registers:
//!
//! | kernel     | where                        | per instruction | tile (weight rows x input rows) |
//! |------------|------------------------------|-----------------|---------------------------------|
//! | `Portable` | everywhere (the definition)  | what the compiler makes of [`dot`] | 1 x 1 |
//! | `Avx2`     | x86-64 with AVX2 (runtime check) | 8 lanes (`__m256`) | 1 x 4 (then 1 x 3, 1 x 2, 1 x 1) |
//! | `Avx512`   | x86-64 with AVX-512F (runtime check) | 16 lanes (`__m512`: one register is one dot) | 4 x 6 for chunks (then 1 x 6 for the last rows), 1 x 1 for decode |
//! | `Neon`     | aarch64 (NEON is baseline there) | 4 lanes (`float32x4_t`) | 2 x 2 |
//!
//! A tile keeps `tile rows x tile inputs` 16-lane accumulators in registers, so one load of a weight
//! chunk serves several input rows and one load of an input chunk several weight rows: a chunk of
//! 16 rows does 16 times the arithmetic of one row on the same weight bytes, which only stays
//! memory-bound if the arithmetic is wide.
//!
//! Dispatch is `std::arch` feature detection, once per process ([`Kernel::best`]): the SIMD paths
//! are a few dozen lines each, and a dispatch crate (`pulp`, `multiversion`) would add a
//! dependency to save one `is_x86_feature_detected!`; `pulp`'s portable SIMD types also hide the
//! register block the speed comes from, and `multiversion` clones a function per feature set but
//! leaves the blocking to the compiler, whose auto-vectoriser does not keep a block of
//! accumulators in registers (the portable path shows what it makes of [`dot`]).
//!
//! The SIMD loops read through raw pointers and pass their accumulators to a step function by
//! value: with a bounds check per load, or with the accumulator array updated in place, LLVM kept
//! some blocks' accumulators in memory (a store after every add) and they ran at half speed.

use super::dot;

/// One implementation of the tile of dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// [`dot`] itself, pair by pair: the definition, on every CPU.
    Portable,
    /// x86-64 AVX2 (8-lane) tiles.
    Avx2,
    /// x86-64 AVX-512 (16-lane) register blocks.
    Avx512,
    /// aarch64 NEON (4-lane) tiles.
    Neon,
}

impl Kernel {
    /// The fastest kernel this CPU runs (detected once).
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            Kernel::available()
                .into_iter()
                .last()
                .unwrap_or(Kernel::Portable)
        })
    }

    /// Every kernel this CPU runs, the portable one first.
    pub fn available() -> Vec<Kernel> {
        let mut kernels = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            kernels.push(Kernel::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            kernels.push(Kernel::Avx512);
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            kernels.push(Kernel::Neon);
        }
        kernels
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Neon => "neon",
        }
    }

    /// `out[r * T + t] = dot(w[r], x_t)` for each weight row `r` and each of the `T` input rows of
    /// `x` (row-major, `width` wide).
    ///
    /// # Shapes
    /// - `x`: `[T, width]` flat, `w`: R rows of `[width]` -> `out`: `[R, T]` flat
    ///
    /// # Panics
    /// If a slice has the wrong length, or the kernel is not [available](Kernel::available) on
    /// this CPU.
    pub fn tile(self, x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
        let t_rows = x.len().checked_div(width).unwrap_or(0);
        assert_eq!(x.len(), t_rows * width, "x is not whole rows of {width}");
        assert!(w.iter().all(|r| r.len() == width), "weight rows of {width}");
        assert_eq!(out.len(), w.len() * t_rows, "out is [R, T]");
        if out.is_empty() {
            // No input rows or no weight rows: nothing to compute (the SIMD blocks assume both).
            return;
        }
        match self {
            Kernel::Portable => portable(x, width, w, out),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2 here");
                // SAFETY: AVX2 is present (checked above); the slice lengths are checked above.
                unsafe { super::avx2::tile(x, width, w, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                assert!(
                    std::arch::is_x86_feature_detected!("avx512f"),
                    "no AVX-512 here"
                );
                // SAFETY: AVX-512F is present (checked above); the slice lengths are checked above.
                unsafe { super::avx512::tile(x, width, w, out) }
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => {
                assert!(
                    std::arch::is_aarch64_feature_detected!("neon"),
                    "no NEON here"
                );
                // SAFETY: NEON is present (checked above); the slice lengths are checked above.
                unsafe { super::neon::tile(x, width, w, out) }
            }
            #[allow(unreachable_patterns)]
            other => panic!("the {} kernel does not exist on this CPU", other.name()),
        }
    }
}

impl Kernel {
    /// `y += a[j] * x_j` for `j = 0, 1, ...` in turn: per element, each product rounded, then
    /// added to `y` and rounded (no fused multiply-add), so every kernel gives the plain loop's
    /// bits; the SIMD ones only carry more elements per instruction. Attention's weighted sum of
    /// values.
    ///
    /// # Panics
    /// If `a` and `xs` differ in length, an `x_j` and `y` differ in length, or the kernel is not
    /// [available](Kernel::available).
    pub fn axpys(self, a: &[f32], xs: &[&[f32]], y: &mut [f32]) {
        assert_eq!(a.len(), xs.len(), "axpys: one factor per row");
        assert!(
            xs.iter().all(|x| x.len() == y.len()),
            "axpys: rows as long as y"
        );
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2 here");
                // SAFETY: AVX2 is present (checked above).
                unsafe { axpys_avx2(a, xs, y) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                assert!(
                    std::arch::is_x86_feature_detected!("avx512f"),
                    "no AVX-512 here"
                );
                // SAFETY: AVX-512F is present (checked above).
                unsafe { axpys_avx512(a, xs, y) }
            }
            // NEON is baseline on aarch64: the compiler already vectorises the loop there.
            _ => axpys_loop(a, xs, y),
        }
    }
}

/// The definition of [`Kernel::axpys`]; the SIMD variants compile this same loop with wider
/// vectors enabled.
#[inline(always)]
fn axpys_loop(a: &[f32], xs: &[&[f32]], y: &mut [f32]) {
    for (&a, x) in a.iter().zip(xs) {
        for (y, &x) in y.iter_mut().zip(x.iter()) {
            *y += a * x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpys_avx2(a: &[f32], xs: &[&[f32]], y: &mut [f32]) {
    axpys_loop(a, xs, y);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn axpys_avx512(a: &[f32], xs: &[&[f32]], y: &mut [f32]) {
    axpys_loop(a, xs, y);
}

/// The definition, pair by pair.
fn portable(x: &[f32], width: usize, w: &[&[f32]], out: &mut [f32]) {
    let t_rows = out.len() / w.len().max(1);
    for (r, w_r) in w.iter().enumerate() {
        for t in 0..t_rows {
            out[r * t_rows + t] = dot(&x[t * width..(t + 1) * width], w_r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD kernel of this CPU is among those the matmul proptests force, so they are not
    /// checking the portable path twice.
    #[test]
    fn the_cpus_simd_kernel_is_available_and_best() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            assert!(Kernel::available().contains(&Kernel::Avx2));
            let widest = if std::arch::is_x86_feature_detected!("avx512f") {
                Kernel::Avx512
            } else {
                Kernel::Avx2
            };
            assert_eq!(Kernel::best(), widest);
        }
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Kernel::best(), Kernel::Neon);
        assert_eq!(Kernel::available()[0], Kernel::Portable);
    }

    #[test]
    fn tile_is_r_by_t() {
        let x = [1.0f32, 2.0, 3.0, 4.0]; // T = 2, width 2
        let (w0, w1, w2) = ([1.0f32, 0.0], [0.0f32, 1.0], [1.0f32, 1.0]);
        for kernel in Kernel::available() {
            let mut out = [0.0f32; 6];
            kernel.tile(&x, 2, &[&w0, &w1, &w2], &mut out);
            assert_eq!(out, [1.0, 3.0, 2.0, 4.0, 3.0, 7.0], "{kernel:?}");
        }
    }
}
