//! What `tune-drafting` measures: how often each draft gate's drafts are right (traces of
//! teacher-forced drafts along the data's greedy responses) and what each kind of step costs on
//! each engine (timed greedy, draft and verify steps, and the token trees' steps).

use super::Args;
use crate::cli::args::onnx::open_matching_export;
use crate::cli::progress;
use crate::cli::step_times::{StepTimes, bench_prompt};
use crate::cli::step_times::{Timed, time_beside_greedy};
use anyhow::{Context, Result, bail};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::speculation::OnnxSpeculation;
use reference::base::generate::ReferenceGreedy;
use reference::base::tree::TokenTree;
use reference::decode::draft_sim::tree_steps::{time_tree_steps, time_tree_steps_on};
use reference::decode::draft_sim::{Policy, StepCosts, Trace, TreeCosts, trace};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::prompt_lookup::with_lookup_branch;
use reference::io::load::LoadedModel;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;
use train::data::{ContextNeed, DistillSample, check_context};

/// Positions a trace holds beyond its sample's tokens: the backend is sized for a verification
/// after the last one.
const TRACE_EXTRA: usize = 1;

/// Refuse a sample of `data` (read from `--data` `dir`, cut by `--limit` and `--max-new-tokens`)
/// that the model's `context` cannot trace, naming its file and line, before any gate is traced.
pub(super) fn check_traceable(dir: &Path, data: &[DistillSample], context: usize) -> Result<()> {
    let need = ContextNeed {
        context,
        extra: Some((TRACE_EXTRA, "tune-drafting traces it in one position more")),
        advice: "trace fewer of its response tokens with --max-new-tokens N, or remove the line",
    };
    Ok(check_context(&[dir.to_path_buf()], data, &need)?)
}

/// One gate's trace.
#[derive(Serialize)]
pub(super) struct GateTrace {
    pub(super) gate: usize,
    /// Drafts after the true prefix that equal the next greedy token.
    pub(super) agreement: f64,
    pub(super) points: usize,
    pub(super) seconds: f64,
    /// Drafts traced per round start: 1, or with a bridge the longest draft (later drafts of a
    /// round read the draft's own state, not the verified one).
    pub(super) depth: usize,
    #[serde(skip)]
    pub(super) samples: Vec<Trace>,
}

/// One engine's step costs at one draft gate.
#[derive(Serialize)]
pub(super) struct EngineCosts {
    pub(super) engine: String,
    pub(super) gate: usize,
    /// Proposing steps that compute the confidence or entropy score (and fixed drafting's).
    pub(super) costs: StepCosts,
    /// A proposing step that computes ARLA's score (the fast stream in every interval).
    pub(super) propose_arla_ms: Option<f64>,
}

impl EngineCosts {
    /// Add the tree steps. A tree grown per branch whose root scores below the threshold verifies
    /// the root alone: one row, which is the chain's verification of 1 row.
    pub(super) fn set_tree(&mut self, mut tree: TreeCosts) {
        if tree.verify.is_empty() {
            tree.verify.push(None);
        }
        if tree.verify[0].is_none() {
            tree.verify[0] = self.costs.verify.first().copied();
        }
        self.costs.tree = Some(tree);
    }

    pub(super) fn for_policy(&self, policy: Policy) -> Option<StepCosts> {
        match policy {
            Policy::Dynamic {
                gate: GateKind::Arla,
                ..
            } => Some(StepCosts {
                propose: self.propose_arla_ms?,
                ..self.costs.clone()
            }),
            _ => Some(self.costs.clone()),
        }
    }
}

pub(super) fn trace_gate(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gate: usize,
    data: &[DistillSample],
    max_draft: usize,
) -> Result<GateTrace> {
    // without a bridge a draft depends only on the true prefix, so one per position is exact
    let depth = if weights.bridge_at(gate).is_some() {
        max_draft.max(1)
    } else {
        1
    };
    let start = Instant::now();
    let mut counter = progress::Counter::new(format!("trace gate {gate}"), data.len(), 0);
    let arla = weights.arla.is_some().then_some(GateKind::Arla);
    let mut samples = Vec::new();
    let mut tokens = 0;
    for (i, d) in data.iter().enumerate() {
        let (prompt, response) = d.tokens.split_at(d.prompt_len);
        let m2r2 = M2r2::new(&loaded.model, weights);
        let capacity = d.tokens.len() + TRACE_EXTRA;
        let mut backend = ReferenceSpeculation::new(m2r2, gate, arla, capacity)?;
        let points = trace(&mut backend, prompt, response, depth)
            .with_context(|| format!("sample {} (prompt {})", i + 1, d.prompt_id))?;
        tokens += d.tokens.len();
        samples.push(points);
        counter.update(i + 1, tokens);
    }
    counter.finish();
    // agreement of the first draft after each true prefix (what every round's first draft reads)
    let points: usize = samples.iter().map(Vec::len).sum();
    let agreeing = samples
        .iter()
        .flatten()
        .filter(|round| round[0].agrees)
        .count();
    Ok(GateTrace {
        gate,
        agreement: agreeing as f64 / points.max(1) as f64,
        points,
        seconds: start.elapsed().as_secs_f64(),
        depth,
        samples,
    })
}

/// Verify chunks of 1..=max+1 rows: every size a policy can verify.
fn verify_rows(args: &Args) -> Vec<usize> {
    (1..=args.max_draft + 1).collect()
}

/// Step costs from timed steps: `times` with a confidence-scoring backend, `arla` with ARLA's.
fn engine_costs(engine: String, gate: usize, times: StepTimes, arla: Option<f64>) -> EngineCosts {
    EngineCosts {
        engine,
        gate,
        costs: StepCosts {
            greedy: times.greedy,
            propose: times.propose,
            feed: times.feed,
            verify: times.verify.iter().map(|&(_, ms)| ms).collect(),
            tree: None,
        },
        propose_arla_ms: arla,
    }
}

/// Prompt length of the timings: about a dev sample's context.
const COST_PROMPT: usize = 160;

/// Positions the timings need on the reference: the prompt, a greedy token per round (and the
/// warm-up round), and the longest verification.
fn cost_capacity(repeats: usize, max_draft: usize) -> usize {
    COST_PROMPT + repeats + max_draft + 4
}

/// Refuse a `--repeats` whose timed rounds do not fit the model's `context`: each round decodes
/// one more greedy token after the [`COST_PROMPT`]-token prompt.
pub(super) fn check_repeats(args: &Args, model: &str, context: usize) -> Result<()> {
    let most = context.saturating_sub(cost_capacity(0, args.max_draft));
    if args.repeats > most {
        bail!(
            "--repeats {}: each timed round decodes one more token after a {COST_PROMPT}-token \
             prompt, so at most {most} rounds (with --max-draft {}) fit {model}'s context of \
             {context} positions",
            args.repeats,
            args.max_draft
        );
    }
    Ok(())
}

/// The reference's step costs at each of `gates`, in order: greedy decoding timed once beside
/// every gate's draft and verify steps ([`time_beside_greedy`]: proposing with the confidence
/// score, and with ARLA's when there is ARLA), so that every gate is priced against the same
/// greedy step; then each gate's token-tree steps.
pub(super) fn reference_costs(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gates: &[usize],
    args: &Args,
    (shapes, branches): (&[Vec<usize>], &[usize]),
) -> Result<Vec<EngineCosts>> {
    let prompt = bench_prompt(loaded, COST_PROMPT);
    let capacity = cost_capacity(args.repeats, args.max_draft);
    let m2r2 = M2r2::new(&loaded.model, weights);
    let rows = verify_rows(args);
    // per gate: the confidence-scoring backend, then ARLA's (its proposing step alone)
    let mut specs = Vec::new();
    for &gate in gates {
        specs.push(ReferenceSpeculation::new(
            m2r2,
            gate,
            Some(GateKind::Confidence),
            capacity,
        )?);
        if weights.arla.is_some() {
            specs.push(ReferenceSpeculation::new(
                m2r2,
                gate,
                Some(GateKind::Arla),
                capacity,
            )?);
        }
    }
    let per_gate = if weights.arla.is_some() { 2 } else { 1 };
    let mut timed: Vec<Timed<'_>> = specs
        .iter_mut()
        .enumerate()
        .map(|(i, spec)| Timed {
            spec,
            verify_rows: if i % per_gate == 0 { &rows[..] } else { &[] },
        })
        .collect();
    let mut greedy = ReferenceGreedy::new(&loaded.model);
    let times = time_beside_greedy(&mut greedy, &mut timed, &prompt, args.repeats)?;
    let mut all = Vec::with_capacity(gates.len());
    for (&gate, times) in gates.iter().zip(times.chunks(per_gate)) {
        let arla = times.get(1).map(|t| t.propose);
        let mut costs = engine_costs("reference".into(), gate, times[0].clone(), arla);
        if !shapes.is_empty() {
            let trees = time_tree_steps(m2r2, gate, &prompt, (shapes, branches), args.repeats)?;
            costs.set_tree(trees);
        }
        all.push(costs);
    }
    Ok(all)
}

pub(super) fn onnx_costs(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    dir: &std::path::Path,
    args: &Args,
    (shapes, branches): (&[Vec<usize>], &[usize]),
) -> Result<EngineCosts> {
    let export = open_matching_export(loaded, weights, dir)?;
    onnx_runner::runtime::init()?;
    // rows per run (a TensorRT profile's limit): the longest chain's, or the largest tree's with
    // the longest lookup branch
    let mut rows = args.max_draft;
    let longest = branches.iter().copied().max().unwrap_or(0);
    for widths in shapes {
        let tree = TokenTree::from_widths(widths)?;
        rows = rows.max(with_lookup_branch(&tree, longest).tree.nodes() - 1);
    }
    let ep = args.ep.config(&export, rows)?;
    let prompt = bench_prompt(loaded, COST_PROMPT);
    let mut model = OnnxModel::load(&export, &ep)?;
    let mut spec = OnnxSpeculation::load(&export, &ep, Some(GateKind::Confidence))?;
    let mut arla_spec = match export.manifest.has_arla {
        true => Some(OnnxSpeculation::load(&export, &ep, Some(GateKind::Arla))?),
        false => None,
    };
    let engine = format!("onnxruntime-{}", model.session().ep_used().name());
    let rows = verify_rows(args);
    let mut timed = vec![Timed {
        spec: &mut spec,
        verify_rows: &rows,
    }];
    if let Some(spec) = &mut arla_spec {
        timed.push(Timed {
            spec,
            verify_rows: &[],
        });
    }
    let times = time_beside_greedy(&mut model, &mut timed, &prompt, args.repeats)?;
    let arla = times.get(1).map(|t| t.propose);
    let times = times[0].clone();
    let mut costs = engine_costs(engine, export.manifest.draft_gate, times, arla);
    if !shapes.is_empty() {
        // the tree loop's own steps on the export's graphs (no gate: trees are drafted whole)
        let backend = OnnxSpeculation::load(&export, &ep, None)?;
        let trees = time_tree_steps_on(backend, &prompt, (shapes, branches), args.repeats)
            .with_context(|| format!("cannot time token trees on {}", dir.display()))?;
        costs.set_tree(trees);
    }
    Ok(costs)
}
