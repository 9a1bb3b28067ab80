//! `m2r2 tune-drafting`: choose speculative decoding's drafting policy by measurement
//! (docs/TRAINING.md "Choosing the drafting policy").
//!
//! For each draft gate, one teacher-forced pass over greedy distillation data records whether each
//! draft equals the next greedy token, its rank among the draft's candidates and its gate scores
//! (`reference::decode::draft_sim::trace`); each kind of step is timed on the engines (greedy
//! step, once per engine beside every gate's steps so that all gates are priced against it;
//! proposing and feeding draft steps, verifications of 1..=max+1 rows; the steps of token
//! trees: draft levels of n nodes, verifications of each tree); then every
//! policy (fixed 1..=max drafts; dynamic drafting with each gate kind, threshold and maximum; the
//! tree shapes, whole and grown per branch by the confidence or entropy gate at each threshold) is
//! replayed on the traces (`simulate`, `simulate_tree`, `simulate_dynamic_tree`), and again beside
//! a prompt-lookup branch of each `--prompt-lookup` length (`simulate_guesses`, on the tree loop),
//! and priced with the measured step costs. The predicted speed-ups choose defaults per engine:
//! its fastest chain (`draft_gate`, `draft_len`, `dynamic_draft`), its fastest tree when that
//! beats the chain (`draft_tree`, grown per branch when that is the winner) and the branch length
//! whose defaults are fastest (`prompt_lookup`). `--write DIR` (a folder holding the tuned
//! weights, checked first) stores the reference's at the top level of an M2R2 weights folder's
//! config (`generate` drafts them by default) and, with `--onnx`,
//! ONNX Runtime's in `onnx_drafting` where they differ (`export` and `run` draft those). Confirm
//! the winners with real decoding (`generate`, `run`, scripts/bench_speculative.py).

mod candidates;
mod defaults;
mod lookup;
mod measure;
mod price;
mod print;
mod write;

use candidates::{lookup_branches, tree_shapes, with_prefixes};
use defaults::{Defaults, defaults, describe_defaults, fastest};
use measure::{
    EngineCosts, GateTrace, check_repeats, check_traceable, onnx_costs, reference_costs, trace_gate,
};
use price::{describe, growths, policies};

use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::args::model::ModelArgs;
use crate::cli::args::onnx::EpArgs;
use crate::cli::common;
use anyhow::{Context, Result, bail};
use reference::base::tree::MAX_TREE_NODES;
use reference::decode::drafting::check_draft_gate;
use reference::m2r2::config::DynamicDraftConfig;
use serde::Serialize;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// M2R2 weights, as `generate --m2r2` (default: the model's shipped or built-in weights)
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// The pruned draft head (draft_head.json in the --m2r2 folder; default: on when there is one)
    #[arg(long, value_enum, value_name = "on|off")]
    pub draft_head: Option<OnOff>,
    /// Greedy distillation data (`distill-data` without --temperature): the prompts and the
    /// model's greedy responses that are traced (not made from dev_prompts.jsonl: choosing the
    /// policy tunes on it)
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Trace only the first N samples
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Trace only the first N tokens of each response: price decoding of that length (later
    /// tokens of long answers repeat their context more, which favours longer lookup branches)
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<usize>,
    /// Draft gates tried, comma-separated (default: all)
    #[arg(long, value_name = "G,...", value_delimiter = ',')]
    pub draft_gates: Vec<usize>,
    /// Longest draft tried: fixed drafting 1..=N tokens, dynamic drafting at most 1..=N, trees
    /// at most N deep
    #[arg(long, value_name = "N", default_value_t = 6)]
    pub max_draft: usize,
    /// The policy families tried, comma-separated: chain (fixed and dynamic drafting), tree
    /// (token trees; priced on ONNX Runtime too with --onnx)
    #[arg(
        long,
        value_enum,
        value_name = "chain,tree",
        value_delimiter = ',',
        default_value = "chain,tree"
    )]
    pub families: Vec<Family>,
    /// A tree shape tried, W1,W2,... (repeat the flag for more; default: the candidate shapes of
    /// `reference::decode::draft_sim::TREE_SHAPES` no deeper than --max-draft)
    #[arg(long = "tree", value_name = "W1,W2,...")]
    pub trees: Vec<String>,
    /// Prompt-lookup branches tried beside every chain and tree, comma-separated token counts
    /// (each policy is also priced without one; 0 alone: no branch priced, and --write keeps the
    /// config's prompt_lookup)
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        default_value = "0,2,4,8"
    )]
    pub prompt_lookup: Vec<usize>,
    /// Dynamic drafting thresholds tried, comma-separated, each in [0, 1] (gate scores lie there)
    #[arg(
        long,
        value_name = "X,...",
        value_delimiter = ',',
        default_value = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
    )]
    pub thresholds: Vec<f32>,
    /// Also price the policies on ONNX Runtime with this export of the same weights (at its draft
    /// gate only: draft.onnx is cut there)
    #[arg(long, value_name = "DIR")]
    pub onnx: Option<PathBuf>,
    #[command(flatten)]
    pub ep: EpArgs,
    /// Rounds of step timings (each figure is the median; the rounds decode after a 160-token
    /// prompt, so they must fit the model's context)
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub repeats: usize,
    /// Rows of each table of policies: the best N on each engine, and the best N of the "by
    /// family" table (each kept in family order)
    #[arg(long, value_name = "N", default_value_t = 15)]
    pub top: usize,
    /// Print one JSON object instead of the tables
    #[arg(long)]
    pub json: bool,
    /// Write the winners into the m2r2_config.json of this M2R2 weights folder: the chain default
    /// (draft_gate, draft_len, dynamic_draft), the default tree (draft_tree, or none) and the
    /// prompt-lookup branch (prompt_lookup, or none) by the reference's predictions at the top
    /// level, and with --onnx ONNX Runtime's in onnx_drafting where they differ
    #[arg(long, value_name = "DIR")]
    pub write: Option<PathBuf>,
}

/// A family of drafting policies.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// One draft per depth: fixed or dynamic drafting.
    Chain,
    /// A token tree per round (greedy).
    Tree,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
struct PolicyResult {
    draft_gate: usize,
    family: Family,
    policy: String,
    /// Drafts per round for a chain (at most, when dynamic); a tree's depth.
    draft_len: usize,
    dynamic_draft: Option<DynamicDraftConfig>,
    /// A tree's widths `[W1, W2, ...]`.
    draft_tree: Option<Vec<usize>>,
    /// A tree's nodes (the rows of its verification), the root included.
    tree_nodes: Option<usize>,
    /// A prompt-lookup branch of up to this many tokens beside the chain or tree (the tree loop
    /// drafts a chain `1,1,...` then).
    prompt_lookup: Option<usize>,
    tokens_per_round: f64,
    /// Proposing draft steps per round; for a tree, its nodes with children.
    proposals_per_round: f64,
    speedup_reference: Option<f64>,
    speedup_onnx: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    m2r2: String,
    data: String,
    samples: usize,
    traces: Vec<GateTrace>,
    costs: Vec<EngineCosts>,
    /// Best first by the reference's speed-up.
    policies: Vec<PolicyResult>,
    /// The fastest policy on each engine.
    best_reference: PolicyResult,
    best_onnx: Option<PolicyResult>,
    /// The reference's defaults (the config's top level).
    defaults: Defaults,
    /// ONNX Runtime's, with `--onnx` (the config's `onnx_drafting` when they differ).
    onnx_defaults: Option<Defaults>,
    notes: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    if args.max_draft == 0 || args.repeats == 0 || args.top == 0 {
        bail!("--max-draft, --repeats and --top must be at least 1");
    }
    if args.max_draft >= MAX_TREE_NODES {
        bail!(
            "--max-draft {}: a round verifies at most {MAX_TREE_NODES} nodes, so a chain drafts \
             at most {} tokens",
            args.max_draft,
            MAX_TREE_NODES - 1
        );
    }
    if let Some(t) = args.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        bail!(
            "--thresholds must lie in [0, 1], where the confidence, entropy and ARLA scores lie \
             (0 always drafts on, above 1 never), got {t}"
        );
    }
    if args.families.is_empty() {
        bail!("--families: name at least one of chain, tree");
    }
    args.ep
        .refuse_without_onnx(args.onnx.is_some(), "tune-drafting")?;
    args.ep.check_one_config("tune-drafting")?;
    let chains = args.families.contains(&Family::Chain);
    let shapes = tree_shapes(args)?;
    let branches = lookup_branches(args)?;
    if let Some(&longest) = branches.last()
        && args.max_draft + longest >= MAX_TREE_NODES
    {
        bail!(
            "--max-draft {} with --prompt-lookup {longest}: a round verifies at most \
             {MAX_TREE_NODES} nodes, the root, the drafts and the branch's tokens",
            args.max_draft
        );
    }
    let loaded = common::load(&args.model.model)?;
    check_repeats(args, &loaded.name, loaded.model.context_length())?;
    // the folder --write changes must hold the tuned weights: checked before any tracing
    let target = match &args.write {
        Some(dir) => Some(write::check_target(dir, args, &loaded)?),
        None => None,
    };
    let m2r2_args = M2r2Args {
        draft_head: args.draft_head,
        ..M2r2Args::weights_only(args.m2r2.clone())
    };
    let weights = m2r2_args.weights(&loaded)?;
    let config = &weights.config;
    let gates: Vec<usize> = if args.draft_gates.is_empty() {
        (1..=config.num_gates()).collect()
    } else {
        args.draft_gates.clone()
    };
    for (k, &g) in gates.iter().enumerate() {
        check_draft_gate(config, g, "--draft-gates: gate")?;
        if gates[..k].contains(&g) {
            bail!("--draft-gates names gate {g} twice");
        }
    }
    let (mut data, meta) = train::data::read(&args.data, loaded.model.config.vocab_size)?;
    let purpose = "tune-drafting chooses the drafting policy by its traces";
    train::data::refuse_dev_prompts("--data", &args.data, &meta, purpose)?;
    if let Some(temperature) = meta.temperature {
        bail!(
            "{} holds sampled responses (temperature {temperature}): tracing needs the model's \
             greedy responses (distill-data without --temperature)",
            args.data.display(),
        );
    }
    if let Some(n) = args.limit {
        if n == 0 {
            bail!("--limit 0 leaves no samples to trace: give 1 or more");
        }
        data.truncate(n);
    }
    if let Some(n) = args.max_new_tokens {
        if n < 2 {
            bail!(
                "--max-new-tokens {n}: a response is traced from its second token: give 2 or more"
            );
        }
        for d in &mut data {
            d.tokens.truncate(d.prompt_len.saturating_add(n));
        }
    }
    check_traceable(&args.data, &data, loaded.model.context_length())?;
    // a response is traced from its second token: without one, every policy would price as NaN
    if !data.iter().any(|d| d.tokens.len() >= d.prompt_len + 2) {
        bail!(
            "{}: none of the {} sample(s) used has a response of 2 or more tokens to trace",
            args.data.display(),
            data.len()
        );
    }
    let source = m2r2_args.source(&loaded);

    let traces = gates
        .iter()
        .map(|&g| trace_gate(&loaded, &weights, g, &data, args.max_draft))
        .collect::<Result<Vec<_>>>()?;
    // a tree grown per branch that stops at depth k verifies the shape's first k depths: those
    // trees' steps are timed too; beside a lookup branch a chain runs on the tree loop as the
    // tree 1,1,...
    let mut timed = with_prefixes(&shapes);
    if chains && !branches.is_empty() {
        timed.extend((1..=args.max_draft).map(|k| vec![1; k]));
    }
    let timed = (&timed[..], &branches[..]);
    let mut costs = reference_costs(&loaded, &weights, &gates, args, timed)?;
    let onnx = match &args.onnx {
        Some(dir) => Some(onnx_costs(&loaded, &weights, dir, args, timed)?),
        None => None,
    };
    let policies = if chains { policies(args) } else { vec![] };
    let growths = growths(args);
    // each sample's guesses, once for every gate (none when no branch is priced)
    let samples = match branches.iter().copied().max() {
        Some(longest) => lookup::sample_guesses(&data, longest),
        None => Vec::new(),
    };
    let mut results = Vec::new();
    for (t, reference) in traces.iter().zip(&costs) {
        let ort = onnx.as_ref().filter(|c| c.gate == t.gate);
        let has_arla = weights.arla.is_some();
        results.extend(price::chain_results(
            t,
            (reference, ort),
            &policies,
            has_arla,
        )?);
        results.extend(price::tree_results(t, (reference, ort), &shapes, &growths)?);
        let candidates = lookup::Candidates {
            chains: &policies,
            shapes: &shapes,
            growths: &growths,
        };
        results.extend(lookup::lookup_results(
            t,
            &samples,
            &branches,
            &candidates,
            (reference, ort),
        )?);
    }
    let by_reference = |r: &PolicyResult| r.speedup_reference.unwrap_or(0.0);
    results.sort_by(|a, b| by_reference(b).total_cmp(&by_reference(a)));
    let best_reference = fastest(results.iter(), |r| r.speedup_reference)
        .cloned()
        .context("no drafting policy could be priced")?;
    let best_onnx = fastest(results.iter(), |r| r.speedup_onnx).cloned();
    if onnx.is_some() && best_onnx.is_none() {
        bail!("no policy could be priced on ONNX Runtime");
    }
    let onnx_defaults = onnx.is_some().then(|| defaults(&results, true));
    let defaults = defaults(&results, false);
    let mut notes = Vec::new();
    if let Some(n) = config.prompt_lookup.filter(|_| branches.is_empty()) {
        notes.push(format!(
            "the M2R2 config's prompt-lookup branch (up to {n} tokens) is not priced: every \
             policy here is predicted without it (--prompt-lookup 0), and --write keeps it as it is"
        ));
    }
    if let (Some(dir), Some(folder)) = (&args.write, &target) {
        let engines = (&defaults, onnx_defaults.as_ref());
        write::write(dir, folder, engines, !branches.is_empty(), &loaded)?;
    }
    costs.extend(onnx);
    let report = Report {
        model: loaded.name.clone(),
        m2r2: source,
        data: args.data.display().to_string(),
        samples: data.len(),
        traces,
        costs,
        policies: results,
        best_reference,
        best_onnx,
        defaults,
        onnx_defaults,
        notes,
    };
    if args.json {
        common::print_json(&report)?;
    } else {
        print::print(&report, args.top);
    }
    if let Some(dir) = &args.write {
        let onnx = match &report.onnx_defaults {
            Some(d) => format!("; for ONNX Runtime {}", describe_defaults(d)),
            None => String::new(),
        };
        eprintln!(
            "wrote {}{onnx} into {}",
            describe_defaults(&report.defaults),
            dir.join(reference::m2r2::config::M2R2_CONFIG_FILE)
                .display()
        );
    }
    Ok(())
}
