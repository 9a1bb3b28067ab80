//! `m2r2 bench --cost-shape`: what each kind of step costs, on the reference and (with `--onnx`) on
//! ONNX Runtime, side by side in one run: a greedy decode step, a draft step (the draft gate's
//! lower layers with the fast stream, the draft head), a feed step (the same layers' slow stream
//! alone: a position nothing is proposed from; feed.onnx on ONNX Runtime), and verify chunks of 1,
//! 2, 5, 9 and 16 rows (the layers above the draft gate and the head on every row), each also as a
//! ratio to the greedy step. On memory-bound hardware a chunk of a few rows costs about one step,
//! since the rows share one read of the weights; a ratio that grows with the rows means the
//! products are compute-bound. Also: the measured read bandwidth and the fraction a greedy step
//! achieves, and batched decoding of independent sequences (tokens/s at B = 1, 4, 16, reference)
//! and training rows/s of the draft gate's adapters (`training.rs`; left out, with a note saying
//! why, on a model the trainer cannot train adapters of, such as an MoE model).

use crate::cli::args::bench::Sizes;
use crate::cli::bench::training::TrainingSpeed;
use crate::cli::decode_speed::DecodeWeights;
use crate::cli::step_times::{bench_prompt, time_steps};
use anyhow::{Result, bail};
use reference::base::batch::{BatchRequest, generate_batch};
use reference::base::generate::ReferenceGreedy;
use reference::base::generate::{GenerateOptions, GreedyBackend, decode_positions};
use reference::base::matmul::kernel::Kernel;
use reference::decode::speculative::SpeculativeBackend;
use reference::io::load::LoadedModel;
use serde::Serialize;

/// Verify chunk sizes measured.
pub const VERIFY_ROWS: [usize; 5] = [1, 2, 5, 9, 16];
/// The largest verify chunk (the last of [`VERIFY_ROWS`]).
pub const MAX_VERIFY_ROWS: usize = VERIFY_ROWS[VERIFY_ROWS.len() - 1];
/// Batch sizes of the batched-decoding rows.
pub const BATCHES: [usize; 3] = [1, 4, 16];

/// One engine's step costs (medians, milliseconds).
#[derive(Clone, Debug, Serialize)]
pub struct EngineShape {
    pub engine: String,
    pub greedy_step_ms: f64,
    pub draft_step_ms: f64,
    /// A draft-layer step that proposes nothing (slow stream only).
    pub feed_step_ms: f64,
    /// `(rows, ms)` per verify chunk size.
    pub verify_ms: Vec<(usize, f64)>,
    /// `bytes read per greedy step / greedy step time`.
    pub achieved_bytes_per_second: f64,
    pub achieved_fraction: f64,
}

impl EngineShape {
    pub fn ratio(&self, ms: f64) -> f64 {
        ms / self.greedy_step_ms
    }
}

/// Batched decoding throughput at one batch size.
#[derive(Clone, Debug, Serialize)]
pub struct BatchSpeed {
    pub batch: usize,
    /// All tokens over the whole run, the prompts' prefill included.
    pub tokens_per_second: f64,
    /// Tokens after each sequence's first, over the decode phase (first token to last): the
    /// throughput of the decode steps alone.
    pub decode_tokens_per_second: f64,
}

/// Everything `--cost-shape` prints.
#[derive(Clone, Debug, Serialize)]
pub struct CostShape {
    pub model: String,
    pub cpu: String,
    pub threads: usize,
    pub kernel: String,
    pub m2r2: String,
    pub draft_gate: usize,
    pub draft_head_tokens: Option<usize>,
    pub prompt_len: usize,
    pub repeats: usize,
    pub bytes_per_greedy_step: usize,
    pub memory_read_bytes_per_second: f64,
    pub engines: Vec<EngineShape>,
    pub batched_decoding: Vec<BatchSpeed>,
    /// Training of the draft gate's adapters (`m2r2 train`'s step); `None` (null) when the trainer
    /// cannot train them on this model, `training_skipped` saying why.
    pub training: Option<TrainingSpeed>,
    /// Why the training row was left out (the trainer's refusal, e.g. an MoE layer); `None` (null)
    /// when it was measured.
    pub training_skipped: Option<String>,
}

/// Step costs of one engine ([`time_steps`] with the verify chunks of [`VERIFY_ROWS`]), with the
/// read bandwidth a greedy step achieves.
pub fn measure_engine(
    engine: String,
    greedy: &mut dyn GreedyBackend,
    spec: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    repeats: usize,
    bytes_per_step: usize,
    bandwidth: f64,
) -> Result<EngineShape> {
    let times = time_steps(greedy, spec, prompt, repeats, &VERIFY_ROWS)?;
    let achieved = bytes_per_step as f64 / (times.greedy / 1e3);
    Ok(EngineShape {
        engine,
        greedy_step_ms: times.greedy,
        draft_step_ms: times.propose,
        feed_step_ms: times.feed,
        verify_ms: times.verify,
        achieved_bytes_per_second: achieved,
        achieved_fraction: achieved / bandwidth,
    })
}

/// Tokens/s of batched greedy decoding on the reference: `batch` sequences of `decode_tokens`
/// each after `prompt_len`-token prompts (distinct prompts, no stop tokens), prefill included.
pub fn batched_speed(
    loaded: &LoadedModel,
    batch: usize,
    prompt_len: usize,
    decode_tokens: usize,
) -> Result<BatchSpeed> {
    let base = bench_prompt(loaded, prompt_len + batch);
    let requests: Vec<BatchRequest> = (0..batch)
        .map(|b| BatchRequest {
            prompt: base[b..b + prompt_len].to_vec(),
            options: GenerateOptions {
                max_new_tokens: decode_tokens,
                stop_tokens: vec![],
                sampling: None,
            },
        })
        .collect();
    let run = generate_batch(&loaded.model, &requests, batch, &mut |_, _| {})?;
    let tokens: usize = run.generations.iter().map(|g| g.tokens.len()).sum();
    // Every sequence is admitted in the first step, so the decode phases run side by side and the
    // longest is the batch's decode time.
    let decode_seconds = run
        .generations
        .iter()
        .map(|g| g.decode_seconds)
        .fold(0.0, f64::max);
    let decoded: usize = run
        .generations
        .iter()
        .map(|g| g.tokens.len().saturating_sub(1))
        .sum();
    Ok(BatchSpeed {
        batch,
        tokens_per_second: tokens as f64 / run.seconds.max(1e-12),
        decode_tokens_per_second: decoded as f64 / decode_seconds.max(1e-12),
    })
}

/// The reference's part: its engine shape and batched decoding.
pub fn reference_shape(
    loaded: &LoadedModel,
    spec: &mut dyn SpeculativeBackend,
    sizes: &Sizes,
    bandwidth: f64,
) -> Result<(EngineShape, Vec<BatchSpeed>)> {
    let prompt = bench_prompt(loaded, sizes.prompt_len);
    let bytes = DecodeWeights::of(&loaded.model.config).bytes();
    let mut greedy = ReferenceGreedy::new(&loaded.model);
    let shape = measure_engine(
        "reference".into(),
        &mut greedy,
        spec,
        &prompt,
        sizes.repeats,
        bytes,
        bandwidth,
    )?;
    let batched = BATCHES
        .iter()
        .map(|&b| batched_speed(loaded, b, sizes.prompt_len, sizes.decode_tokens))
        .collect::<Result<_>>()?;
    Ok((shape, batched))
}

/// Cache positions the speculation backend holds: the prompt, the largest verify chunk's drafted
/// rows ([`MAX_VERIFY_ROWS`]) and one more (the capacity its cache is made with).
pub fn verify_positions(prompt_len: usize) -> usize {
    prompt_len.saturating_add(MAX_VERIFY_ROWS + 1)
}

/// Cache positions the greedy engine's steps take: the prompt, then one token fed per round (one
/// warm-up and `repeats` timed), what a decode of `repeats + 2` tokens writes (the first comes from
/// the prefill, the last is never fed).
pub fn greedy_positions(prompt_len: usize, repeats: usize) -> usize {
    decode_positions(prompt_len, repeats.saturating_add(2))
}

/// Refuse sizes the measurement cannot run, naming the flag that does not fit: the verify chunks
/// after the prompt (--prompt-len), the greedy rounds (--repeats), the batched decoding
/// (--decode-tokens, plain `bench`'s own check). Saturating counts ([`decode_positions`]).
pub fn check(loaded: &LoadedModel, sizes: &Sizes) -> Result<()> {
    let (prompt, repeats) = (sizes.prompt_len, sizes.repeats);
    let context = loaded.model.context_length();
    let name = &loaded.name;
    let verify = verify_positions(prompt);
    if verify > context {
        bail!(
            "--prompt-len {prompt} leaves no room for the verify chunk of {} rows: the prompt, the \
             drafted rows and one more need {} positions, more than the context of {name} \
             ({context}); --prompt-len must be at most {}",
            MAX_VERIFY_ROWS,
            positions(verify),
            context.saturating_sub(MAX_VERIFY_ROWS + 1),
        );
    }
    let greedy = greedy_positions(prompt, repeats);
    if greedy > context {
        bail!(
            "--repeats {repeats} does not fit with --prompt-len {prompt}: the prompt and one greedy \
             token per round (1 warm-up and {repeats} timed) need {} positions, more than the \
             context of {name} ({context}); --repeats must be at most {} with this prompt",
            positions(greedy),
            context - prompt - 1,
        );
    }
    crate::cli::decode_speed::check_context(loaded, sizes)
}

/// A saturated count of positions, said as such.
fn positions(n: usize) -> String {
    if n == usize::MAX {
        format!("{n} or more")
    } else {
        n.to_string()
    }
}

/// The table.
pub fn print(r: &CostShape) {
    println!(
        "cost shape of {} ({} kernel): ms per step and as a ratio to the greedy step; M2R2 weights: {}",
        r.model, r.kernel, r.m2r2
    );
    println!(
        "cpu: {}, {} rayon threads; prompt {} tokens; draft gate {}, {}; median of {} rounds (one step of each kind per round) after 1 warm-up",
        r.cpu,
        r.threads,
        r.prompt_len,
        r.draft_gate,
        match r.draft_head_tokens {
            Some(k) => format!("pruned draft head of {k} tokens"),
            None => "full draft head".into(),
        },
        r.repeats
    );
    let mut header = format!(
        "  {:<22} {:>14} {:>14} {:>14}",
        "engine", "greedy step", "draft step", "feed step"
    );
    for (rows, _) in &r.engines[0].verify_ms {
        header += &format!(" {:>14}", format!("verify {rows}"));
    }
    header += &format!(" {:>9}", "of GB/s");
    println!("{header}");
    for e in &r.engines {
        let cell = |ms: f64| format!("{ms:.2} ({:.2})", e.ratio(ms));
        let mut line = format!(
            "  {:<22} {:>14} {:>14} {:>14}",
            e.engine,
            cell(e.greedy_step_ms),
            cell(e.draft_step_ms),
            cell(e.feed_step_ms)
        );
        for (_, ms) in &e.verify_ms {
            line += &format!(" {:>14}", cell(*ms));
        }
        line += &format!(" {:>8.1}%", 100.0 * e.achieved_fraction);
        println!("{line}");
    }
    println!(
        "  (a greedy step reads {:.1} MB of weights; measured read bandwidth {:.2} GB/s; \"of GB/s\": the fraction a greedy step achieves)",
        r.bytes_per_greedy_step as f64 / 1e6,
        r.memory_read_bytes_per_second / 1e9
    );
    let single = r
        .batched_decoding
        .first()
        .map_or(0.0, |b| b.decode_tokens_per_second);
    let batched: Vec<String> = r
        .batched_decoding
        .iter()
        .map(|b| {
            format!(
                "B={}: {:.1} tok/s ({:.2}x; {:.1} with prefill)",
                b.batch,
                b.decode_tokens_per_second,
                b.decode_tokens_per_second / single.max(1e-12),
                b.tokens_per_second
            )
        })
        .collect();
    println!(
        "  batched decoding on the reference, decode steps: {}",
        batched.join(", ")
    );
    match (&r.training, &r.training_skipped) {
        (Some(t), _) => println!(
            "  training gate {} ({} rows per step): {:.1} ms per step, {:.0} rows/s",
            t.gate, t.rows_per_step, t.step_ms, t.rows_per_second
        ),
        (None, why) => println!(
            "  training gate {}: not measured, {}'s adapters cannot be trained ({})",
            r.draft_gate,
            r.model,
            why.as_deref().unwrap_or("no reason given")
        ),
    }
}

/// The kernel `linear` uses on this CPU.
pub fn kernel_name() -> String {
    Kernel::best().name().into()
}
