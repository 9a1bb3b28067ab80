//! `m2r2 run`: decode with the graphs of an export folder on ONNX Runtime (`--ep cpu|cuda|tensorrt`),
//! greedy over model.onnx or self-speculative over draft.onnx / verifier.onnx through the
//! reference's own loop. The `--json` report and `--trace` are those of `m2r2 generate`, plus the
//! execution provider that really ran.

use crate::cli::args::m2r2::OnOff;
use crate::cli::args::model::PromptArgs;
use crate::cli::args::onnx::{EpArgs, check_draft_head};
use crate::cli::common;
use crate::cli::report::trace_lines;
use crate::cli::report::{json_report, print_summary};
use anyhow::{Context, Result, bail};
use onnx_runner::ep::{Ep, EpConfig};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::ExportDir;
use onnx_runner::speculation::OnnxSpeculation;
use onnx_runner::static_kv::GraphRuns;
use reference::base::generate::GenerateOptions;
use reference::base::work::Work;
use reference::decode::drafting::{Drafting, DraftingRequest, resolve_drafting};
use reference::decode::early_exit::KvPolicy;
use reference::decode::mode::{
    DecodeRequest, M2r2Settings, Mode, ModeRun, greedy_run, greedy_step, speculative_run,
};
use reference::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
use reference::decode::timed::Timed;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::exit_gate::GateKind;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// The decoding loops `m2r2 run` has (early exit is not exported).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// model.onnx, one token per run
    Greedy,
    /// draft.onnx proposes, verifier.onnx verifies (lossless)
    Speculative,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Export folder written by `m2r2 export` (with m2r2_export.json)
    #[arg(long, value_name = "DIR")]
    pub onnx: PathBuf,
    #[command(flatten)]
    pub ep: EpArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Tokens to generate at most (0 generates nothing); generation also stops at an end token
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Decoding mode
    #[arg(long, value_enum, value_name = "MODE", default_value_t = RunMode::Greedy)]
    pub mode: RunMode,
    /// Tokens drafted per verification, >= 1: fixed drafting (default: the export's
    /// `dynamic_draft` when it has one, else `draft_len` tokens)
    #[arg(long, value_name = "N", conflicts_with = "dynamic_draft")]
    pub draft_len: Option<usize>,
    /// Draft until the gate score falls below --threshold (at most the export's draft_len)
    #[arg(long)]
    pub dynamic_draft: bool,
    /// Draft gate score: arla | confidence | entropy (default: arla when exported, else confidence)
    #[arg(long, value_name = "GATE", value_parser = parse_gate)]
    pub gate: Option<GateKind>,
    /// Keep drafting (--dynamic-draft) while the gate score is >= X (default: the export's
    /// arla.threshold)
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub threshold: Option<f32>,
    /// Print one JSON object (tokens, text, timings, statistics, execution provider)
    #[arg(long)]
    pub json: bool,
    /// Print the per-token (greedy) or per-round (speculative) trace on stderr, as `m2r2 generate`
    #[arg(long)]
    pub trace: bool,
    /// Pruned draft head: must match the export (draft.onnx scores only the head's K tokens when
    /// it was exported with one; default: whatever the export has)
    #[arg(long, value_enum, value_name = "on|off")]
    pub draft_head: Option<OnOff>,
}

fn parse_gate(text: &str) -> Result<GateKind, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

/// The settings of a run on an export, as `m2r2 generate` reports them.
pub fn settings(
    export: &ExportDir,
    mode: RunMode,
    gate: Option<GateKind>,
    threshold: Option<f32>,
    draft_len: Option<usize>,
    dynamic_draft: bool,
    draft_head: Option<OnOff>,
) -> Result<M2r2Settings> {
    let m = &export.manifest;
    check_draft_head(export, draft_head)?;
    let Drafting {
        gate,
        threshold,
        draft_length,
    } = resolve_drafting(
        &m.m2r2,
        DraftingRequest {
            speculative: mode == RunMode::Speculative,
            gate,
            threshold,
            draft_len,
            dynamic_draft,
        },
        m.has_arla,
        "this export has none (draft.onnx has no exit_prob)",
    )?;
    Ok(M2r2Settings {
        mode: match mode {
            RunMode::Greedy => Mode::Greedy,
            RunMode::Speculative => Mode::Speculative,
        },
        source: format!("export {}", export.dir.display()),
        gates: m.m2r2.gates.clone(),
        gate,
        threshold,
        kv_policy: KvPolicy::Exact,
        draft_gate: m.draft_gate,
        draft_length,
        draft_head_tokens: m.draft_head_tokens.filter(|_| mode == RunMode::Speculative),
    })
}

/// One decode on ONNX Runtime, and the provider that really ran it.
pub struct OnnxRun {
    pub run: ModeRun,
    pub ep_used: Ep,
    /// How the runs went when greedy's decode step was a CUDA graph.
    pub cuda_graph: Option<GraphRuns>,
}

/// Decode `request` on the export in `settings.mode`; `record_scores` scores every proposal
/// (for `--trace`).
pub fn decode(
    export: &ExportDir,
    ep: &EpConfig,
    settings: &M2r2Settings,
    request: &DecodeRequest<'_>,
    record_scores: bool,
) -> Result<OnnxRun> {
    let n = export.manifest.config.num_hidden_layers;
    match settings.mode {
        Mode::Greedy => {
            let mut model = OnnxModel::load(export, ep)?;
            let options = GenerateOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                sampling: None,
            };
            let mut steps = Vec::new();
            let generation = model.generate(request.prompt, &options, &mut |token, logits| {
                steps.push(greedy_step(token, logits, n));
            })?;
            Ok(OnnxRun {
                run: greedy_run(generation, steps, n),
                ep_used: model.session().ep_used(),
                cuda_graph: model.cuda_graph_runs(),
            })
        }
        Mode::Speculative => {
            let gate = (record_scores
                || matches!(settings.draft_length, DraftLength::Dynamic { .. }))
            .then_some(settings.gate);
            let mut backend = OnnxSpeculation::load(export, ep, gate)?;
            if backend.feed_session().is_none() {
                eprintln!(
                    "note: {} has no feed.onnx (an export from before it, or --graphs without \
                     it): the positions nothing is proposed from run through draft.onnx, which \
                     gives the same tokens more slowly; export again to add it",
                    export.dir.display()
                );
            }
            let options = SpeculativeOptions {
                max_new_tokens: request.max_new_tokens,
                stop_tokens: request.stop_tokens.clone(),
                draft_length: settings.draft_length.clone(),
                sampling: None,
            };
            let mut timed = Timed::new(&mut backend);
            let start = Instant::now();
            let out = speculative_generate(&mut timed, request.prompt, &options)?;
            let seconds = start.elapsed().as_secs_f64();
            let prefill = timed.times.prefill_seconds;
            let (draft, verifier) = backend.sessions();
            // The graphs load with the same provider config; report the weaker if they differ.
            let ep_used = if draft.ep_used() == verifier.ep_used()
                && backend
                    .feed_session()
                    .is_none_or(|f| f.ep_used() == draft.ep_used())
            {
                draft.ep_used()
            } else {
                Ep::Cpu
            };
            Ok(OnnxRun {
                run: speculative_run(out, n, prefill, seconds, Work::default()),
                ep_used,
                cuda_graph: backend.cuda_graph_runs(),
            })
        }
        Mode::EarlyExit => bail!("early exit is not exported; use greedy or speculative"),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let export = ExportDir::open(&args.onnx)?;
    let tokenizer = export.tokenizer()?;
    let prompt = common::prompt_tokens_with(
        tokenizer_or_error(&export, tokenizer.as_ref()),
        &args.prompt,
    )?;
    let settings = settings(
        &export,
        args.mode,
        args.gate,
        args.threshold,
        args.draft_len,
        args.dynamic_draft,
        args.draft_head,
    )?;
    if args.ep.ort_compare.is_some() {
        bail!(
            "--ort-compare is for `m2r2 bench --cost-shape --onnx DIR`; `run` takes one set of options"
        );
    }
    args.ep.check_single_cuda_graph("run")?;
    let ep = args.ep.config(&export, settings.draft_length.max());
    let runtime = onnx_runner::runtime::init()?;
    eprintln!(
        "ONNX Runtime {} ({}), {} on {}",
        runtime.version,
        runtime.path.display(),
        export.manifest.model_name,
        args.ep.ep
    );
    let request = DecodeRequest {
        prompt: &prompt,
        max_new_tokens: args.max_new_tokens,
        stop_tokens: export.stop_tokens(tokenizer.as_ref()),
        sampling: None,
    };
    let OnnxRun {
        run,
        ep_used,
        cuda_graph,
    } = decode(&export, &ep, &settings, &request, args.trace)
        .with_context(|| format!("cannot decode with {}", export.dir.display()))?;

    if args.trace {
        let text = |token: u32| match &tokenizer {
            Some(t) => t.decode(&[token], false).unwrap_or_default(),
            None => String::new(),
        };
        for line in trace_lines(&run, &settings, &text) {
            eprintln!("{line}");
        }
    }
    let text = match &tokenizer {
        Some(t) => Some(t.decode(&run.tokens, true)?),
        None => None,
    };
    if args.json {
        let source = export.dir.display().to_string();
        let mut report = json_report(
            &export.manifest.model_name,
            &source,
            &request,
            &run,
            text,
            &settings,
        );
        let object = report.as_object_mut().expect("a JSON object");
        // Work is counted by the reference only: ONNX Runtime's is not known here.
        object.insert("flops_per_token".into(), json!(null));
        object.insert("bytes_per_token".into(), json!(null));
        object.insert("ep".into(), json!(args.ep.ep.name()));
        object.insert("ep_used".into(), json!(ep_used.name()));
        object.insert("onnxruntime".into(), json!(runtime.version));
        // Runs counted after ONNX Runtime returned success, by the gpu_graph_id each one set.
        object.insert(
            "cuda_graph".into(),
            match cuda_graph {
                Some(g) => json!({"graph_runs": g.graph, "uncaptured_runs": g.uncaptured}),
                None => json!(null),
            },
        );
        common::print_json(&report)?;
    } else {
        match text {
            Some(text) => println!("{text}"),
            None => {
                let ids: Vec<String> = run.tokens.iter().map(u32::to_string).collect();
                println!("{}", ids.join(" "));
            }
        }
        let stopped = run
            .tokens
            .last()
            .is_some_and(|t| request.stop_tokens.contains(t));
        print_summary(&run, prompt.len(), stopped);
        eprintln!(
            "[execution provider: {} requested, {} ran]",
            args.ep.ep, ep_used
        );
        if let Some(g) = cuda_graph {
            eprintln!(
                "[CUDA graph: {} decode steps with gpu_graph_id 1, {} uncaptured runs]",
                g.graph, g.uncaptured
            );
        }
    }
    Ok(())
}

/// The tokenizer, or the error `--prompt` gets for an export without one.
fn tokenizer_or_error<'a>(
    export: &ExportDir,
    tokenizer: Option<&'a Tokenizer>,
) -> reference::Result<&'a Tokenizer> {
    tokenizer.ok_or_else(|| {
        reference::Error::Invalid(format!(
            "{} has no tokenizer (no tokenizer.json in the export); pass --tokens instead of --prompt",
            export.dir.display()
        ))
    })
}
