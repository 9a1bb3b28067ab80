//! `m2r2 run`: decode with the graphs of an export folder on ONNX Runtime (`--ep cpu|cuda|tensorrt`),
//! greedy over model.onnx or self-speculative over draft.onnx / verifier.onnx through the
//! reference's own loop (the library's `onnx_runner::decode`; this file parses flags and prints).
//! The `--json` report and `--trace` are those of `m2r2 generate`, plus the execution provider
//! that really ran.

use crate::cli::args::m2r2::{OnOff, SPECULATIVE};
use crate::cli::args::model::PromptArgs;
use crate::cli::args::onnx::{EpArgs, check_draft_head};
use crate::cli::args::refuse_unread_flags;
use crate::cli::args::tree::{
    TreeRequest, check_gate_flags_read, config_tree_growth, lookup_chain, lookup_or_default,
    prompt_lookup, tree_widths,
};
use crate::cli::common;
use crate::cli::report::trace_lines;
use crate::cli::report::{json_report, print_summary};
use anyhow::{Context, Result, bail};
use onnx_runner::decode::{OnnxRun, decode, decode_tree};
use onnx_runner::manifest::{ExportDir, GraphKind};
use reference::base::tree::TokenTree;
use reference::decode::drafting::DraftingRequest;
use reference::decode::mode::{DecodeRequest, M2r2Settings};
use reference::decode::speculative::DraftLength;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::exit_gate::GateKind;
use serde_json::json;
use std::path::PathBuf;

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
    /// Draft until the gate score falls below --threshold (at most the export's draft_len); with
    /// --draft-tree, grow the tree per branch: a node gets children only while its score passes
    #[arg(long)]
    pub dynamic_draft: bool,
    /// Draft gate score: arla | confidence | entropy (default: arla when exported, else confidence)
    #[arg(long, value_name = "GATE", value_parser = parse_gate)]
    pub gate: Option<GateKind>,
    /// Keep drafting (--dynamic-draft) while the gate score is >= X (default: the export's
    /// arla.threshold)
    #[arg(long, value_name = "X")]
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
    /// Speculative drafting with a token tree of widths W1,W2,... per depth (`2,1,1`), verified
    /// in one run of verifier.onnx (dynamic and static exports); with --dynamic-draft the largest
    /// tree, grown per branch: a node gets children while its gate score is >= --threshold.
    /// Default: the M2R2 config's draft_tree when it has one (speculative, no --draft-len /
    /// --dynamic-draft)
    #[arg(long, value_name = "W1,W2,...")]
    pub draft_tree: Option<String>,
    /// Speculative, greedy: each round also verifies a branch of up to N tokens copied from the
    /// text so far (what followed the latest earlier occurrence of its last 3, else 2, tokens)
    /// beside the tree (--draft-tree), else beside the chain of the draft length, grown per branch
    /// when the drafting is dynamic; 0: off. Default: the export's M2R2 config's prompt_lookup (no
    /// --draft-tree / --draft-len / --dynamic-draft), else off (as `m2r2 generate
    /// --prompt-lookup`)
    #[arg(long, value_name = "N")]
    pub prompt_lookup: Option<usize>,
    /// Refused with a pointer to `m2r2 generate` (hidden): the runner decodes greedily (0, greedy
    /// as on `generate`, is accepted)
    #[arg(long, value_name = "T", hide = true)]
    pub temperature: Option<String>,
    /// As --temperature (hidden)
    #[arg(long, value_name = "K", hide = true)]
    pub top_k: Option<String>,
    /// As --temperature (hidden)
    #[arg(long, value_name = "P", hide = true)]
    pub top_p: Option<String>,
    /// As --temperature (hidden)
    #[arg(long, value_name = "S", hide = true)]
    pub seed: Option<String>,
}

fn parse_gate(text: &str) -> Result<GateKind, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

/// The settings of a run on an export, as `m2r2 generate` reports them (the library's
/// `onnx_runner::decode::settings`, after `--draft-head` is checked against the export).
pub fn settings(
    export: &ExportDir,
    mode: RunMode,
    gate: Option<GateKind>,
    threshold: Option<f32>,
    draft_len: Option<usize>,
    dynamic_draft: bool,
    draft_head: Option<OnOff>,
) -> Result<M2r2Settings> {
    check_draft_head(export, draft_head)?;
    let request = DraftingRequest {
        speculative: mode == RunMode::Speculative,
        gate,
        threshold,
        draft_len,
        dynamic_draft,
    };
    Ok(onnx_runner::decode::settings(export, request)?)
}

pub fn run(args: &Args) -> Result<()> {
    // `--temperature 0` is greedy, as on `generate`
    let greedy = |t: &str| t.trim().parse::<f32>().is_ok_and(|t| t == 0.0);
    let sampling = [
        (
            "--temperature",
            args.temperature.as_ref().filter(|t| !greedy(t)),
        ),
        ("--top-k", args.top_k.as_ref()),
        ("--top-p", args.top_p.as_ref()),
        ("--seed", args.seed.as_ref()),
    ];
    if let Some((flag, _)) = sampling.iter().find(|(_, v)| v.is_some()) {
        bail!(
            "{flag}: `m2r2 run` decodes greedily on ONNX Runtime (--mode greedy, or speculative \
             with greedy verification); sampling, speculative sampling included, runs on the \
             reference: `m2r2 generate --temperature T`"
        );
    }
    let mode = match args.mode {
        RunMode::Greedy => "greedy",
        RunMode::Speculative => "speculative",
    };
    refuse_unread_flags(
        "--mode",
        mode,
        &[
            ("--gate", args.gate.is_some(), SPECULATIVE),
            ("--threshold", args.threshold.is_some(), SPECULATIVE),
            ("--draft-len", args.draft_len.is_some(), SPECULATIVE),
            ("--dynamic-draft", args.dynamic_draft, SPECULATIVE),
            ("--draft-head", args.draft_head.is_some(), SPECULATIVE),
        ],
    )?;
    let tree = tree_widths(&TreeRequest {
        spec: args.draft_tree.as_deref(),
        speculative: args.mode == RunMode::Speculative,
        draft_len: args.draft_len,
    })?;
    let speculative = args.mode == RunMode::Speculative;
    let explicit = match args.prompt_lookup {
        Some(n) => prompt_lookup(n, speculative)?,
        None => None,
    };
    let export = ExportDir::open(&args.onnx)?;
    let tokenizer = export.tokenizer()?;
    let prompt = common::prompt_tokens_with(
        tokenizer_or_error(&export, tokenizer.as_ref()),
        &args.prompt,
    )?;
    let mut settings = settings(
        &export,
        args.mode,
        args.gate,
        args.threshold,
        args.draft_len,
        args.dynamic_draft,
        args.draft_head,
    )?;
    // the config's default tree (`tune-drafting --write`) when nothing asks for other drafting;
    // else a lookup branch beside the chain of the draft length, dynamic or fixed as configured
    let asks_otherwise = args.draft_len.is_some() || args.dynamic_draft;
    // ONNX Runtime's drafting defaults (`onnx_drafting` when the config has it; `Manifest::m2r2`)
    let drafting = &export.manifest.m2r2;
    let lookup = lookup_or_default(
        (args.prompt_lookup, explicit),
        (speculative, false, asks_otherwise || tree.is_some()),
        drafting.prompt_lookup,
    );
    // how the tree grows: per branch while this gate's score passes its threshold, or whole
    let mut grown = None;
    if args.dynamic_draft
        && let DraftLength::Dynamic {
            gate, threshold, ..
        } = settings.draft_length
    {
        grown = Some((gate, threshold));
    }
    let tree = match (tree, &drafting.draft_tree) {
        (Some(widths), _) => Some(widths),
        (None, Some(t)) if args.mode == RunMode::Speculative && !asks_otherwise => {
            match t.draft_gate == export.manifest.draft_gate {
                true => {
                    grown = config_tree_growth(t, args.gate, args.threshold);
                    Some(t.widths.clone())
                }
                false => {
                    eprintln!(
                        "note: the M2R2 config's draft_tree drafts at gate {}, this export at \
                         gate {}: drafting its chain instead",
                        t.draft_gate, export.manifest.draft_gate
                    );
                    None
                }
            }
        }
        (None, _) if lookup.is_some() => Some(lookup_chain(&settings, &mut grown)),
        (None, _) => None,
    };
    // a tree drafts up to its depth every round; with --dynamic-draft or the config tree's
    // `dynamic` it grows per branch while the gate's score passes its threshold
    let dynamic = tree.as_ref().and(grown);
    if let Some(widths) = &tree {
        crate::cli::args::tree::draft_tree_settings(&mut settings, widths, dynamic);
    }
    check_gate_flags_read(args.gate.is_some(), args.threshold.is_some(), &settings)?;
    args.ep.check_one_config("run")?;
    // rows per verification: a tree's nodes, a chain's drafts
    let rows = match &tree {
        Some(widths) => {
            TokenTree::from_widths(widths)?.nodes() - 1 + lookup.map_or(0, |l| l.max_tokens)
        }
        None => settings.draft_length.max(),
    };
    let ep = args.ep.config(&export, rows)?;
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
    // (without a draft or verifier graph the decode below refuses, naming what the folder has)
    let speculates = export.has(GraphKind::Draft) && export.has(GraphKind::Verifier);
    if args.mode == RunMode::Speculative && speculates && !export.has(GraphKind::Feed) {
        eprintln!(
            "note: {} has no feed.onnx (an export from before it, or --graphs without it): the \
             positions nothing is proposed from run through draft.onnx, which gives the same \
             tokens more slowly; export again to add it",
            export.dir.display()
        );
    }
    let OnnxRun {
        run,
        ep_used,
        cuda_graph,
    } = match &tree {
        Some(widths) => decode_tree(&export, &ep, &request, widths, dynamic, lookup),
        None => decode(&export, &ep, &settings, &request, args.trace),
    }
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
        print_summary(&run, &request, stopped);
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

/// The tokenizer, or the error `--prompt` gets for an export without one (whose advice to pass
/// `--tokens` [`common::prompt_tokens_with`] adds).
fn tokenizer_or_error<'a>(
    export: &ExportDir,
    tokenizer: Option<&'a Tokenizer>,
) -> reference::Result<&'a Tokenizer> {
    tokenizer.ok_or_else(|| {
        reference::Error::Invalid(format!(
            "{} has no tokenizer (no tokenizer.json in the export)",
            export.dir.display()
        ))
    })
}
