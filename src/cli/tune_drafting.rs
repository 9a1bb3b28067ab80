//! `m2r2 tune-drafting`: choose speculative decoding's drafting policy by measurement
//! (docs/TRAINING.md "Choosing the drafting policy").
//!
//! For each draft gate, one teacher-forced pass over greedy distillation data records whether each
//! draft equals the next greedy token and its gate scores (`reference::decode::draft_sim::trace`);
//! each kind of step is timed on the engines (greedy step, proposing and feeding draft steps,
//! verifications of 1..=max+1 rows); then every policy (fixed 1..=max drafts; dynamic drafting
//! with each gate kind, threshold and maximum) is replayed on the traces (`simulate`) and priced
//! with the measured step costs. The predicted speed-ups rank the policies; `--write DIR` stores
//! the best in an M2R2 weights folder's config, as the default of `--mode speculative`. Confirm
//! the winner with real decoding (`generate`, `run`, scripts/bench_speculative.py).

use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::args::model::ModelArgs;
use crate::cli::args::onnx::EpArgs;
use crate::cli::args::onnx::open_matching_export;
use crate::cli::common;
use crate::cli::progress;
use crate::cli::step_times::{StepTimes, bench_prompt, time_steps};
use anyhow::{Context, Result, bail};
use onnx_runner::greedy::OnnxModel;
use onnx_runner::speculation::OnnxSpeculation;
use reference::base::generate::ReferenceGreedy;
use reference::decode::draft_sim::{Policy, Simulated, StepCosts, Trace, simulate, trace};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::drafting::check_draft_gate;
use reference::io::load::LoadedModel;
use reference::m2r2::config::{DynamicDraftConfig, M2r2Config};
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

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
    /// model's greedy responses that are traced
    #[arg(long, value_name = "DIR")]
    pub data: PathBuf,
    /// Trace only the first N samples
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Draft gates tried, comma-separated (default: all)
    #[arg(long, value_name = "G,...", value_delimiter = ',')]
    pub draft_gates: Vec<usize>,
    /// Longest draft tried: fixed drafting 1..=N tokens, dynamic drafting at most 1..=N
    #[arg(long, value_name = "N", default_value_t = 6)]
    pub max_draft: usize,
    /// Dynamic drafting thresholds tried, comma-separated
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
    /// Rounds of step timings (each figure is the median)
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub repeats: usize,
    /// Policies printed, best first
    #[arg(long, value_name = "N", default_value_t = 15)]
    pub top: usize,
    /// Print one JSON object instead of the tables
    #[arg(long)]
    pub json: bool,
    /// Write the best policy (draft_gate, draft_len, dynamic_draft) into the m2r2_config.json of
    /// this M2R2 weights folder
    #[arg(long, value_name = "DIR")]
    pub write: Option<PathBuf>,
}

/// One gate's trace.
#[derive(Serialize)]
struct GateTrace {
    gate: usize,
    /// Drafts after the true prefix that equal the next greedy token.
    agreement: f64,
    points: usize,
    seconds: f64,
    /// Drafts traced per round start: 1, or with a bridge the longest draft (later drafts of a
    /// round read the draft's own state, not the verified one).
    depth: usize,
    #[serde(skip)]
    samples: Vec<Trace>,
}

/// One engine's step costs at one draft gate.
#[derive(Serialize)]
struct EngineCosts {
    engine: String,
    gate: usize,
    /// Proposing steps that compute the confidence or entropy score (and fixed drafting's).
    costs: StepCosts,
    /// A proposing step that computes ARLA's score (the fast stream in every interval).
    propose_arla_ms: Option<f64>,
}

impl EngineCosts {
    fn for_policy(&self, policy: Policy) -> Option<StepCosts> {
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

#[derive(Clone, Serialize)]
struct PolicyResult {
    draft_gate: usize,
    policy: String,
    draft_len: usize,
    dynamic_draft: Option<DynamicDraftConfig>,
    tokens_per_round: f64,
    proposals_per_round: f64,
    speedup_reference: Option<f64>,
    speedup_onnx: Option<f64>,
}

impl PolicyResult {
    /// What ranks the policies: the reference's speed-up, or its geometric mean with ONNX
    /// Runtime's where both are known.
    fn score(&self) -> f64 {
        match (self.speedup_reference, self.speedup_onnx) {
            (Some(r), Some(o)) => (r * o).sqrt(),
            (Some(r), None) => r,
            (None, Some(o)) => o,
            (None, None) => 0.0,
        }
    }
}

#[derive(Serialize)]
struct Report {
    model: String,
    m2r2: String,
    data: String,
    samples: usize,
    traces: Vec<GateTrace>,
    costs: Vec<EngineCosts>,
    policies: Vec<PolicyResult>,
    best: PolicyResult,
}

pub fn run(args: &Args) -> Result<()> {
    if args.max_draft == 0 || args.repeats == 0 {
        bail!("--max-draft and --repeats must be at least 1");
    }
    if let Some(t) = args.thresholds.iter().find(|t| !t.is_finite()) {
        bail!("--thresholds must be finite numbers, got {t}");
    }
    let loaded = common::load(&args.model.model)?;
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
    for &g in &gates {
        check_draft_gate(config, g, "--draft-gates: gate")?;
    }
    let (mut data, meta) = train::data::read(&args.data, loaded.model.config.vocab_size)?;
    if meta.temperature.is_some() {
        bail!(
            "{} holds sampled responses (temperature {:?}): tracing needs the model's greedy \
             responses (distill-data without --temperature)",
            args.data.display(),
            meta.temperature
        );
    }
    if let Some(n) = args.limit {
        data.truncate(n);
    }
    let source = m2r2_args.source(&loaded);

    let traces = gates
        .iter()
        .map(|&g| trace_gate(&loaded, &weights, g, &data, args.max_draft))
        .collect::<Result<Vec<_>>>()?;
    let mut costs = Vec::new();
    for &g in &gates {
        costs.push(reference_costs(&loaded, &weights, g, args)?);
    }
    let onnx = match &args.onnx {
        Some(dir) => Some(onnx_costs(&loaded, &weights, dir, args)?),
        None => None,
    };
    let policies = policies(args);
    let mut results = Vec::new();
    for (t, reference) in traces.iter().zip(&costs) {
        let ort = onnx.as_ref().filter(|c| c.gate == t.gate);
        for &policy in &policies {
            if let Policy::Dynamic {
                gate: GateKind::Arla,
                ..
            } = policy
                && weights.arla.is_none()
            {
                continue;
            }
            let mut sim = Simulated::default();
            for points in &t.samples {
                sim.add(&simulate(points, policy)?);
            }
            let speedup = |c: &EngineCosts| c.for_policy(policy).and_then(|c| sim.speedup(&c));
            let (draft_len, dynamic_draft) = match policy {
                Policy::Fixed(k) => (k, None),
                Policy::Dynamic {
                    gate,
                    threshold,
                    max,
                } => (max, Some(DynamicDraftConfig { gate, threshold })),
            };
            results.push(PolicyResult {
                draft_gate: t.gate,
                policy: describe(policy),
                draft_len,
                dynamic_draft,
                tokens_per_round: sim.tokens_per_round(),
                proposals_per_round: sim.proposals_per_round(),
                speedup_reference: speedup(reference),
                speedup_onnx: ort.and_then(speedup),
            });
        }
    }
    results.sort_by(|a, b| b.score().total_cmp(&a.score()));
    // With an export, the best is among the policies both engines were priced for.
    let best = results
        .iter()
        .find(|r| onnx.is_none() || r.speedup_onnx.is_some())
        .cloned()
        .context("no drafting policy could be priced")?;
    if let Some(dir) = &args.write {
        let mut written = M2r2Config::load(dir, &loaded.model.config)
            .with_context(|| format!("--write {}: not an M2R2 weights folder", dir.display()))?;
        written.draft_gate = best.draft_gate;
        written.draft_len = best.draft_len;
        written.dynamic_draft = best.dynamic_draft.clone();
        written.save(dir)?;
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
        best,
    };
    if args.json {
        common::print_json(&report)?;
    } else {
        print(&report, args.top);
    }
    if let Some(dir) = &args.write {
        eprintln!(
            "wrote draft gate {}, {} into {}",
            report.best.draft_gate,
            report.best.policy,
            dir.join(reference::m2r2::config::M2R2_CONFIG_FILE)
                .display()
        );
    }
    Ok(())
}

fn trace_gate(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gate: usize,
    data: &[train::data::DistillSample],
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
        let mut backend = ReferenceSpeculation::new(m2r2, gate, arla, d.tokens.len() + 1)?;
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

fn reference_costs(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gate: usize,
    args: &Args,
) -> Result<EngineCosts> {
    let prompt = bench_prompt(loaded, COST_PROMPT);
    let capacity = COST_PROMPT + args.repeats + args.max_draft + 4;
    let m2r2 = M2r2::new(&loaded.model, weights);
    let mut greedy = ReferenceGreedy::new(&loaded.model);
    let mut spec = ReferenceSpeculation::new(m2r2, gate, Some(GateKind::Confidence), capacity)?;
    let times = time_steps(
        &mut greedy,
        &mut spec,
        &prompt,
        args.repeats,
        &verify_rows(args),
    )?;
    let arla = match weights.arla {
        Some(_) => {
            let mut spec = ReferenceSpeculation::new(m2r2, gate, Some(GateKind::Arla), capacity)?;
            Some(time_steps(&mut greedy, &mut spec, &prompt, args.repeats, &[1])?.propose)
        }
        None => None,
    };
    Ok(engine_costs("reference".into(), gate, times, arla))
}

fn onnx_costs(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    dir: &std::path::Path,
    args: &Args,
) -> Result<EngineCosts> {
    let export = open_matching_export(loaded, weights, dir)?;
    onnx_runner::runtime::init()?;
    let ep = args.ep.config(&export, args.max_draft);
    let prompt = bench_prompt(loaded, COST_PROMPT);
    let mut model = OnnxModel::load(&export, &ep)?;
    let mut spec = OnnxSpeculation::load(&export, &ep, Some(GateKind::Confidence))?;
    let engine = format!("onnxruntime-{}", model.session().ep_used().name());
    let times = time_steps(
        &mut model,
        &mut spec,
        &prompt,
        args.repeats,
        &verify_rows(args),
    )?;
    let arla = match export.manifest.has_arla {
        true => {
            let mut spec = OnnxSpeculation::load(&export, &ep, Some(GateKind::Arla))?;
            Some(time_steps(&mut model, &mut spec, &prompt, args.repeats, &[1])?.propose)
        }
        false => None,
    };
    Ok(engine_costs(
        engine,
        export.manifest.draft_gate,
        times,
        arla,
    ))
}

/// Fixed drafting of 1..=max tokens, and dynamic drafting with each gate kind, threshold and
/// maximum length.
fn policies(args: &Args) -> Vec<Policy> {
    let mut all: Vec<Policy> = (1..=args.max_draft).map(Policy::Fixed).collect();
    for gate in GateKind::ALL {
        for &threshold in &args.thresholds {
            for max in 1..=args.max_draft {
                all.push(Policy::Dynamic {
                    gate,
                    threshold,
                    max,
                });
            }
        }
    }
    all
}

fn describe(policy: Policy) -> String {
    match policy {
        Policy::Fixed(k) => format!("fixed {k}"),
        Policy::Dynamic {
            gate,
            threshold,
            max,
        } => format!("dynamic {gate} >= {threshold}, at most {max}"),
    }
}

fn speed(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{s:.2}x"))
}

/// A table of policies with their predictions.
fn print_policies<'a>(policies: impl Iterator<Item = &'a PolicyResult>) {
    println!(
        "| draft gate | drafting | tokens per verification | proposals per round | reference | ONNX Runtime |"
    );
    println!("|---|---|---|---|---|---|");
    for p in policies {
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {} |",
            p.draft_gate,
            p.policy,
            p.tokens_per_round,
            p.proposals_per_round,
            speed(p.speedup_reference),
            speed(p.speedup_onnx)
        );
    }
}

fn print(r: &Report, top: usize) {
    println!(
        "{} with M2R2 weights {}: {} samples of {}",
        r.model, r.m2r2, r.samples, r.data
    );
    println!();
    println!("| draft gate | drafts traced | agreement with the next greedy token | seconds |");
    println!("|---|---|---|---|");
    for t in &r.traces {
        println!(
            "| {} | {} | {:.3} | {:.1} |",
            t.gate, t.points, t.agreement, t.seconds
        );
    }
    println!();
    println!("step costs, ms (median):");
    println!();
    let rows = r.costs.first().map_or(0, |c| c.costs.verify.len());
    let header: Vec<String> = (1..=rows).map(|n| format!("verify {n}")).collect();
    println!(
        "| engine | draft gate | greedy | propose | propose (ARLA) | feed | {} |",
        header.join(" | ")
    );
    println!("|---|---|---|---|---|---|{}", "---|".repeat(rows));
    for c in &r.costs {
        let verify: Vec<String> = c.costs.verify.iter().map(|v| format!("{v:.1}")).collect();
        println!(
            "| {} | {} | {:.1} | {:.1} | {} | {:.1} | {} |",
            c.engine,
            c.gate,
            c.costs.greedy,
            c.costs.propose,
            c.propose_arla_ms
                .map_or("-".into(), |ms| format!("{ms:.1}")),
            c.costs.feed,
            verify.join(" | ")
        );
    }
    println!();
    println!("predicted speed-up over greedy decoding, best first:");
    println!();
    print_policies(r.policies.iter().take(top));
    println!();
    println!(
        "by family: each fixed length, and the best dynamic policy of each gate kind, per draft gate:"
    );
    println!();
    let mut shown: Vec<(usize, String)> = Vec::new();
    let mut family: Vec<&PolicyResult> = r
        .policies
        .iter()
        .filter(|p| {
            let kind = match &p.dynamic_draft {
                Some(d) => format!("dynamic {}", d.gate),
                None => p.policy.clone(),
            };
            let key = (p.draft_gate, kind);
            let new = !shown.contains(&key);
            if new {
                shown.push(key);
            }
            new
        })
        .collect();
    family.sort_by(|a, b| {
        (a.draft_gate, a.dynamic_draft.is_some(), a.draft_len).cmp(&(
            b.draft_gate,
            b.dynamic_draft.is_some(),
            b.draft_len,
        ))
    });
    print_policies(family.into_iter());
    println!();
    println!(
        "best: draft gate {}, {} (reference {}, ONNX Runtime {})",
        r.best.draft_gate,
        r.best.policy,
        speed(r.best.speedup_reference),
        speed(r.best.speedup_onnx)
    );
}
