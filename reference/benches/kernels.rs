//! `cargo bench -p m2r2-reference --bench kernels [-- tile | model [T,T,..] [REPEATS] | stream [REPEATS]]`: every
//! matmul kernel this CPU runs, side by side in one process, on SmolLM2-135M's shapes.
//!
//! - `tile`: one parallel task's tile (8 weight rows against `T` input rows) with everything in
//!   cache, on one thread, best of many short repeats: the kernels' arithmetic rate (GFLOP/s),
//!   which is what a verify chunk needs.
//! - `model` (default): the 211 products of one SmolLM2 token (30 layers of q, k, v, o, gate, up,
//!   down, then the LM head; 538 MB of random f32 weights, far past the caches) at `T` rows each,
//!   on the model's rayon threads, best of `REPEATS`: decode and chunk cost as the model sees them.
//!
//! - `stream [REPEATS]`: what bounds a decode step's products from above: the same 538 MB read
//!   as one buffer in 256 KiB tasks (what `m2r2 bench` probes), then matrix by matrix with one
//!   parallel section per matrix and 8 rows per task (the products' structure, with a plain sum
//!   for arithmetic), then the decode products themselves; the three alternate `REPEATS` times and
//!   each keeps its best.
//!
//! Compare ratios within one run: the development machines are shared and noisy.

use ndarray::Array2;
use reference::base::bandwidth::{streaming_read, sum_lanes};
use reference::base::matmul::{cache_aligned, kernel::Kernel, linear_with};
use std::time::Instant;

const D: usize = 576;
const FFN: usize = 1536;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;

fn matrix(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    // Aligned like the model's weights (`Weights::load`).
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let data = (0..rows * cols)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    cache_aligned(rows, cols, data)
}

fn tile() {
    println!(
        "one task's tile (8 weight rows x T input rows), in cache, one thread: us and GFLOP/s"
    );
    for width in [D, FFN] {
        let w = matrix(8, width, 3);
        let rows: Vec<&[f32]> = w
            .rows()
            .into_iter()
            .map(|r| r.to_slice().unwrap())
            .collect();
        for t in [1usize, 2, 3, 4, 5, 6, 8, 9, 16] {
            let x = matrix(t, width, 4);
            let xs = x.as_slice().unwrap();
            let mut out = vec![0.0f32; 8 * t];
            let mut line = format!("width {width:4} T={t:2}");
            for kernel in Kernel::available() {
                let mut best = f64::MAX;
                for _ in 0..2000 {
                    let start = Instant::now();
                    kernel.tile(xs, width, &rows, &mut out);
                    std::hint::black_box(&out);
                    best = best.min(start.elapsed().as_secs_f64());
                }
                let flops = 2.0 * (8 * width * t) as f64;
                line += &format!(
                    " | {:8} {:6.2} us {:5.1} GF/s",
                    kernel.name(),
                    best * 1e6,
                    flops / best / 1e9
                );
            }
            println!("{line}");
        }
    }
}

/// SmolLM2-135M's 210 layer weights (30 layers of q, k, v, o, gate, up, down) and its head.
fn smollm2_weights() -> (Vec<Array2<f32>>, Array2<f32>) {
    let shapes = [
        (D, D),
        (D / 3, D),
        (D / 3, D),
        (D, D),
        (FFN, D),
        (FFN, D),
        (D, FFN),
    ];
    let weights: Vec<Array2<f32>> = (0..LAYERS)
        .flat_map(|l| {
            shapes
                .iter()
                .enumerate()
                .map(move |(i, &(o, inner))| matrix(o, inner, (l * 10 + i) as u64))
        })
        .collect();
    (weights, matrix(VOCAB, D, 999))
}

fn model(rows: &[usize], repeats: usize) {
    let (weights, head) = smollm2_weights();
    let bytes: usize = weights.iter().map(|w| w.len() * 4).sum::<usize>() + head.len() * 4;
    println!(
        "SmolLM2's products of one token ({:.1} MB of f32 weights), {} rayon threads, best of {repeats}",
        bytes as f64 / 1e6,
        rayon::current_num_threads()
    );
    println!("| T | kernel | ms | ratio to T=1 (same kernel) | GB/s | GFLOP/s |");
    println!("|---|---|---|---|---|---|");
    let mut first = std::collections::HashMap::new();
    for &t in rows {
        let (xd, xf) = (matrix(t, D, 7), matrix(t, FFN, 8));
        for kernel in Kernel::available() {
            let mut best = f64::MAX;
            for _ in 0..repeats {
                let start = Instant::now();
                for w in &weights {
                    let x = if w.ncols() == D { &xd } else { &xf };
                    std::hint::black_box(linear_with(kernel, x.view(), w.view(), None));
                }
                std::hint::black_box(linear_with(kernel, xd.view(), head.view(), None));
                best = best.min(start.elapsed().as_secs_f64());
            }
            let base = *first.entry(kernel.name()).or_insert(best);
            let flops = 2.0 * (bytes / 4) as f64 * t as f64;
            println!(
                "| {t} | {} | {:.2} | {:.2} | {:.1} | {:.1} |",
                kernel.name(),
                best * 1e3,
                best / base,
                bytes as f64 / best / 1e9,
                flops / best / 1e9
            );
        }
    }
}

fn stream(repeats: usize) {
    use rayon::prelude::*;
    let (weights, head) = smollm2_weights();
    let all: Vec<&Array2<f32>> = weights.iter().chain([&head]).collect();
    let bytes: usize = all.iter().map(|w| w.len() * 4).sum();
    let one: Vec<f32> = all.iter().flat_map(|w| w.iter().copied()).collect();
    let x = matrix(1, D, 7);
    let xf = matrix(1, FFN, 8);
    let ways: [(&str, &dyn Fn()); 3] = [
        ("one buffer, 256 KiB tasks (the bench probe)", &|| {
            std::hint::black_box(streaming_read(&one));
        }),
        ("matrix by matrix, 8 rows per task, sums", &|| {
            for w in &all {
                let rows = w.as_slice().unwrap().par_chunks(8 * w.ncols());
                std::hint::black_box(rows.map(sum_lanes).sum::<f32>());
            }
        }),
        ("matrix by matrix, the decode products", &|| {
            for w in &all {
                let x = if w.ncols() == D { &x } else { &xf };
                std::hint::black_box(linear_with(Kernel::best(), x.view(), w.view(), None));
            }
        }),
    ];
    let mut best = [f64::MAX; 3];
    for _ in 0..repeats {
        for (i, (_, run)) in ways.iter().enumerate() {
            let start = Instant::now();
            run();
            best[i] = best[i].min(start.elapsed().as_secs_f64());
        }
    }
    println!(
        "reading SmolLM2's {:.1} MB of f32 weights, {} rayon threads, best of {repeats} alternating rounds",
        bytes as f64 / 1e6,
        rayon::current_num_threads()
    );
    println!("| read | ms | GB/s | of the one-buffer rate |");
    println!("|---|---|---|---|");
    for (i, (name, _)) in ways.iter().enumerate() {
        println!(
            "| {name} | {:.2} | {:.1} | {:.0} % |",
            best[i] * 1e3,
            bytes as f64 / best[i] / 1e9,
            100.0 * best[0] / best[i]
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; the words after `--` choose what to run.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args.first().map(String::as_str) {
        Some("tile") => tile(),
        Some("stream") => stream(args.get(1).map_or(9, |s| s.parse().expect("REPEATS"))),
        Some("model") | None => {
            let rows = args
                .get(1)
                .map(|s| s.split(',').map(|t| t.parse().expect("T,T,..")).collect())
                .unwrap_or_else(|| vec![1, 2, 5, 9, 16]);
            let repeats = args.get(2).map_or(5, |s| s.parse().expect("REPEATS"));
            model(&rows, repeats);
        }
        Some(other) => {
            eprintln!("unknown bench '{other}': tile, model [T,T,..] [REPEATS] or stream [REPEATS]")
        }
    }
}
