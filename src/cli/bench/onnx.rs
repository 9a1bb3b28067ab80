//! `m2r2 bench --onnx DIR --ep E`: greedy and self-speculative decoding on ONNX Runtime against the
//! reference on the same machine, the same prompt and the same M2R2 weights: decode tokens/s, mean
//! accepted length, and milliseconds per draft step and per verify step (medians over `--repeats`
//! timed runs after one warm-up run of each, which also builds TensorRT engines). `--onnx` given
//! several times measures each export as its own engine, their runs alternating within each
//! repeat (a dynamic and a static export of one model side by side), with the machine's memory
//! read bandwidth.

use crate::cli::args::bench::Sizes;
use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::args::onnx::{
    CudaGraph, EpArgs, check_draft_head, head_words, open_export, open_matching_export,
};
use crate::cli::bench::cost_shape;
use crate::cli::common;
use crate::cli::decode_speed::{DecodeWeights, cpu_model};
use anyhow::{Result, bail};
use onnx_runner::ep::EpConfig;
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::GraphKind;
use onnx_runner::speculation::OnnxSpeculation;
use reference::base::generate::{GenerateOptions, generate};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::speculative::{
    DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
};
use reference::decode::timed::Timed;
use reference::decode::tree_backend::tree_positions;
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// One engine's medians.
#[derive(Clone, Debug, Serialize)]
pub struct EngineResult {
    /// `reference` or `onnxruntime-<ep>` (`onnxruntime-<ep> static` for a `--static-cache` export)
    pub engine: String,
    /// The export folder (ONNX Runtime engines).
    pub onnx: Option<String>,
    /// `L` of a static export's KV buffers.
    pub static_cache: Option<usize>,
    pub greedy_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub mean_accepted_length: f64,
    pub ms_per_draft_step: f64,
    pub ms_per_verify_step: f64,
    /// Greedy tokens equal speculative tokens (lossless), in every timed run.
    pub speculative_equals_greedy: bool,
    /// Speculative over greedy tokens/s of this engine, paired within each timed run.
    pub speculative_over_greedy: Spread,
    /// Greedy tokens/s over the first export's in the same timed run (the runs alternate), for
    /// every export after the first; `None` for the first and for the reference.
    pub greedy_over_first_export: Option<Spread>,
}

/// How a ratio measured once per timed run spread over the runs: its median, lowest and highest.
/// Paired within a run, so a machine that slows down between runs moves both sides.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(xs: &[f64]) -> Spread {
        Spread {
            median: median(xs),
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::fmt::Display for Spread {
    /// `1.04x (0.98-1.09)`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}x ({:.2}-{:.2})", self.median, self.min, self.max)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct OnnxBenchResult {
    pub model: String,
    /// The export folders, comma-separated, in `--onnx` order.
    pub onnx: String,
    pub ep: String,
    pub ep_used: String,
    pub onnxruntime: String,
    pub cpu: String,
    pub m2r2: String,
    pub draft_gate: usize,
    pub draft_len: usize,
    /// `K` of the pruned draft head both engines draft with; `None`: the full head.
    pub draft_head_tokens: Option<usize>,
    pub prompt_len: usize,
    pub decode_tokens: usize,
    pub repeats: usize,
    /// The machine's memory read bandwidth (bytes/s), measured before the engines run.
    pub memory_read_bytes_per_second: f64,
    pub engines: Vec<EngineResult>,
    /// ONNX Runtime's greedy tokens equal the reference's (every export's).
    pub tokens_equal_reference: bool,
}

/// ONNX Runtime's step costs for `m2r2 bench --cost-shape --onnx DIR`: the export must be of the
/// loaded model with the reference's draft gate and draft head (`weights`). One engine for the
/// session options of the flags, then one for each `--ort-compare` variant, measured one after
/// the other in this run (each variant's sessions are dropped before the next is loaded).
pub fn cost_shape_engines(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    dir: &Path,
    ep_args: &EpArgs,
    sizes: &Sizes,
    bandwidth: f64,
) -> Result<Vec<cost_shape::EngineShape>> {
    let export = open_matching_export(loaded, weights, dir)?;
    onnx_runner::runtime::init()?;
    let base = ep_args.config(
        &export,
        cost_shape::VERIFY_ROWS[cost_shape::VERIFY_ROWS.len() - 1],
    )?;
    let mut variants = vec![(String::new(), base.clone())];
    variants.extend(ep_args.compare(&base)?);
    let prompt = crate::cli::step_times::bench_prompt(loaded, sizes.prompt_len);
    let bytes = DecodeWeights::of(&loaded.model.config).bytes();
    let mut engines = Vec::new();
    for (name, ep) in variants {
        let mut model = OnnxModel::load(&export, &ep)?;
        let mut spec = OnnxSpeculation::load(&export, &ep, None)?;
        let mut engine = format!("onnxruntime-{}", model.session().ep_used().name());
        if !name.is_empty() {
            engine = format!("{engine} {name}");
        }
        engines.push(cost_shape::measure_engine(
            engine,
            &mut model,
            &mut spec,
            &prompt,
            sizes.repeats,
            bytes,
            bandwidth,
        )?);
    }
    Ok(engines)
}

/// Time the reference and each export in `dirs`. `m2r2` names the reference's M2R2 weights (as
/// `--m2r2`; they must be those the exports were made with), `draft_head` is `--draft-head` (it
/// must match the exports').
pub fn measure(
    loaded: &LoadedModel,
    m2r2: Option<String>,
    draft_head: Option<OnOff>,
    dirs: &[std::path::PathBuf],
    ep_args: &EpArgs,
    sizes: &Sizes,
) -> Result<OnnxBenchResult> {
    if ep_args.ort_compare.is_some() {
        bail!("--ort-compare needs --cost-shape (it compares step costs)");
    }
    if dirs.is_empty() {
        bail!("bench on ONNX Runtime needs at least one --onnx DIR");
    }
    let exports = dirs
        .iter()
        .map(|dir| open_export(loaded, dir))
        .collect::<Result<Vec<_>>>()?;
    let args = M2r2Args {
        draft_head,
        ..M2r2Args::weights_only(m2r2.clone())
    };
    let weights: M2r2Weights = args.weights(loaded)?;
    let first = &exports[0].manifest;
    for (export, dir) in exports.iter().zip(dirs) {
        check_draft_head(export, draft_head)?;
        if weights.draft_head != export.draft_head {
            bail!(
                "the reference's M2R2 weights ({}) and the export {} have different draft heads; \
                 pass the --m2r2 folder the export was made from",
                args.source(loaded),
                dir.display()
            );
        }
        let m = &export.manifest;
        if m.draft_gate != first.draft_gate || m.m2r2.draft_len != first.m2r2.draft_len {
            bail!(
                "the exports draft differently ({} at gate {}, {} at gate {}): bench exports made \
                 with the same M2R2 settings",
                dirs[0].display(),
                first.draft_gate,
                dir.display(),
                m.draft_gate
            );
        }
    }
    let draft_len = first.m2r2.draft_len.max(1);
    // before any timing: each decode must fit a static export's buffers (greedy: the prompt and
    // every token but the last; a speculative round drafts in full even one token before the end:
    // a tree of `draft_len + 1` nodes)
    let positions = |nodes| tree_positions(0, sizes.prompt_len, sizes.decode_tokens, nodes);
    let sizes_flags = format!(
        "--prompt-len {} with --decode-tokens {}",
        sizes.prompt_len, sizes.decode_tokens
    );
    let fix = "lower --prompt-len or --decode-tokens";
    for export in &exports {
        export.check_room(GraphKind::Model, positions(1), &sizes_flags, fix)?;
        let why = format!("{sizes_flags} (speculative rounds of {draft_len} drafts)");
        export.check_room(GraphKind::Verifier, positions(draft_len + 1), &why, fix)?;
    }
    let bench = SpecBench::new(loaded, first.draft_gate, draft_len, sizes)?;
    let bandwidth = cost_shape::bandwidth(sizes);
    let runtime = onnx_runner::runtime::init()?;

    let reference_runs = bench.reference_runs(&weights)?;
    let (prompt, greedy_options, spec_options) =
        (&bench.prompt, &bench.greedy_options, &bench.spec_options);
    let reference_tokens = generate(&loaded.model, prompt, greedy_options, &mut |_, _| {})?.tokens;

    // ONNX Runtime: every export loaded, then their runs alternating within each repeat
    // `--cuda-graph both`: a static export twice, without then with CUDA graphs
    let mut engines = Vec::new();
    for (export, dir) in exports.iter().zip(dirs) {
        let base = ep_args.config(export, draft_len)?;
        let both = ep_args.cuda_graph == Some(CudaGraph::Both);
        let choices = match (both, export.static_l_max(GraphKind::Model)) {
            (true, Some(_)) => vec![Some(false), Some(true)],
            (true, None) => vec![Some(false)],
            (false, _) => vec![base.cuda_graph],
        };
        for cuda_graph in choices {
            let ep = EpConfig {
                cuda_graph,
                ..base.clone()
            };
            // a folder from before the speculative graphs had static forms: theirs grow, so no
            // CUDA graphs for them
            let spec_ep = EpConfig {
                cuda_graph: cuda_graph.filter(|_| export.static_l_max(GraphKind::Draft).is_some()),
                ..base.clone()
            };
            engines.push((
                OnnxModel::load(export, &ep)?,
                OnnxSpeculation::load(export, &spec_ep, None)?,
                Vec::new(),
                Vec::new(),
                dir,
            ));
        }
    }
    let ep_used = engines[0].0.session().ep_used();
    for i in 0..=sizes.repeats {
        for (model, spec, runs, tokens, _) in &mut engines {
            let g = model.generate(prompt, greedy_options, &mut |_, _| {})?;
            spec.reset();
            let run = timed_speculative(spec, prompt, spec_options, &g.tokens)?;
            if i > 0 {
                runs.push((g.decode_tokens_per_second(), run));
            }
            *tokens = g.tokens;
        }
    }

    let mut results = vec![summarise("reference".into(), &reference_runs)];
    let mut tokens_equal_reference = true;
    let first_greedy: Vec<f64> = engines[0].2.iter().map(|r| r.0).collect();
    for (k, (model, _, runs, tokens, dir)) in engines.iter().enumerate() {
        let mut name = format!("onnxruntime-{}", model.session().ep_used().name());
        if model.static_l_max().is_some() {
            name.push_str(" static");
        }
        if model.cuda_graph_runs().is_some() {
            name.push_str(" cuda-graph");
        }
        let taken = |name: &str| results.iter().any(|e| e.engine == name);
        // a second export of the same kind: named by its folder (two static ones may differ in
        // L, in --merge-adapters, or in the build that wrote them)
        if let Some(folder) = dir.file_name().filter(|_| taken(&name)) {
            name = format!("{name} ({})", folder.to_string_lossy());
        }
        if taken(&name) {
            name = format!("{name} #{}", results.len());
        }
        let mut engine = summarise(name, runs);
        engine.onnx = Some(dir.display().to_string());
        engine.static_cache = model.static_l_max();
        if k > 0 {
            let paired: Vec<f64> = runs
                .iter()
                .zip(&first_greedy)
                .map(|(r, f)| r.0 / f)
                .collect();
            engine.greedy_over_first_export = Some(Spread::of(&paired));
        }
        results.push(engine);
        tokens_equal_reference &= *tokens == reference_tokens;
    }
    Ok(OnnxBenchResult {
        model: loaded.name.clone(),
        onnx: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        ep: ep_args.ep.name().into(),
        ep_used: ep_used.name().into(),
        onnxruntime: runtime.version.clone(),
        cpu: cpu_model(),
        m2r2: args.source(loaded),
        draft_gate: first.draft_gate,
        draft_len,
        draft_head_tokens: first.draft_head_tokens,
        prompt_len: sizes.prompt_len,
        decode_tokens: sizes.decode_tokens,
        repeats: sizes.repeats,
        memory_read_bytes_per_second: bandwidth,
        engines: results,
        tokens_equal_reference,
    })
}

/// The prompt and options of a speculative bench (reference alone, or against ONNX Runtime).
pub struct SpecBench<'a> {
    loaded: &'a LoadedModel,
    draft_gate: usize,
    repeats: usize,
    decode_tokens: usize,
    prompt: Vec<u32>,
    greedy_options: GenerateOptions,
    spec_options: SpeculativeOptions,
}

impl<'a> SpecBench<'a> {
    pub fn new(
        loaded: &'a LoadedModel,
        draft_gate: usize,
        draft_len: usize,
        sizes: &Sizes,
    ) -> Result<Self> {
        let config = &loaded.model.config;
        // a chain of drafts is a tree of drafts + 1 nodes
        let needed = tree_positions(0, sizes.prompt_len, sizes.decode_tokens, draft_len + 1);
        if needed > config.max_position_embeddings {
            bail!(
                "--prompt-len {} and --decode-tokens {} need {needed} positions (the last round \
                 drafts up to {draft_len} past the last token), more than the context of {} ({})",
                sizes.prompt_len,
                sizes.decode_tokens,
                loaded.name,
                config.max_position_embeddings
            );
        }
        // A fixed pseudo-random prompt; no stop tokens, so every run decodes exactly
        // `decode_tokens`.
        let prompt: Vec<u32> = (0..sizes.prompt_len as u64)
            .map(|i| ((i * 2_654_435_761 + 12_345) % config.vocab_size as u64) as u32)
            .collect();
        Ok(SpecBench {
            loaded,
            draft_gate,
            repeats: sizes.repeats,
            decode_tokens: sizes.decode_tokens,
            prompt,
            greedy_options: GenerateOptions {
                max_new_tokens: sizes.decode_tokens,
                stop_tokens: vec![],
                sampling: None,
            },
            spec_options: SpeculativeOptions {
                max_new_tokens: sizes.decode_tokens,
                stop_tokens: vec![],
                draft_length: DraftLength::Fixed(draft_len),
                sampling: None,
            },
        })
    }

    /// The reference's greedy and speculative runs with `weights` (its pruned draft head when it
    /// has one): one warm-up, then `repeats` timed runs.
    fn reference_runs(&self, weights: &M2r2Weights) -> Result<Vec<(f64, SpecRun)>> {
        let model = &self.loaded.model;
        let mut runs = Vec::new();
        for i in 0..=self.repeats {
            let g = generate(model, &self.prompt, &self.greedy_options, &mut |_, _| {})?;
            let capacity =
                self.prompt.len() + self.decode_tokens + self.spec_options.draft_length.max() + 1;
            let mut backend = ReferenceSpeculation::new(
                M2r2::new(model, weights),
                self.draft_gate,
                None,
                capacity,
            )?;
            let run = timed_speculative(&mut backend, &self.prompt, &self.spec_options, &g.tokens)?;
            if i > 0 {
                runs.push((g.decode_tokens_per_second(), run));
            }
        }
        Ok(runs)
    }

    /// The reference's medians with `weights`.
    pub fn reference(&self, weights: &M2r2Weights) -> Result<EngineResult> {
        Ok(summarise(
            "reference".into(),
            &self.reference_runs(weights)?,
        ))
    }
}

/// One speculative run's figures.
struct SpecRun {
    tokens_per_second: f64,
    mean_accepted_length: f64,
    ms_per_draft: f64,
    ms_per_verify: f64,
    equals_greedy: bool,
}

fn timed_speculative(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    options: &SpeculativeOptions,
    greedy_tokens: &[u32],
) -> Result<SpecRun> {
    let mut timed = Timed::new(backend);
    let start = Instant::now();
    let out = speculative_generate(&mut timed, prompt, options)?;
    let decode = start.elapsed().as_secs_f64() - timed.times.prefill_seconds;
    Ok(SpecRun {
        tokens_per_second: out.tokens.len().saturating_sub(1) as f64 / decode.max(1e-12),
        mean_accepted_length: out.mean_accepted_length(),
        ms_per_draft: timed.times.ms_per_draft(),
        ms_per_verify: timed.times.ms_per_verify(),
        equals_greedy: out.tokens == greedy_tokens,
    })
}

fn summarise(engine: String, runs: &[(f64, SpecRun)]) -> EngineResult {
    let m = |f: &dyn Fn(&(f64, SpecRun)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    EngineResult {
        engine,
        onnx: None,
        static_cache: None,
        greedy_tokens_per_second: m(&|r| r.0),
        speculative_tokens_per_second: m(&|r| r.1.tokens_per_second),
        mean_accepted_length: m(&|r| r.1.mean_accepted_length),
        ms_per_draft_step: m(&|r| r.1.ms_per_draft),
        ms_per_verify_step: m(&|r| r.1.ms_per_verify),
        speculative_equals_greedy: runs.iter().all(|r| r.1.equals_greedy),
        speculative_over_greedy: Spread::of(
            &runs
                .iter()
                .map(|r| r.1.tokens_per_second / r.0)
                .collect::<Vec<_>>(),
        ),
        greedy_over_first_export: None,
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn print_table(r: &OnnxBenchResult) {
    println!(
        "bench {} on ONNX Runtime {} ({} requested, {} ran) vs the reference",
        r.model, r.onnxruntime, r.ep, r.ep_used
    );
    println!(
        "cpu: {}; memory read bandwidth {:.1} GB/s; export {}; M2R2 weights: {}",
        r.cpu,
        r.memory_read_bytes_per_second / 1e9,
        r.onnx,
        r.m2r2
    );
    println!(
        "prompt {} tokens, decode {} tokens, draft gate {}, {} drafts per round, {}; median of {} runs after 1 warm-up",
        r.prompt_len,
        r.decode_tokens,
        r.draft_gate,
        r.draft_len,
        head_words(r.draft_head_tokens),
        r.repeats
    );
    print_engines(&r.engines);
    println!(
        "  greedy tokens equal to the reference's: {}",
        if r.tokens_equal_reference {
            "yes"
        } else {
            "NO"
        }
    );
}

/// The engines' table rows and the legend; the engine column is as wide as its longest name.
pub fn print_engines(engines: &[EngineResult]) {
    let width = engines
        .iter()
        .map(|e| e.engine.len())
        .max()
        .unwrap_or(0)
        .max(30);
    println!(
        "  {:<width$} {:>14} {:>14} {:>10} {:>12} {:>13} {:>9}",
        "engine", "greedy tok/s", "spec tok/s", "accepted", "ms/draft", "ms/verify", "lossless"
    );
    for e in engines {
        println!(
            "  {:<width$} {:>14.1} {:>14.1} {:>10.2} {:>12.2} {:>13.2} {:>9}",
            e.engine,
            e.greedy_tokens_per_second,
            e.speculative_tokens_per_second,
            e.mean_accepted_length,
            e.ms_per_draft_step,
            e.ms_per_verify_step,
            if e.speculative_equals_greedy {
                "yes"
            } else {
                "NO"
            }
        );
    }
    print_spreads(engines, width);
    println!(
        "  (accepted: tokens emitted per verification; ms/draft: one token through draft.onnx or the \
         reference's lower layers with the fast stream; ms/verify: one verify chunk)"
    );
    println!(
        "  (a fixed chain on a pseudo-random prompt: it prices the steps, not the default \
         drafting's speed-up on text, which scripts/bench_speculative.py measures on real prompts)"
    );
}

/// The ratios paired within each timed run, median (lowest-highest): what a side-by-side
/// comparison should quote on a noisy machine. The second column only with several exports.
fn print_spreads(engines: &[EngineResult], width: usize) {
    let exports: Vec<&EngineResult> = engines.iter().filter(|e| e.onnx.is_some()).collect();
    let several = exports.len() > 1;
    let mut header = format!(
        "  {:<width$} {:>22}",
        "ratios paired per run", "spec / greedy"
    );
    if several {
        header.push_str(&format!(" {:>26}", "greedy / first export"));
    }
    println!("{header}");
    for e in engines {
        let mut row = format!(
            "  {:<width$} {:>22}",
            e.engine,
            e.speculative_over_greedy.to_string()
        );
        if several {
            let over_first = e
                .greedy_over_first_export
                .map_or("-".into(), |s| s.to_string());
            row.push_str(&format!(" {over_first:>26}"));
        }
        println!("{row}");
    }
    let mut legend = "  (median (lowest-highest) of one ratio per timed run".to_string();
    if several {
        legend.push_str(&format!("; first export: {}", exports[0].engine));
    }
    println!("{legend})");
}

/// Run from `m2r2 bench` when `--onnx` is given.
pub fn run(
    loaded: &LoadedModel,
    m2r2: Option<String>,
    draft_head: Option<OnOff>,
    dirs: &[std::path::PathBuf],
    ep: &EpArgs,
    sizes: &Sizes,
    json: bool,
) -> Result<()> {
    let result = measure(loaded, m2r2, draft_head, dirs, ep, sizes)?;
    if json {
        common::print_json(&result)?;
    } else {
        print_table(&result);
    }
    Ok(())
}
