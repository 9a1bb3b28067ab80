//! The ends of [`dot`](super::dot) that every SIMD tile shares ([`avx2`](super::avx2),
//! [`avx512`](super::avx512), [`neon`](super::neon)): adding a tile's lanes in `dot`'s order, and
//! the products past the last whole block. A module of its own so that the kernels import it and
//! [`kernel`](super::kernel) imports the kernels, with no file importing another that imports it.

use super::LANES;

/// [`dot`](super::dot)'s end, shared by the SIMD kernels: the lanes of `N` dots each added left to
/// right from zero, the `N` chains interleaved so their additions overlap (each chain alone is 16
/// dependent additions: as long as a tile's main loop).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
// j outer, n inner is the point: the N chains advance together.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) fn add_lanes<const N: usize>(lanes: &[[f32; LANES]; N]) -> [f32; N] {
    let mut sum = [0.0f32; N];
    for j in 0..LANES {
        for n in 0..N {
            sum[n] += lanes[n][j];
        }
    }
    sum
}

/// `sum` plus the tail products `a[k] * b[k]` for `k >= whole`, left to right.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline(always)]
pub(super) fn tail(mut sum: f32, a: &[f32], b: &[f32], whole: usize) -> f32 {
    for k in whole..a.len() {
        sum += a[k] * b[k];
    }
    sum
}
