//! `m2r2 info --onnx DIR`: what an export folder holds, read from its manifest and its graphs:
//! the model and M2R2 settings it was written with, the draft split, the drafting `run --mode
//! speculative` does by default (the config's `onnx_drafting` when it has one), and per graph its file,
//! size, node count (per decoder layer), opset and whether its KV cache is static (fixed
//! buffers of `L` positions written in place) or grows every step. What the parsed graphs
//! contradict (an empty graph file, KV buffers of another length than the manifest's, external
//! data shorter than the initializers reach) is listed as `problems` and fails the command.

use crate::cli::common;
use anyhow::{Context, Result, bail};
use export::proto::ModelProto;
use export::proto::tensor_shape_proto::dimension;
use export::proto::type_proto;
use export::summary::is_constant;
use onnx_runner::manifest::{ExportDir, GraphKind, MANIFEST_FILE};
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
    let mut problems = Vec::new();
    for kind in KINDS.into_iter().filter(|&k| export.has(k)) {
        let path = export.graph(kind)?;
        let proto = export::write::read_graph(&path)
            .with_context(|| format!("cannot read the {} graph", kind.name()))?;
        problems.extend(graph_problems(&path, &proto, export.static_l_max(kind)));
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
            "layers": [layers.start, layers.end],
            "kv_cache": match export.static_l_max(kind) {
                Some(l) => json!({"kind": "static", "l_max": l}),
                None => json!({"kind": "dynamic"}),
            },
        }));
    }
    Ok(json!({
        "export": dir.display().to_string(),
        "model_name": m.model_name,
        "exporter_version": m.exporter_version,
        "format_version": m.format_version,
        "weights_dtype": m.weights_dtype,
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
        "genai_config": dir.join("genai_config.json").is_file(),
        "graphs": graphs,
        "problems": problems,
    }))
}

/// What the parse of the graph at `path` shows wrong, cheaply: no graph (an empty or truncated
/// file), KV buffers of another length than the manifest's static cache (`l_max`; `None`:
/// dynamic), and external data files shorter than the bytes its initializers name.
fn graph_problems(path: &Path, proto: &ModelProto, l_max: Option<usize>) -> Vec<String> {
    let file = path.display();
    let Some(graph) = proto.graph.as_ref().filter(|g| !g.node.is_empty()) else {
        return vec![format!(
            "{file} holds no graph ({} bytes, no nodes): export the folder again",
            file_size(path)
        )];
    };
    let mut problems = Vec::new();
    // the first layer's key buffer `[B, Hkv, L, Dh]`: L fixed in a static graph, named in a
    // dynamic one
    let past = graph.input.iter().find(|i| {
        i.name
            .as_deref()
            .is_some_and(|n| n.starts_with("past_key_values."))
    });
    let fixed = past.and_then(|i| match i.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => match t.shape.as_ref()?.dim.get(2)?.value {
            Some(dimension::Value::DimValue(l)) => usize::try_from(l).ok(),
            _ => None,
        },
        _ => None,
    });
    if fixed != l_max {
        let name = past
            .and_then(|i| i.name.as_deref())
            .unwrap_or("past_key_values.*");
        let manifest = match l_max {
            Some(l) => format!("static_cache.l_max = {l}"),
            None => "a dynamic KV cache".into(),
        };
        let graph = match fixed {
            Some(l) => format!("`{name}` holds {l} positions"),
            None => format!("`{name}` has no fixed positions axis"),
        };
        problems.push(format!(
            "{file}: {MANIFEST_FILE} says {manifest}, but the graph's {graph} (the manifest and \
             the graph disagree: export the folder again)"
        ));
    }
    // external data: each file must hold the bytes its initializers point at
    let mut reach: BTreeMap<String, u64> = BTreeMap::new();
    for t in &graph.initializer {
        let entry = |key: &str| {
            t.external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(key))
                .and_then(|e| e.value.as_deref())
        };
        let Some(location) = entry("location") else {
            continue;
        };
        let number = |key| entry(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let end = number("offset") + number("length");
        let slot = reach.entry(location.to_string()).or_default();
        *slot = (*slot).max(end);
    }
    for (location, end) in reach {
        let data = path.with_file_name(&location);
        let bytes = file_size(&data);
        if bytes < end {
            problems.push(format!(
                "{} holds {bytes} bytes, but {file}'s initializers reach byte {end} (a truncated or \
                 missing file: export the folder again)",
                data.display()
            ));
        }
    }
    problems
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

pub fn print_text(info: &Value) {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "none".into(),
        v => v.to_string(),
    };
    println!("export        {}", s(&info["export"]));
    println!(
        "model         {} ({} layers, hidden {}, vocab {}), {} weights",
        s(&info["model_name"]),
        info["layers"],
        info["hidden_size"],
        info["vocab_size"],
        s(&info["weights_dtype"])
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
    match info["static_cache"].as_object() {
        Some(sc) => println!(
            "KV cache      static: fixed buffers of {} positions, written in place (opset {}){}",
            sc["l_max"],
            sc["opset"],
            match sc["merged_adapters"].as_bool() {
                Some(true) => "; draft with merged adapters, streams stacked",
                _ => "",
            }
        ),
        None => println!("KV cache      dynamic: grows every step"),
    }
    println!(
        "genai config  {}",
        if info["genai_config"].as_bool() == Some(true) {
            "genai_config.json (onnxruntime-genai loads model.onnx)"
        } else {
            "none"
        }
    );
    println!();
    println!(
        "{:<9} {:<14} {:>10} {:>7} {:>11} {:>6} {:>8}  kv cache",
        "graph", "file", "size", "nodes", "per layer", "opset", "layers"
    );
    for g in info["graphs"].as_array().into_iter().flatten() {
        let kv = match g["kv_cache"]["l_max"].as_u64() {
            Some(l) => format!("static, L = {l}"),
            None => "dynamic".into(),
        };
        println!(
            "{:<9} {:<14} {:>10} {:>7} {:>11} {:>6} {:>8}  {kv}",
            s(&g["graph"]),
            s(&g["file"]),
            common::bytes(g["bytes"].as_f64().unwrap_or(0.0)),
            g["nodes"].as_u64().unwrap_or(0),
            g["nodes_per_layer"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            s(&g["opset"]),
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

fn yes_no(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}
