//! `m2r2 export`: write the ONNX graphs of a model with its M2R2 weights (`model.onnx`,
//! `draft.onnx`, `verifier.onnx`), the onnxruntime-genai config, the tokenizer files and the
//! manifest into a folder (docs/ONNX.md), then print a summary table per graph.

use crate::cli::args::m2r2::{M2r2Args, OnOff};
use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result};
use export::builder::{DEFAULT_OPSET, WeightsDtype};
use export::check::{TOLERANCE, check_folder, probe_tokens, rounded_to_f16};
use export::folder::{Event, ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use export::summary::GraphSummary;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// M2R2 weights folder (as written by `m2r2 init-m2r2`), or `none` for zero adapters without
    /// ARLA; default: the model's built-in M2R2 weights
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Folder to write, created with its parents (replaced only if empty or an earlier export; for
    /// a symbolic link, the folder it names)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Graphs to write, comma-separated (feed: the draft layers' slow stream alone, which
    /// speculative decoding feeds the positions it does not propose from through, so only beside
    /// draft and verifier; without it, draft.onnx does that work)
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "model,draft,verifier,feed"
    )]
    pub graphs: Vec<String>,
    /// Draft gate g_d, 1-based, where draft.onnx ends and verifier.onnx starts (default: the M2R2
    /// config's draft gate for ONNX Runtime, `onnx_drafting.draft_gate`, else `draft_gate`)
    #[arg(long, value_name = "G")]
    pub draft_gate: Option<usize>,
    /// ONNX opset (17..=21) of the dynamic graphs (default 17); not with --static-cache, whose
    /// graphs are always opset 24
    #[arg(long, value_name = "N", conflicts_with = "static_cache")]
    pub opset: Option<i64>,
    /// Write every graph with a static KV cache of L_MAX positions per layer (opset 24:
    /// RMSNormalization, RotaryEmbedding, TensorScatter, Attention), updated in place by the
    /// runner; no genai_config.json (docs/STATIC.md)
    #[arg(long, value_name = "L_MAX")]
    pub static_cache: Option<usize>,
    /// With --static-cache: draft.onnx with the accelerator adapters merged into the fast
    /// stream's weights (W + c B A) and both streams stacked, about half the nodes; for
    /// providers that pay per node (CUDA, with or without CUDA graphs); reads the lower layers'
    /// weights twice, so slower on a CPU (docs/STATIC.md)
    #[arg(long)]
    pub merge_adapters: bool,
    /// Weight storage: f32, or f16 with a Cast to f32 after each weight (inputs and outputs stay f32)
    #[arg(long, value_name = "f32|f16", default_value = "f32")]
    pub weights_dtype: WeightsDtype,
    /// Store weights in `<graph>.onnx.data` next to each graph (automatic above 2 GB)
    #[arg(long)]
    pub external_data: bool,
    /// Run the written graphs with ONNX Runtime on a probe sequence and compare with the reference
    #[arg(long)]
    pub check: bool,
    /// Pruned draft head (draft_head.json in the --m2r2 folder): draft.onnx scores only its K
    /// tokens (default: on when the folder has one)
    #[arg(long, value_enum, value_name = "on|off")]
    pub draft_head: Option<OnOff>,
}

pub fn run(args: &Args) -> Result<()> {
    let graphs = args
        .graphs
        .iter()
        .map(|g| g.trim().parse::<GraphKind>())
        .collect::<Result<Vec<_>, _>>()
        .context("--graphs")?;
    if let Some(i) = (0..graphs.len()).find(|&i| graphs[..i].contains(&graphs[i])) {
        anyhow::bail!(
            "--graphs {}: `{}` is listed twice (item {})",
            args.graphs.join(","),
            args.graphs[i].trim(),
            i + 1
        );
    }
    // before anything is written: the probe goes in as two chunks of the static buffers
    if let Some(l_max) = args.static_cache
        && args.check
        && l_max < 2
    {
        anyhow::bail!(
            "--check feeds a probe in two chunks, which needs a static cache of 2 positions or \
             more (--static-cache {l_max}): raise --static-cache, or drop --check"
        );
    }
    let loaded = common::load(&args.model.model)?;
    let m2r2_args = M2r2Args {
        draft_head: args.draft_head,
        ..M2r2Args::weights_only(args.m2r2.clone())
    };
    let m2r2 = m2r2_args.weights(&loaded)?;
    let options = ExportOptions {
        model_name: loaded.name.clone(),
        opset: args.opset.unwrap_or(DEFAULT_OPSET),
        weights_dtype: args.weights_dtype,
        // ONNX Runtime's draft gate (`onnx_drafting` when the config has it)
        draft_gate: args.draft_gate.unwrap_or(m2r2.config.for_onnx().draft_gate),
        static_cache: args.static_cache,
        merge_adapters: args.merge_adapters,
    };
    let request = ExportRequest {
        model: &loaded.model,
        tokenizer: loaded.tokenizer.as_ref(),
        m2r2: &m2r2,
        options,
        graphs,
        external_data: args.external_data,
    };
    let bar = progress::steps(request.graphs.len() as u64, "export");
    let summaries = export(&request, &args.out, &mut |event| match event {
        Event::Building(k) => bar.set_message(format!("building {}", k.file_name())),
        Event::Writing(k) => bar.set_message(format!("writing {}", k.file_name())),
        Event::Done(_) => bar.inc(1),
        Event::RemovedStale(dir) => bar.suspend(|| {
            eprintln!(
                "note: removed {}, left by an export to the same folder that was stopped before \
                 it finished",
                dir.display()
            )
        }),
    })
    .with_context(|| format!("cannot export {} to {}", loaded.name, args.out.display()))?;
    bar.finish_and_clear();
    let head = match &m2r2.draft_head {
        Some(h) => format!("pruned draft head of {} tokens", h.len()),
        None => "full draft head".into(),
    };
    eprintln!(
        "exported {} (M2R2 weights: {}, draft gate {}, {head}) to {}",
        loaded.name,
        m2r2_args.source(&loaded),
        request.options.draft_gate,
        args.out.display()
    );
    if let Some(l_max) = args.static_cache {
        eprintln!(
            "static KV cache: {} in opset 24, each layer's keys and values in a buffer of {l_max} \
             positions written in place (no genai_config.json: onnxruntime-genai cannot drive it)",
            request
                .graphs
                .iter()
                .map(|k| k.file_name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    print_table(&summaries);
    if args.check {
        check(&loaded, &m2r2, &request, &args.out)?;
    }
    Ok(())
}

/// The summary table: one row per graph, then its op histogram.
fn print_table(summaries: &[GraphSummary]) {
    println!(
        "{:<14} {:>7} {:>11} {:>11} {:>7} {:>7}",
        "graph", "nodes", "parameters", "bytes", "inputs", "outputs"
    );
    for s in summaries {
        println!(
            "{:<14} {:>7} {:>11} {:>11} {:>7} {:>7}",
            s.file,
            s.nodes,
            common::count(s.parameters as f64),
            common::bytes(s.bytes as f64),
            s.inputs.len(),
            s.outputs.len()
        );
    }
    for s in summaries {
        println!("{} ops: {}", s.file, s.op_histogram());
        println!("{} inputs: {}", s.file, s.inputs.join(" "));
        println!("{} outputs: {}", s.file, s.outputs.join(" "));
    }
}

/// `--check`: the written graphs under ONNX Runtime (CPU) against the reference on a probe.
fn check(
    loaded: &reference::io::load::LoadedModel,
    m2r2: &reference::m2r2::weights::M2r2Weights,
    request: &ExportRequest<'_>,
    out: &std::path::Path,
) -> Result<()> {
    let mut tokens = probe_tokens(&loaded.model, loaded.tokenizer.as_ref())?;
    // a static export's buffers hold the probe: at most L tokens of it (2 at the least, one
    // chunk each side of the split: `run` refuses fewer before writing)
    if let Some(l_max) = request.options.static_cache {
        tokens.truncate(l_max);
    }
    let split = tokens.len() / 2;
    eprintln!(
        "checking with ONNX Runtime (CPU) on a probe of {} tokens fed as {split} + {}: {tokens:?}",
        tokens.len(),
        tokens.len() - split
    );
    // f16 graphs compute with the f16-rounded weights: compare with the reference on those.
    let rounded = (request.options.weights_dtype == WeightsDtype::F16)
        .then(|| rounded_to_f16(&loaded.model, m2r2));
    let (model, m2r2) = match &rounded {
        Some((model, m2r2)) => (model, m2r2),
        None => (&loaded.model, m2r2),
    };
    let rows = check_folder(
        out,
        model,
        m2r2,
        request.options.draft_gate,
        &request.graphs,
        &tokens,
        split,
    )
    .context("--check")?;
    println!(
        "{:<28} {:<36} {:>12} {:>10} {:>9} {:>6}",
        "graph", "tensor", "max |diff|", "max |ref|", "tolerance", "ok"
    );
    let mut failed = 0;
    for r in &rows {
        println!(
            "{:<28} {:<36} {:>12.3e} {:>10.3} {:>9.0e} {:>6}",
            r.graph,
            r.tensor,
            r.max_abs_diff,
            r.max_abs_ref,
            r.tolerance,
            if r.ok() { "OK" } else { "NOT OK" }
        );
        failed += usize::from(!r.ok());
    }
    // the tolerance of most rows; a merged f16 draft's fast outputs have their own (the table)
    let looser = rows.iter().any(|r| r.tolerance != TOLERANCE);
    let except = if looser {
        " (a merged f16 draft's fast outputs: their tolerance column)"
    } else {
        ""
    };
    // NaN or inf fail whatever the differences: say where, before the tolerance
    let non_finite: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let side = r.non_finite?;
            Some(format!("{} {} (non-finite in {side})", r.graph, r.tensor))
        })
        .collect();
    if let Some(first) = non_finite.first() {
        anyhow::bail!(
            "--check: {} of {} tensors hold non-finite values (NaN or inf), which no tolerance \
             accepts (the NOT OK rows); the first: {first}",
            non_finite.len(),
            rows.len()
        );
    }
    if failed > 0 {
        anyhow::bail!(
            "--check: {failed} of {} tensors differ from the reference by more than {TOLERANCE} x max(1, max |ref|){except}",
            rows.len()
        );
    }
    eprintln!(
        "check passed: {} tensors within {TOLERANCE} x max(1, max |ref|) of the reference{except}",
        rows.len()
    );
    Ok(())
}
