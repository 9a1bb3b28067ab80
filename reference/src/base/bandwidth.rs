//! The machine's read bandwidth: what a memory-bound decode step, which reads every weight once
//! (the bytes [`work`](crate::base::work) counts), can stream at most. `m2r2 bench` reports a step's
//! rate as a fraction of it, and the kernels bench reads the model's weights with the same loop.

use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

/// Floats per task of [`streaming_read`]: 256 KiB.
const READ_CHUNK: usize = 1 << 16;

/// Best bytes/s of `runs` [`streaming_read`]s of a buffer of `bytes`, on rayon's global pool (the
/// threads the model uses). The buffer is written first so every page is really mapped.
pub fn memory_read_bandwidth(bytes: usize, runs: usize) -> f64 {
    let n = bytes / 4;
    let mut buffer = vec![0.0f32; n];
    buffer
        .par_chunks_mut(READ_CHUNK)
        .enumerate()
        .for_each(|(i, c)| c.fill(1.0 + i as f32 * 1e-6));
    let mut best = 0.0f64;
    for _ in 0..runs {
        let start = Instant::now();
        black_box(streaming_read(&buffer));
        let seconds = start.elapsed().as_secs_f64();
        best = best.max((n * 4) as f64 / seconds);
    }
    best
}

/// One parallel read of all of `buffer`, 256 KiB per task, summed with [`sum_lanes`].
pub fn streaming_read(buffer: &[f32]) -> f32 {
    buffer.par_chunks(READ_CHUNK).map(sum_lanes).sum()
}

/// Sum with 16 independent accumulators, so the loop is limited by loads, not by one add chain.
pub fn sum_lanes(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for j in 0..16 {
            lanes[j] += c[j];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums are exact on small integers (every partial sum is representable), whole chunks and
    /// tail alike.
    #[test]
    fn sums_every_element() {
        let x: Vec<f32> = (1..=37).map(|i| i as f32).collect();
        assert_eq!(sum_lanes(&x), (37 * 38 / 2) as f32);
        let big = vec![1.0f32; 3 * READ_CHUNK + 5];
        assert_eq!(streaming_read(&big), big.len() as f32);
        assert!(memory_read_bandwidth(1 << 20, 1) > 0.0);
    }
}
