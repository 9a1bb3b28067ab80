//! `m2r2 bench`: prefill and decode speed of the reference against the machine's measured memory
//! read bandwidth (`decode_speed`), the reference's self-speculative decoding (`--speculative`), an
//! ONNX export against the reference (`--onnx`), and the cost of each kind of step
//! (`--cost-shape`).

pub mod cost_shape;
pub mod onnx;
pub mod results;
pub mod spec_bench;
pub mod training;

use crate::cli::args::model::ModelArgs;
use crate::cli::args::onnx::head_words;
use crate::cli::common;
use results::{EngineResult, check_equalities, print_engines};
use spec_bench::SpecBench;

use crate::cli::args::bench::Sizes;
use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::decode_speed::{DecodeWeights, check_sizes, cpu_model, measure, print_table};
use anyhow::{Result, bail};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sizes: Sizes,
    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,
    /// Also run this ONNX export (of --model) on ONNX Runtime: greedy and speculative against the
    /// reference (see `--ep`). Repeat it to measure several exports side by side in one run (e.g.
    /// a dynamic and a `--static-cache` export), their runs alternating
    #[arg(long, value_name = "DIR")]
    pub onnx: Vec<std::path::PathBuf>,
    #[command(flatten)]
    pub ep: crate::cli::args::onnx::EpArgs,
    /// With --onnx or --speculative: the reference's M2R2 weights, as in `generate --m2r2` (with
    /// --onnx: those the export was made with)
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Bench the reference's greedy and self-speculative decoding (draft gate and length from the
    /// M2R2 config): tokens/s, accepted length, ms per draft and per verify step
    #[arg(long, conflicts_with = "onnx")]
    pub speculative: bool,
    /// With --onnx or --speculative: the pruned draft head (draft_head.json in the --m2r2 folder;
    /// default: on when there is one). With --onnx it must match the export.
    #[arg(long, value_enum, value_name = "on|off")]
    pub draft_head: Option<OnOff>,
    /// Time each kind of step (greedy step, draft step, verify chunks of 1, 2, 5, 9 and 16 rows) and
    /// show it as a ratio to the greedy step, with the read bandwidth and batched decoding; with
    /// --onnx, ONNX Runtime in the same table
    #[arg(long, conflicts_with = "speculative")]
    pub cost_shape: bool,
}

pub fn run(args: &Args) -> Result<()> {
    check_sizes(&args.sizes)?;
    args.ep
        .refuse_without_onnx(!args.onnx.is_empty(), "bench")?;
    let loaded = common::load(&args.model.model)?;
    if args.cost_shape {
        return cost_shape(&loaded, args);
    }
    if !args.onnx.is_empty() {
        return onnx::run(
            &loaded,
            args.m2r2.clone(),
            args.draft_head,
            &args.onnx,
            &args.ep,
            &args.sizes,
            args.json,
        );
    }
    if args.m2r2.is_some() && !args.speculative {
        bail!("--m2r2 needs --onnx or --speculative (greedy decoding uses no M2R2 weights)");
    }
    if args.draft_head.is_some() && !args.speculative {
        bail!("--draft-head needs --onnx or --speculative");
    }
    if args.speculative {
        return speculative(&loaded, args);
    }
    let result = measure(&loaded, &args.sizes)?;
    if args.json {
        common::print_json(&result)?;
    } else {
        print_table(&result);
    }
    Ok(())
}

/// The reference's speculative bench (`--speculative`).
#[derive(Clone, Debug, Serialize)]
pub struct SpeculativeBenchResult {
    pub model: String,
    pub cpu: String,
    pub threads: usize,
    pub m2r2: String,
    pub draft_gate: usize,
    pub draft_len: usize,
    /// `K` of the pruned draft head; `None`: the full head.
    pub draft_head_tokens: Option<usize>,
    pub prompt_len: usize,
    pub decode_tokens: usize,
    pub repeats: usize,
    pub engine: EngineResult,
}

fn speculative(loaded: &LoadedModel, args: &Args) -> Result<()> {
    let m2r2 = M2r2Args {
        draft_head: args.draft_head,
        ..M2r2Args::weights_only(args.m2r2.clone())
    };
    let weights = m2r2.weights(loaded)?;
    let (draft_gate, draft_len) = (weights.config.draft_gate, weights.config.draft_len.max(1));
    let bench = SpecBench::new(loaded, draft_gate, draft_len, &args.sizes)?;
    let s = &args.sizes;
    let result = SpeculativeBenchResult {
        model: loaded.name.clone(),
        cpu: cpu_model(),
        threads: rayon::current_num_threads(),
        m2r2: m2r2.source(loaded),
        draft_gate,
        draft_len,
        draft_head_tokens: weights.draft_head.as_ref().map(|h| h.len()),
        prompt_len: s.prompt_len,
        decode_tokens: s.decode_tokens,
        repeats: s.repeats,
        engine: bench.reference(&weights)?,
    };
    if args.json {
        common::print_json(&result)?;
    } else {
        println!(
            "bench {}: greedy vs self-speculative on the reference; M2R2 weights: {}",
            result.model, result.m2r2
        );
        println!("cpu: {}, {} rayon threads", result.cpu, result.threads);
        println!(
            "prompt {} tokens, decode {} tokens, draft gate {}, {} drafts per round, {}; median of {} runs after 1 warm-up",
            result.prompt_len,
            result.decode_tokens,
            draft_gate,
            draft_len,
            head_words(result.draft_head_tokens),
            result.repeats
        );
        print_engines(std::slice::from_ref(&result.engine));
    }
    check_equalities(std::slice::from_ref(&result.engine), true)
}

/// `--cost-shape`: the reference's step costs (and ONNX Runtime's with `--onnx`) in one table.
fn cost_shape(loaded: &LoadedModel, args: &Args) -> Result<()> {
    if args.onnx.len() > 1 {
        bail!("--cost-shape takes one --onnx export (--ort-compare compares session options)");
    }
    cost_shape::check(loaded, &args.sizes)?;
    let m2r2 = M2r2Args {
        draft_head: args.draft_head,
        ..M2r2Args::weights_only(args.m2r2.clone())
    };
    let weights = m2r2.weights(loaded)?;
    let draft_gate = weights.config.draft_gate;
    let bandwidth = crate::cli::decode_speed::bandwidth(&args.sizes);
    let mut spec = ReferenceSpeculation::new(
        M2r2::new(&loaded.model, &weights),
        draft_gate,
        None,
        cost_shape::verify_positions(args.sizes.prompt_len),
    )?;
    // Asked of the trainer before anything is timed: a model whose adapters it cannot train (an
    // MoE model) gets its table without the training row, and a note saying why.
    let training_skipped = training::untrainable(loaded, &weights, draft_gate)?;
    let (reference, batched_decoding) =
        cost_shape::reference_shape(loaded, &mut spec, &args.sizes, bandwidth)?;
    let training = match training_skipped {
        None => Some(training::training_speed(
            loaded,
            &weights,
            draft_gate,
            args.sizes.repeats,
        )?),
        Some(_) => None,
    };
    let mut engines = vec![reference];
    if let Some(dir) = args.onnx.first() {
        engines.extend(onnx::cost_shape_engines(
            loaded,
            (&weights, &m2r2.source(loaded)),
            dir,
            &args.ep,
            &args.sizes,
            bandwidth,
        )?);
    }
    let result = cost_shape::CostShape {
        model: loaded.name.clone(),
        cpu: cpu_model(),
        threads: rayon::current_num_threads(),
        kernel: cost_shape::kernel_name(),
        m2r2: m2r2.source(loaded),
        draft_gate,
        draft_head_tokens: weights.draft_head.as_ref().map(|h| h.len()),
        prompt_len: args.sizes.prompt_len,
        repeats: args.sizes.repeats,
        bytes_per_greedy_step: DecodeWeights::of(&loaded.model.config).bytes(),
        memory_read_bytes_per_second: bandwidth,
        engines,
        batched_decoding,
        training,
        training_skipped,
    };
    if args.json {
        common::print_json(&result)?;
    } else {
        cost_shape::print(&result);
    }
    Ok(())
}
