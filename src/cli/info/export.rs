//! `m2r2 info --onnx DIR`: what an export folder holds, read from its manifest and its graphs:
//! the model and M2R2 settings it was written with, the draft split, the drafting `run --mode
//! speculative` does by default (the config's `onnx_drafting` when it has one), and per graph its file,
//! size, node count (per decoder layer), opset, weights dtype and whether its KV cache is static
//! (fixed buffers of `L` positions written in place) or grows every step. What the parsed graphs
//! contradict (`problems.rs`: an empty graph file, a graph of another export, KV buffers of
//! another length than the manifest's, external data shorter than the initializers reach) is
//! listed as `problems` (every contradiction of each graph) and fails the command; what the
//! manifest says and a graph contradicts is not printed as fact: the graphs table shows each
//! graph's own weights dtype and KV buffer length.

use super::problems::{
    file_size, folder_problems, genai_model, graph_problems, held_positions, metadata,
};
use crate::cli::common;
use anyhow::{Context, Result, bail};
use export::summary::is_constant;
use onnx_runner::manifest::{ExportDir, GraphKind};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

const KINDS: [GraphKind; 4] = [
    GraphKind::Model,
    GraphKind::Draft,
    GraphKind::Verifier,
    GraphKind::Feed,
];

/// The `info --onnx --json` object.
pub fn describe(dir: &Path) -> Result<Value> {
    let export = ExportDir::open(dir)?;
    let m = &export.manifest;
    let c = &m.config;
    let n = c.num_hidden_layers;
    let e = m.draft_layers;
    let mut graphs = Vec::new();
    let genai = genai_model(dir);
    let mut problems = folder_problems(&export, genai.as_ref());
    // the weights dtype each graph records, where it is not the manifest's
    let mut other_dtypes = Vec::new();
    for kind in KINDS.into_iter().filter(|&k| export.has(k)) {
        let path = export.graph(kind)?;
        let proto = export::write::read_graph(&path)
            .with_context(|| format!("cannot read the {} graph", kind.name()))?;
        problems.extend(graph_problems(&export, kind, &path, &proto));
        let dtype = metadata(&proto, "m2r2.weights_dtype");
        if let Some(d) = dtype.as_ref().filter(|&d| *d != m.weights_dtype)
            && !other_dtypes.contains(d)
        {
            other_dtypes.push(d.clone());
        }
        let graph = proto.graph.as_ref();
        let nodes = graph.map_or(0, |g| g.node.len());
        let weights = graph.map_or(0, |g| {
            g.initializer
                .iter()
                .filter(|t| !is_constant(t.name.as_deref().unwrap_or("")))
                .count()
        });
        let layers = match kind {
            GraphKind::Model => 0..n,
            GraphKind::Draft | GraphKind::Feed => 0..e,
            GraphKind::Verifier => e..n,
        };
        let data = path.with_extension("onnx.data");
        let bytes = file_size(&path) + file_size(&data);
        let opset = proto
            .opset_import
            .iter()
            .find(|o| o.domain.as_deref().unwrap_or("").is_empty())
            .and_then(|o| o.version);
        graphs.push(json!({
            "graph": kind.name(),
            "file": path.file_name().map(|f| f.to_string_lossy().to_string()),
            "bytes": bytes,
            "nodes": nodes,
            "nodes_per_layer": (!layers.is_empty()).then(|| nodes as f64 / layers.len() as f64),
            "weight_initializers": weights,
            "opset": opset,
            // as the graph records it (`m2r2.weights_dtype`; null in older exports)
            "weights_dtype": dtype,
            "layers": [layers.start, layers.end],
            // what the graph's buffers hold (a problem says where the manifest says otherwise)
            "kv_cache": kv_cache(&proto),
        }));
    }
    Ok(json!({
        "export": dir.display().to_string(),
        "model_name": m.model_name,
        "exporter_version": m.exporter_version,
        "format_version": m.format_version,
        // the manifest's, unless a graph holds another (then null, and a problem says which)
        "weights_dtype": other_dtypes.is_empty().then_some(&m.weights_dtype),
        "manifest_weights_dtype": m.weights_dtype,
        "layers": n,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "draft_gate": m.draft_gate,
        "draft_layers": e,
        "arla": m.has_arla,
        "bridge": m.m2r2.bridge.as_ref().is_some_and(|b| b.gate == m.draft_gate),
        "draft_head_tokens": m.draft_head_tokens,
        "m2r2_hash": m.m2r2_hash,
        "m2r2_weights_hash": m.m2r2_weights_hash,
        // what `run --mode speculative` drafts on this export without flags
        "drafting": super::m2r2::drafting(&m.m2r2.drafting(), m.draft_head_tokens),
        "static_cache": m.static_cache.as_ref().map(|s| json!({"l_max": s.l_max, "opset": s.opset, "merged_adapters": s.merged_adapters})),
        "genai_config": genai.is_some(),
        // the graph onnxruntime-genai loads (genai_config.json's model.decoder.filename)
        "genai_model": genai.and_then(Result::ok),
        "graphs": graphs,
        "problems": problems,
    }))
}

pub fn print_text(info: &Value) {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "none".into(),
        v => v.to_string(),
    };
    println!("export        {}", s(&info["export"]));
    let graphs: Vec<&Value> = info["graphs"].as_array().into_iter().flatten().collect();
    // the manifest's dtype as fact only where no graph holds another
    let manifest_dtype = s(&info["manifest_weights_dtype"]);
    let dtype = match &info["weights_dtype"] {
        Value::Null => {
            let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for g in &graphs {
                match g["weights_dtype"].as_str() {
                    Some(d) if d != manifest_dtype => {
                        held.entry(d.into()).or_default().push(s(&g["file"]))
                    }
                    _ => {}
                }
            }
            let held: Vec<String> = held
                .iter()
                .map(|(dtype, files)| {
                    let verb = if files.len() == 1 { "holds" } else { "hold" };
                    format!("{} {verb} {dtype}", files.join(", "))
                })
                .collect();
            format!(
                "{manifest_dtype} weights by the manifest, but {} (see the problems)",
                held.join("; ")
            )
        }
        d => format!("{} weights", s(d)),
    };
    println!(
        "model         {} ({} layers, hidden {}, vocab {}), {dtype}",
        s(&info["model_name"]),
        info["layers"],
        info["hidden_size"],
        info["vocab_size"],
    );
    println!(
        "written by    m2r2 {} (folder format {})",
        s(&info["exporter_version"]),
        info["format_version"]
    );
    println!(
        "draft split   gate {}: draft and feed hold layers 0..{}, the verifier the rest",
        info["draft_gate"], info["draft_layers"]
    );
    println!(
        "M2R2          ARLA {}, bridge {}, pruned draft head {}",
        yes_no(&info["arla"]),
        yes_no(&info["bridge"]),
        match info["draft_head_tokens"].as_u64() {
            Some(k) => format!("of {k} tokens"),
            None => "none".into(),
        }
    );
    super::m2r2::print_drafting("drafting     ", "default tree ", &info["drafting"]);
    // the manifest's word, not printed as fact where a graph's buffers say otherwise
    let manifest_l = info["static_cache"]["l_max"].as_u64();
    let contradicted = match graphs
        .iter()
        .filter(|g| !g["kv_cache"].is_null())
        .any(|g| g["kv_cache"]["l_max"].as_u64() != manifest_l)
    {
        true => " by the manifest, but a graph holds another (see the problems)",
        false => "",
    };
    match info["static_cache"].as_object() {
        Some(sc) => println!(
            "KV cache      static: fixed buffers of {} positions, written in place (opset {}){}{contradicted}",
            sc["l_max"],
            sc["opset"],
            match sc["merged_adapters"].as_bool() {
                Some(true) => "; draft with merged adapters, streams stacked",
                _ => "",
            }
        ),
        None => println!("KV cache      dynamic: grows every step{contradicted}"),
    }
    println!(
        "genai config  {}",
        match (info["genai_config"].as_bool(), info["genai_model"].as_str()) {
            (Some(true), Some(file)) =>
                format!("genai_config.json (onnxruntime-genai loads {file})"),
            (Some(true), None) => "genai_config.json (unreadable: see the problems)".into(),
            _ => "none".into(),
        }
    );
    println!();
    if graphs.is_empty() {
        println!("graphs        none (the manifest lists no graph)");
    } else {
        println!(
            "{:<9} {:<14} {:>10} {:>7} {:>11} {:>6} {:>6} {:>8}  kv cache",
            "graph", "file", "size", "nodes", "per layer", "opset", "dtype", "layers"
        );
    }
    for g in graphs {
        let kv = match (
            g["kv_cache"]["kind"].as_str(),
            g["kv_cache"]["l_max"].as_u64(),
        ) {
            (Some("static"), Some(l)) => format!("static, L = {l}"),
            (Some("dynamic"), _) => "dynamic".into(),
            _ => "-".into(),
        };
        println!(
            "{:<9} {:<14} {:>10} {:>7} {:>11} {:>6} {:>6} {:>8}  {kv}",
            s(&g["graph"]),
            s(&g["file"]),
            common::bytes(g["bytes"].as_f64().unwrap_or(0.0)),
            g["nodes"].as_u64().unwrap_or(0),
            g["nodes_per_layer"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            s(&g["opset"]),
            g["weights_dtype"].as_str().unwrap_or("-"),
            format!("{}..{}", g["layers"][0], g["layers"][1]),
        );
    }
    let problems = info["problems"].as_array().into_iter().flatten();
    for (i, p) in problems.enumerate() {
        if i == 0 {
            println!();
        }
        println!("problem       {}", s(p));
    }
}

/// Refuse (after the description is printed) an export whose description found problems.
pub fn check_problems(info: &Value) -> Result<()> {
    let problems: Vec<String> = info["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str().map(String::from))
        .collect();
    match problems.as_slice() {
        [] => {}
        [one] => bail!("{one}"),
        [first, ..] => bail!(
            "the export {} has {} problems (the `problem` lines; `problems` with --json), the \
             first: {first}",
            info["export"].as_str().unwrap_or(""),
            problems.len()
        ),
    }
    Ok(())
}

/// The KV cache graph `proto` holds, read from its buffers' shape ([`held_positions`]): static with
/// its `L`, or dynamic; null for a file without a graph (a problem says so).
fn kv_cache(proto: &export::proto::ModelProto) -> Value {
    match proto.graph.as_ref().filter(|g| !g.node.is_empty()) {
        None => Value::Null,
        Some(graph) => match held_positions(graph) {
            Some(l) => json!({"kind": "static", "l_max": l}),
            None => json!({"kind": "dynamic"}),
        },
    }
}

fn yes_no(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}
