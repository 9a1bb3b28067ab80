//! Decode speed of the reference against the machine: the bench sizes, the bytes a decode step
//! reads, the measured streaming-read bandwidth, the CPU's name, and the greedy prefill / decode
//! measurement that `m2r2 bench`, `m2r2 info` and `m2r2 demo` share. Decoding one token reads every
//! weight it uses once, so decode is memory bound and `bytes read per token x tokens/s` over the
//! streaming-read bandwidth says how close to the machine's limit the reference runs.

use crate::cli::args::bench::Sizes;
use crate::cli::common;
use anyhow::{Result, bail};
use reference::ModelConfig;
use reference::base::bandwidth::memory_read_bandwidth;
use reference::base::generate::{GenerateOptions, decode_positions, generate};
use reference::base::work::Work;
use reference::io::load::LoadedModel;
use reference::m2r2::cost::CostModel;
use serde::Serialize;

/// The largest buffer the bandwidth probe may allocate (16 GiB).
const MAX_BANDWIDTH_MIB: usize = 16 << 10;

/// f32 weights one decode step reads, by kind (counts of floats).
#[derive(Clone, Debug, Serialize)]
pub struct DecodeWeights {
    /// One row of the embedding: `D`.
    pub embedding_row: usize,
    /// q, k, v, o weights and their biases, all layers.
    pub attention: usize,
    /// Input and post-attention RMSNorm of every layer, and the final norm.
    pub norms: usize,
    /// MoE routers `[E, D]` of every layer (0 for dense models).
    pub routers: usize,
    /// Dense MLPs, or the k routed experts of every MoE layer (the others are not read).
    pub feed_forward: usize,
    /// The output projection `[V, D]` (the embedding matrix when tied).
    pub head: usize,
}

impl DecodeWeights {
    /// The weight bytes of one greedy decode step in `m2r2::cost::CostModel`, split by kind.
    pub fn of(c: &ModelConfig) -> Self {
        let cost = CostModel::new(c, None);
        let n = c.num_hidden_layers;
        let floats = |w: Work| w.weight_bytes as usize / 4;
        let (routers, feed_forward) = match &c.moe {
            None => (0, floats(cost.mlp(1))),
            Some(_) => (floats(cost.router(1)), floats(cost.experts(1, 1))),
        };
        DecodeWeights {
            embedding_row: floats(cost.embed(1)),
            attention: n * floats(cost.attention_projections(1)),
            norms: n * floats(cost.layer_norms()) + floats(cost.final_norm()),
            routers: n * routers,
            feed_forward: n * feed_forward,
            head: floats(cost.lm_head(1)),
        }
    }

    pub fn floats(&self) -> usize {
        self.embedding_row
            + self.attention
            + self.norms
            + self.routers
            + self.feed_forward
            + self.head
    }

    pub fn bytes(&self) -> usize {
        4 * self.floats()
    }
}

/// What is counted as read per decoded token, in words (printed under the table and in the JSON).
pub const BYTES_COUNTED: &str = "every f32 weight the token uses, once: one embedding row, q/k/v/o (+ biases) \
     and both RMSNorms of every layer, the dense MLP or (MoE) the router plus only the k routed experts, the \
     final norm and the whole head [V, D]; KV-cache reads and activations are not counted";

/// One bench run, with its medians.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub model: String,
    pub parameter_count: usize,
    pub threads: usize,
    pub cpu: String,
    pub sizes: Sizes,
    /// Per timed run.
    pub prefill_seconds: Vec<f64>,
    pub decode_seconds: Vec<f64>,
    /// Medians over the timed runs.
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub ms_per_token: f64,
    pub decode_weights: DecodeWeights,
    pub bytes_per_token: usize,
    pub bytes_counted: &'static str,
    pub achieved_bytes_per_second: f64,
    /// Best of several multi-threaded streaming reads of `bandwidth_mib`.
    pub memory_read_bytes_per_second: f64,
    pub achieved_fraction: f64,
}

pub fn check_sizes(sizes: &Sizes) -> Result<()> {
    if sizes.prompt_len == 0 {
        bail!("--prompt-len must be at least 1");
    }
    if sizes.decode_tokens < 2 {
        bail!("--decode-tokens must be at least 2 (the first token comes from the prefill)");
    }
    if sizes.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if !(1..=MAX_BANDWIDTH_MIB).contains(&sizes.bandwidth_mib) {
        bail!("--bandwidth-mib must be in 1..={MAX_BANDWIDTH_MIB}");
    }
    Ok(())
}

/// Refuse `--prompt-len` and `--decode-tokens` that do not fit the model's context together (the
/// greedy runs here, the batched decoding of `bench --cost-shape`); a saturated count is said as
/// "or more".
pub fn check_context(loaded: &LoadedModel, sizes: &Sizes) -> Result<()> {
    let needed = decode_positions(sizes.prompt_len, sizes.decode_tokens);
    let context = loaded.model.context_length();
    if needed > context {
        let needed = match needed {
            usize::MAX => format!("{needed} or more"),
            n => n.to_string(),
        };
        bail!(
            "--prompt-len {} and --decode-tokens {} need {needed} positions (the last token is \
             never fed), more than the context of {} ({context})",
            sizes.prompt_len,
            sizes.decode_tokens,
            loaded.name,
        );
    }
    Ok(())
}

/// Warm up, time `repeats` greedy runs of `prompt_len + decode_tokens`, and probe the memory bandwidth.
pub fn measure(loaded: &LoadedModel, sizes: &Sizes) -> Result<BenchResult> {
    check_sizes(sizes)?;
    check_context(loaded, sizes)?;
    let model = &loaded.model;
    let config = &model.config;
    // A fixed pseudo-random prompt; no stop tokens, so every run decodes exactly `decode_tokens`.
    let prompt: Vec<u32> = (0..sizes.prompt_len as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % config.vocab_size as u64) as u32)
        .collect();
    let options = GenerateOptions {
        max_new_tokens: sizes.decode_tokens,
        stop_tokens: vec![],
        sampling: None,
    };
    // Warm-up: a shorter run that touches every weight and the allocator.
    let warm = GenerateOptions {
        max_new_tokens: sizes.decode_tokens.min(4),
        ..options.clone()
    };
    generate(
        model,
        &prompt[..sizes.prompt_len.min(16)],
        &warm,
        &mut |_, _| {},
    )?;

    let (mut prefill_seconds, mut decode_seconds, mut prefill_tps, mut decode_tps) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..sizes.repeats {
        let g = generate(model, &prompt, &options, &mut |_, _| {})?;
        prefill_tps.push(sizes.prompt_len as f64 / g.prefill_seconds);
        decode_tps.push(g.decode_tokens_per_second());
        prefill_seconds.push(g.prefill_seconds);
        decode_seconds.push(g.decode_seconds);
    }
    let prefill_tokens_per_second = median(&prefill_tps);
    let decode_tokens_per_second = median(&decode_tps);

    let decode_weights = DecodeWeights::of(config);
    let bytes_per_token = decode_weights.bytes();
    let achieved = bytes_per_token as f64 * decode_tokens_per_second;
    let machine = bandwidth(sizes);
    Ok(BenchResult {
        model: loaded.name.clone(),
        parameter_count: config.parameter_count(),
        threads: rayon::current_num_threads(),
        cpu: cpu_model(),
        sizes: sizes.clone(),
        prefill_seconds,
        decode_seconds,
        prefill_tokens_per_second,
        decode_tokens_per_second,
        ms_per_token: 1000.0 / decode_tokens_per_second,
        decode_weights,
        bytes_per_token,
        bytes_counted: BYTES_COUNTED,
        achieved_bytes_per_second: achieved,
        memory_read_bytes_per_second: machine,
        achieved_fraction: achieved / machine,
    })
}

pub fn print_table(r: &BenchResult) {
    let s = &r.sizes;
    println!(
        "bench {}: {} parameters, f32",
        r.model,
        common::count(r.parameter_count as f64)
    );
    println!("cpu: {}, {} rayon threads", r.cpu, r.threads);
    println!(
        "prompt {} tokens, decode {} tokens, greedy; median of {} runs after 1 warm-up",
        s.prompt_len, s.decode_tokens, s.repeats
    );
    let rows = [
        (
            "prefill",
            format!("{:.1} tokens/s", r.prefill_tokens_per_second),
        ),
        (
            "decode",
            format!("{:.1} tokens/s", r.decode_tokens_per_second),
        ),
        ("decode latency", format!("{:.2} ms/token", r.ms_per_token)),
        (
            "weights read / decoded token",
            common::bytes(r.bytes_per_token as f64),
        ),
        (
            "achieved read bandwidth",
            format!("{}/s", common::bytes(r.achieved_bytes_per_second)),
        ),
        (
            "machine read bandwidth",
            format!(
                "{}/s (streaming read of {} MiB, {} threads, best of 5)",
                common::bytes(r.memory_read_bytes_per_second),
                s.bandwidth_mib,
                r.threads
            ),
        ),
        (
            "achieved fraction",
            format!("{:.1} %", 100.0 * r.achieved_fraction),
        ),
    ];
    for (name, value) in rows {
        println!("  {name:<30} {value}");
    }
    println!("  (bytes counted: {BYTES_COUNTED})");
}

pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The machine's read bandwidth as every bench measures it: the best of 5 streaming reads of
/// `--bandwidth-mib`, with a note when that buffer is not well past the last-level cache.
pub fn bandwidth(sizes: &Sizes) -> f64 {
    if let Some(cache) = last_level_cache_bytes()
        && (sizes.bandwidth_mib << 20) < 4 * cache
    {
        eprintln!(
            "note: the read-bandwidth probe's buffer ({} MiB, `m2r2 bench --bandwidth-mib`) is \
             not much larger than this CPU's last-level cache ({} MiB): the probe measures the \
             cache, not memory, and the achieved fraction is taken of that",
            sizes.bandwidth_mib,
            cache >> 20
        );
    }
    memory_read_bandwidth(sizes.bandwidth_mib << 20, 5)
}

/// The largest CPU cache of cpu0 in bytes, from Linux's sysfs (`None` elsewhere, or unreadable).
fn last_level_cache_bytes() -> Option<usize> {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    caches
        .filter_map(|entry| {
            cache_size(&std::fs::read_to_string(entry.ok()?.path().join("size")).ok()?)
        })
        .max()
}

/// A sysfs cache size (`32768K`, `1M`) in bytes.
fn cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let scale = match unit {
        "K" => 1 << 10,
        "M" => 1 << 20,
        _ => return None,
    };
    Some(digits.parse::<usize>().ok()? * scale)
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU (no model name in /proc/cpuinfo)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_cache_sizes() {
        assert_eq!(cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(cache_size("1M"), Some(1 << 20));
        for bad in ["", "K", "32768", "12G", "x1K"] {
            assert_eq!(cache_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decode_weights_of_a_dense_model_are_all_parameters_plus_one_row() {
        // Tied embeddings: the parameter count holds the embedding once; a decode step reads the
        // whole matrix as head plus one row as embedding.
        let c = reference::io::builtin::tiny_config();
        let w = DecodeWeights::of(&c);
        assert_eq!(w.floats(), c.parameter_count() + c.hidden_size);
    }

    #[test]
    fn decode_weights_of_moe_count_only_routed_experts() {
        let c = reference::io::builtin::tiny_moe_config();
        let moe = c.moe.clone().unwrap();
        let w = DecodeWeights::of(&c);
        let expert = 3 * c.hidden_size * c.intermediate_size;
        let unused =
            c.num_hidden_layers * (moe.num_local_experts - moe.num_experts_per_tok) * expert;
        // Untied: the embedding is counted in the parameters in full, read as one row.
        let embedding_rest = (c.vocab_size - 1) * c.hidden_size;
        assert_eq!(w.floats(), c.parameter_count() - unused - embedding_rest);
    }

    /// The split adds up to the cost model's greedy decode step, dense and MoE.
    #[test]
    fn decode_weights_add_up_to_the_cost_models_greedy_step() {
        for c in [
            reference::io::builtin::tiny_config(),
            reference::io::builtin::tiny_moe_config(),
        ] {
            let step = CostModel::new(&c, None).greedy_step(5);
            assert_eq!(DecodeWeights::of(&c).bytes() as u64, step.weight_bytes);
        }
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
