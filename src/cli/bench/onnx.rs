//! `m2r2 bench --onnx DIR --ep E`: greedy and self-speculative decoding on ONNX Runtime against the
//! reference on the same machine, the same prompt and the same M2R2 weights: prefill and decode
//! tokens/s, mean accepted length, and milliseconds per draft step and per verify step (medians
//! over `--repeats` timed runs after one warm-up run of each, which also builds TensorRT engines).
//! `--onnx` given several times measures each export as its own engine, their runs alternating
//! within each repeat (a dynamic and a static export of one model side by side), with the
//! machine's memory read bandwidth.

use crate::cli::args::bench::Sizes;
use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::args::onnx::{
    CudaGraph, EpArgs, check_draft_head, open_export, open_matching_export,
};
use crate::cli::bench::cost_shape;
use crate::cli::bench::results::{OnnxBenchResult, Spread, check_equalities, print_table};
use crate::cli::bench::spec_bench::{GreedyRun, SpecBench, summarise, timed_speculative};
use crate::cli::common;
use crate::cli::decode_speed::{DecodeWeights, cpu_model};
use anyhow::{Result, bail};
use onnx_runner::ep::EpConfig;
use onnx_runner::greedy::OnnxModel;
use onnx_runner::manifest::{ExportDir, GraphKind};
use onnx_runner::speculation::OnnxSpeculation;
use reference::base::generate::generate;
use reference::decode::tree_backend::tree_positions;
use reference::golden::WeightsId;
use reference::io::load::LoadedModel;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// ONNX Runtime's step costs for `m2r2 bench --cost-shape --onnx DIR`: the export must be of the
/// loaded model with the reference's M2R2 weights (`weights`, from `source`), draft gate and draft
/// head. One engine for the
/// session options of the flags, then one for each `--ort-compare` variant, measured one after
/// the other in this run (each variant's sessions are dropped before the next is loaded).
pub fn cost_shape_engines(
    loaded: &LoadedModel,
    (weights, source): (&M2r2Weights, &str),
    dir: &Path,
    ep_args: &EpArgs,
    sizes: &Sizes,
    bandwidth: f64,
) -> Result<Vec<cost_shape::EngineShape>> {
    let export = open_matching_export(loaded, weights, dir)?;
    check_weights(&export, weights, source)?;
    onnx_runner::runtime::init()?;
    let base = ep_args.config(&export, cost_shape::MAX_VERIFY_ROWS)?;
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

/// Refuse an export of other M2R2 weights than the reference's `weights` (`source` names them),
/// compared as `golden check --onnx` compares a golden's: by the hashes its manifest records. A
/// manifest from before `m2r2_hash` cannot say; a note, and the bench goes on.
fn check_weights(export: &ExportDir, weights: &M2r2Weights, source: &str) -> Result<()> {
    let dir = export.dir.display();
    let Some(exported) = export.weights_id() else {
        eprintln!(
            "note: {dir} does not record which M2R2 weights it holds (its m2r2_export.json \
             predates `m2r2_hash`): not compared with the reference's"
        );
        return Ok(());
    };
    let id = WeightsId::of(weights);
    if !id.matches(&exported) {
        bail!(
            "the export {dir} holds other M2R2 weights ({exported}) than the reference's \
             ({source}: {id}): pass the --m2r2 folder {dir} was exported from (`--m2r2 none` for \
             an export written with `--m2r2 none`)"
        );
    }
    Ok(())
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
        check_weights(export, &weights, &args.source(loaded))?;
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
    let bandwidth = crate::cli::decode_speed::bandwidth(sizes);
    let runtime = onnx_runner::runtime::init()?;

    let reference_runs = bench.reference_runs(&weights)?;
    let (prompt, greedy_options, spec_options) =
        (&bench.prompt, &bench.greedy_options, &bench.spec_options);
    let reference_tokens = generate(&loaded.model, prompt, greedy_options, &mut |_, _| {})?.tokens;

    // ONNX Runtime: every export loaded, then their runs alternating within each repeat
    // `--cuda-graph both`: a static export twice, without then with CUDA graphs
    if ep_args.cuda_graph == Some(CudaGraph::Both) {
        if ep_args.ep != onnx_runner::ep::Ep::Cuda {
            bail!(
                "--cuda-graph both measures static exports with CUDA graphs, which need --ep \
                 cuda (this run is --ep {})",
                ep_args.ep.name()
            );
        }
        if exports
            .iter()
            .all(|e| e.static_l_max(GraphKind::Model).is_none())
        {
            bail!(
                "--cuda-graph both measures static exports without and with CUDA graphs, and \
                 every export here is dynamic: add one written with `m2r2 export --static-cache L`"
            );
        }
    }
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
                runs.push((GreedyRun::of(&g), run));
            }
            *tokens = g.tokens;
        }
    }

    let mut results = vec![summarise("reference".into(), &reference_runs)];
    let mut tokens_equal_reference = true;
    let first_greedy: Vec<&GreedyRun> = engines[0].2.iter().map(|r| &r.0).collect();
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
            let paired = |f: fn(&GreedyRun) -> f64| {
                let ratios: Vec<f64> = runs
                    .iter()
                    .zip(&first_greedy)
                    .map(|(r, g)| f(&r.0) / f(g))
                    .collect();
                Some(Spread::of(&ratios))
            };
            engine.greedy_over_first_export = paired(|g| g.tokens_per_second);
            engine.prefill_over_first_export = paired(|g| g.prefill_tokens_per_second);
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
    check_equalities(&result.engines, result.tokens_equal_reference)
}
