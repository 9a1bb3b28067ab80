//! What `m2r2 info --onnx DIR` finds contradicted in an export folder, cheaply (the graphs are
//! parsed, no ONNX Runtime session is built): a manifest that lists no graph, a genai_config.json
//! pointing at another file than the manifest's model graph, and per graph an empty file, KV
//! buffers of another length than the manifest's, every `m2r2.*` metadata entry of another export
//! (the runner's own check, [`ExportDir::check_metadata`], so `info` fails on what `run` refuses),
//! and external data shorter than the initializers reach.

use export::proto::tensor_shape_proto::dimension;
use export::proto::type_proto;
use export::proto::{GraphProto, ModelProto, ValueInfoProto};
use onnx_runner::manifest::{ExportDir, GraphKind, MANIFEST_FILE};
use std::collections::BTreeMap;
use std::path::Path;

/// The graphs' metadata entry of their static cache length (`none` when dynamic).
const STATIC_CACHE_KEY: &str = "m2r2.static_cache";

/// onnxruntime-genai's config, written beside a dynamic model.onnx.
pub const GENAI_CONFIG: &str = "genai_config.json";

/// The value of `key` in the graph's `metadata_props` (`m2r2.graph`, `m2r2.weights_dtype`, ...).
pub fn metadata(proto: &ModelProto, key: &str) -> Option<String> {
    proto
        .metadata_props
        .iter()
        .find(|p| p.key.as_deref() == Some(key))
        .and_then(|p| p.value.clone())
}

/// The graph `genai_config.json` in `dir` sends onnxruntime-genai to (`model.decoder.filename`):
/// `None` without the file, an error naming it when it does not say.
pub fn genai_model(dir: &Path) -> Option<Result<String, String>> {
    let path = dir.join(GENAI_CONFIG);
    let text = std::fs::read_to_string(&path).ok()?;
    let config: Option<serde_json::Value> = serde_json::from_str(&text).ok();
    let file = config
        .as_ref()
        .and_then(|c| c["model"]["decoder"]["filename"].as_str());
    Some(file.map(String::from).ok_or_else(|| {
        format!(
            "{}: expected a JSON object with model.decoder.filename, the graph onnxruntime-genai \
             loads (export the folder again)",
            path.display()
        )
    }))
}

/// What the folder as a whole contradicts: a manifest without graphs (every command would refuse
/// it), and `genai_config.json` ([`genai_model`]) unreadable or sending onnxruntime-genai to
/// another file than the manifest's model graph.
pub fn folder_problems(export: &ExportDir, genai: Option<&Result<String, String>>) -> Vec<String> {
    let manifest = export.dir.join(MANIFEST_FILE);
    let mut problems = Vec::new();
    if export.manifest.graphs.is_empty() {
        problems.push(format!(
            "{}: `graphs` lists no graph, so nothing can run this folder (expected model, draft, \
             verifier or feed: export the folder again)",
            manifest.display()
        ));
    }
    match genai {
        None => {}
        Some(Err(e)) => problems.push(e.clone()),
        Some(Ok(file)) => {
            let model = export.manifest.graphs.get(GraphKind::Model.name());
            if model != Some(file) {
                problems.push(format!(
                    "{}: onnxruntime-genai loads {file}, but {} {} (the folder contradicts \
                     itself: export it again)",
                    export.dir.join(GENAI_CONFIG).display(),
                    manifest.display(),
                    match model {
                        Some(m) => format!("names {m} as the model graph"),
                        None => "lists no model graph".into(),
                    }
                ));
            }
        }
    }
    problems
}

/// What the parse of graph `kind` at `path` shows wrong: no graph (an empty or truncated file);
/// a graph that is not the one the manifest describes, by its KV buffers (another length than
/// the manifest's static cache, [`held_positions`]) and by every `m2r2.*` metadata entry that
/// contradicts the manifest ([`metadata_problems`]); external data files shorter than the bytes
/// its initializers name.
pub fn graph_problems(
    export: &ExportDir,
    kind: GraphKind,
    path: &Path,
    proto: &ModelProto,
) -> Vec<String> {
    let file = path.display();
    let Some(graph) = proto.graph.as_ref().filter(|g| !g.node.is_empty()) else {
        return vec![format!(
            "{file} holds no graph ({} bytes, no nodes): export the folder again",
            file_size(path)
        )];
    };
    let mut problems = Vec::new();
    let l_max = export.static_l_max(kind);
    let fixed = held_positions(graph);
    if fixed != l_max {
        let name = past_key(graph)
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
    problems.extend(metadata_problems(export, kind, &file.to_string(), proto));
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

/// The first layer's key buffer `past_key_values.0.key` (`[B, Hkv, L, Dh]`) among the graph's
/// inputs.
fn past_key(graph: &GraphProto) -> Option<&ValueInfoProto> {
    graph.input.iter().find(|i| {
        i.name
            .as_deref()
            .is_some_and(|n| n.starts_with("past_key_values."))
    })
}

/// The positions `L` the graph's KV buffers hold: fixed in a static graph, `None` in a dynamic one
/// (its positions axis is named). What the graph holds, whatever the manifest says.
pub fn held_positions(graph: &GraphProto) -> Option<usize> {
    match past_key(graph)?.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => match t.shape.as_ref()?.dim.get(2)?.value {
            Some(dimension::Value::DimValue(l)) => usize::try_from(l).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// Every `m2r2.*` entry of the graph's metadata that contradicts the manifest, one problem each in
/// the runner's words ([`ExportDir::metadata_contradictions`], whose first `run` refuses), but the
/// static cache length: the KV buffers' shape ([`held_positions`]) says it from the graph itself,
/// once.
fn metadata_problems(
    export: &ExportDir,
    kind: GraphKind,
    file: &str,
    proto: &ModelProto,
) -> Vec<String> {
    match export.metadata_contradictions(kind, file, |key| Ok(metadata(proto, key))) {
        Ok(found) => found
            .into_iter()
            .filter(|(key, _)| *key != STATIC_CACHE_KEY)
            .map(|(_, contradiction)| contradiction.to_string())
            .collect(),
        Err(e) => vec![e.to_string()],
    }
}

pub fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
