//! The export folder (docs/ONNX.md, "Folder layout"): the graphs, `genai_config.json` and the
//! tokenizer files for onnxruntime-genai, and the manifest `m2r2_export.json`, written LAST.
//!
//! Everything is written into a temporary sibling folder (`.<name>.partial-<pid>`), which replaces
//! the target only when complete; on any error it is removed. A folder with a manifest is therefore
//! always a finished export. An existing target is replaced only when it is empty or an earlier
//! export (this exporter's manifest beside nothing an export does not write); anything else is
//! refused. Missing parent folders are created. An `--out` that is a symbolic link to a folder is
//! written through: the folder it names is replaced (its temporary sibling beside it), the link kept.

use crate::error::{Error, Result};
use crate::graphs::{self, ExportOptions, GraphKind};
use crate::stale;
use crate::static_graph;
use crate::summary::{GraphSummary, summarize};
use crate::write::write_graph;
use reference::base::model::Model;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::draft_head::DRAFT_HEAD_FILE;
use reference::m2r2::weights::M2r2Weights;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The manifest's file name.
pub const MANIFEST_FILE: &str = reference::io::folder_kind::EXPORT_MANIFEST_FILE;
/// The manifest's format version.
pub const FORMAT_VERSION: u32 = 1;

/// One export.
pub struct ExportRequest<'a> {
    pub model: &'a Model,
    pub tokenizer: Option<&'a Tokenizer>,
    pub m2r2: &'a M2r2Weights,
    pub options: ExportOptions,
    /// Graphs to write, in order.
    pub graphs: Vec<GraphKind>,
    /// Put the weights in `<graph>.onnx.data` files (automatic above the protobuf limit).
    pub external_data: bool,
}

/// Progress of an export, for a progress bar.
pub enum Event<'a> {
    /// A temporary folder of an earlier export to the same target that was stopped (Ctrl-C,
    /// `kill`) before it finished, now removed ([`crate::stale`]).
    RemovedStale(&'a Path),
    Building(GraphKind),
    Writing(GraphKind),
    Done(&'a GraphSummary),
}

/// Write the folder `out`; returns a summary per graph.
pub fn export(
    request: &ExportRequest<'_>,
    out: &Path,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<GraphSummary>> {
    graphs::check(request.model, request.m2r2, &request.options)?;
    if let Some(l_max) = request.options.static_cache {
        static_graph::check_l_max(request.model, l_max)?;
    }
    if request.graphs.is_empty() {
        return Err(Error::Invalid(
            "no graphs to export: --graphs needs at least one of model, draft, verifier, feed"
                .into(),
        ));
    }
    if request.options.merge_adapters && !request.graphs.contains(&GraphKind::Draft) {
        return Err(Error::Invalid(
            "--merge-adapters merges the adapters into draft.onnx, which --graphs does not \
             include: add draft to --graphs, or drop --merge-adapters"
                .into(),
        ));
    }
    check_feed(&request.graphs)?;
    let out = &resolve_link(out)?;
    check_replaceable(out)?;
    let temp = temp_sibling(out)?;
    if let (Some(parent), Some(name)) = (temp.parent(), out.file_name().and_then(|n| n.to_str())) {
        for removed in stale::remove_stale(parent, name) {
            progress(Event::RemovedStale(&removed));
        }
    }
    std::fs::create_dir(&temp).map_err(|e| {
        Error::Invalid(format!(
            "output folder {} is not writable: cannot create {}: {e}",
            out.display(),
            temp.display()
        ))
    })?;
    match write_all(request, &temp, progress) {
        Ok(summaries) => {
            if let Err(e) = replace(&temp, out) {
                let _ = std::fs::remove_dir_all(&temp);
                return Err(e);
            }
            Ok(summaries)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&temp);
            Err(e)
        }
    }
}

/// feed.onnx alone is of no use: only speculative decoding runs it, beside draft.onnx and
/// verifier.onnx, and an export replaces the whole folder, so they cannot be added later.
fn check_feed(graphs: &[GraphKind]) -> Result<()> {
    let missing: Vec<&str> = [GraphKind::Draft, GraphKind::Verifier]
        .into_iter()
        .filter(|k| !graphs.contains(k))
        .map(|k| k.name())
        .collect();
    if !graphs.contains(&GraphKind::Feed) || missing.is_empty() {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "--graphs has feed without {}: feed.onnx only serves speculative decoding, which runs it \
         beside draft.onnx and verifier.onnx (an export replaces the whole folder, so they cannot \
         be added later); add {} to --graphs, or drop feed",
        missing.join(" and "),
        missing.join(",")
    )))
}

/// `out`, or the folder it names when it is a symbolic link (`--out link` or `--out link/`): the
/// export then replaces that folder, its temporary sibling beside it, and the link stays.
fn resolve_link(out: &Path) -> Result<PathBuf> {
    // (components() drops a trailing `/`, through which the metadata would follow the link)
    let out: PathBuf = out.components().collect();
    let is_link = std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(out);
    }
    std::fs::canonicalize(&out).map_err(|e| {
        let target = std::fs::read_link(&out).unwrap_or_default();
        Error::Invalid(format!(
            "--out {} is a symbolic link to {}, which cannot be followed ({e}); \
             create the folder it names, or choose another --out",
            out.display(),
            target.display()
        ))
    })
}

fn temp_sibling(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Invalid(format!("--out {}: not a folder name", out.display())))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    create_parent(out, &parent)?;
    Ok(parent.join(stale::partial_name(name, std::process::id())))
}

/// Create `out`'s missing parent folders (like `mkdir -p`), naming an ancestor that is a file.
fn create_parent(out: &Path, parent: &Path) -> Result<()> {
    if parent.is_dir() {
        return Ok(());
    }
    let cannot = |why: String| {
        Error::Invalid(format!(
            "output folder {}: cannot create its parent {}: {why}",
            out.display(),
            parent.display()
        ))
    };
    if let Some(file) = parent
        .ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.exists() && !a.is_dir())
    {
        return Err(cannot(format!(
            "{} exists and is not a folder",
            file.display()
        )));
    }
    std::fs::create_dir_all(parent).map_err(|e| cannot(e.to_string()))
}

/// The files an export writes besides its graphs (`<graph>.onnx`, `<graph>.onnx.data`).
const EXPORT_FILES: [&str; 6] = [
    MANIFEST_FILE,
    "genai_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    DRAFT_HEAD_FILE,
];
/// The folder `run --onnx --ep tensorrt` keeps its engines in by default, inside the export.
const TRT_CACHE: &str = "trt_cache";

/// An existing `out` may be replaced only when it is an empty folder or an earlier export: this
/// exporter's manifest, beside nothing that an export (or the runner's `trt_cache`) does not
/// write. Replacing removes everything in it, so anything else is refused, naming why.
fn check_replaceable(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    if !out.is_dir() {
        return Err(Error::Invalid(format!(
            "--out {} exists and is not a folder",
            out.display()
        )));
    }
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let is_dir = entry
            .file_type()
            .map_err(|e| Error::io(entry.path(), e))?
            .is_dir();
        entries.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    if entries.is_empty() {
        return Ok(());
    }
    let refuse = |why: String| {
        Err(Error::Invalid(format!(
            "--out {} exists and is not an earlier export ({why}); replacing it would delete \
             everything in it: remove it or choose another folder",
            out.display()
        )))
    };
    if let Err(why) = check_manifest(&out.join(MANIFEST_FILE)) {
        return refuse(why);
    }
    entries.sort();
    let graph = |name: &str| {
        GraphKind::ALL.iter().any(|k| {
            let file = k.file_name();
            name == file || name == format!("{file}.data")
        })
    };
    for (name, is_dir) in entries {
        let written = if is_dir {
            name == TRT_CACHE
        } else {
            EXPORT_FILES.contains(&name.as_str()) || graph(&name)
        };
        if !written {
            let what = if is_dir { "folder" } else { "file" };
            return refuse(format!(
                "it holds the {what} {name}, which an export does not write"
            ));
        }
    }
    Ok(())
}

/// Whether `path` is this exporter's manifest: a JSON object with `format_version` and `graphs`;
/// else why not.
fn check_manifest(path: &Path) -> std::result::Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("no {MANIFEST_FILE}"),
        _ => format!("cannot read its {MANIFEST_FILE}: {e}"),
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("its {MANIFEST_FILE} is not JSON: {e}"))?;
    if value.get("format_version").is_some() && value.get("graphs").is_some_and(Value::is_object) {
        return Ok(());
    }
    Err(format!(
        "its {MANIFEST_FILE} is not this exporter's manifest: no format_version and graphs"
    ))
}

fn replace(temp: &Path, out: &Path) -> Result<()> {
    check_replaceable(out)?;
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| Error::io(out, e))?;
    }
    std::fs::rename(temp, out).map_err(|e| Error::io(out, e))
}

fn write_all(
    request: &ExportRequest<'_>,
    dir: &Path,
    progress: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<GraphSummary>> {
    let mut summaries = Vec::new();
    for &kind in &request.graphs {
        progress(Event::Building(kind));
        let (model, m2r2, options) = (request.model, request.m2r2, &request.options);
        let proto = match options.static_cache {
            Some(l_max) => static_graph::build_static(kind, model, m2r2, options, l_max)?,
            None => graphs::build(kind, model, m2r2, options)?,
        };
        let mut summary = summarize(kind, &proto);
        progress(Event::Writing(kind));
        let written = write_graph(proto, &dir.join(kind.file_name()), request.external_data)?;
        summary.bytes = written.bytes;
        summary.external_data = written.external;
        progress(Event::Done(&summary));
        summaries.push(summary);
    }
    // onnxruntime-genai loads model.onnx alone: a folder without it has no genai_config.json.
    // It drives model.onnx through `attention_mask` and growing past / present tensors: a static
    // model.onnx has neither, so a static folder has none either.
    if request.graphs.contains(&GraphKind::Model) && request.options.static_cache.is_none() {
        write_json(&dir.join("genai_config.json"), &genai_config(request))?;
    }
    if let Some(head) = &request.m2r2.draft_head {
        head.save(dir)?;
    }
    if let Some(tok) = request.tokenizer {
        write_tokenizer(tok, request.model, dir)?;
    }
    write_json(&dir.join(MANIFEST_FILE), &manifest(request))?;
    Ok(summaries)
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON serialises");
    std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))
}

/// `m2r2_export.json`: what the runner needs to drive the graphs.
pub fn manifest(request: &ExportRequest<'_>) -> Value {
    let m2r2 = request.m2r2;
    let o = &request.options;
    let graphs: serde_json::Map<String, Value> = request
        .graphs
        .iter()
        .map(|k| (k.name().to_string(), json!(k.file_name())))
        .collect();
    let mut manifest = json!({
        "format_version": FORMAT_VERSION,
        "exporter_version": graphs::EXPORTER_VERSION,
        "model_name": o.model_name,
        "config": request.model.config,
        "m2r2": m2r2.config,
        "draft_gate": o.draft_gate,
        "draft_layers": m2r2.config.gate_layer(o.draft_gate),
        "has_arla": m2r2.arla.is_some(),
        // The identity of the exported M2R2 weights, as golden files record it: `golden check
        // --onnx` refuses a speculative golden of other weights.
        "m2r2_hash": reference::golden::weights_hash(m2r2),
        // the same without the decoding defaults (`reference::golden::WeightsId`)
        "m2r2_weights_hash": reference::golden::weights_hash_without_defaults(m2r2),
        "draft_head_tokens": m2r2.draft_head.as_ref().map(|h| h.len()),
        "draft_head_file": m2r2.draft_head.as_ref().map(|_| DRAFT_HEAD_FILE),
        "stop_token_ids": reference::io::load::stop_tokens(&request.model.config, request.tokenizer),
        "opset": o.opset,
        "weights_dtype": o.weights_dtype.name(),
        "graphs": graphs,
    });
    // Only static exports have the key. `graphs`: those with the fixed buffers (opset 24, see
    // static_graph.rs): every graph of the folder. (Folders written before the static draft,
    // verifier and feed existed list `model` alone; the runner reads both.)
    if let Some(l_max) = o.static_cache {
        let names: Vec<&str> = request.graphs.iter().map(|k| k.name()).collect();
        manifest["static_cache"] = json!({
            "l_max": l_max,
            "opset": crate::builder::STATIC_OPSET,
            "graphs": names,
            "merged_adapters": o.merge_adapters,
        });
    }
    manifest
}

/// `genai_config.json` for onnxruntime-genai, pointing at `model.onnx`.
pub fn genai_config(request: &ExportRequest<'_>) -> Value {
    let c = &request.model.config;
    let tok = request.tokenizer;
    let bos = c
        .bos_token_id
        .or_else(|| tok.and_then(|t| t.bos_token_id()));
    let eos: Vec<u32> = if c.eos_token_ids.is_empty() {
        tok.map(|t| t.eos_token_ids()).unwrap_or_default()
    } else {
        c.eos_token_ids.clone()
    };
    let eos_value = match eos.as_slice() {
        [one] => json!(one),
        many => json!(many),
    };
    json!({
        "model": {
            "bos_token_id": bos,
            "context_length": c.max_position_embeddings,
            "decoder": {
                "session_options": { "log_id": "onnxruntime-genai", "provider_options": [] },
                "filename": GraphKind::Model.file_name(),
                "head_size": c.head_dim,
                "hidden_size": c.hidden_size,
                "inputs": {
                    "input_ids": graphs::INPUT_IDS,
                    "attention_mask": graphs::ATTENTION_MASK,
                    "position_ids": graphs::POSITION_IDS,
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value"
                },
                "outputs": {
                    "logits": graphs::LOGITS,
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"
                },
                "num_attention_heads": c.num_attention_heads,
                "num_hidden_layers": c.num_hidden_layers,
                "num_key_value_heads": c.num_key_value_heads
            },
            "eos_token_id": eos_value,
            "pad_token_id": eos.first().copied().or(bos),
            "type": c.architecture.model_type(),
            "vocab_size": c.vocab_size
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": false,
            "early_stopping": true,
            "length_penalty": 1.0,
            "max_length": c.max_position_embeddings,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": false,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0
        }
    })
}

/// `tokenizer.json`, `tokenizer_config.json` (with the chat template) and `special_tokens_map.json`.
fn write_tokenizer(tok: &Tokenizer, model: &Model, dir: &Path) -> Result<()> {
    let path = dir.join("tokenizer.json");
    tok.backend().save(&path, false).map_err(|e| {
        Error::Invalid(format!(
            "{}: cannot save the tokenizer: {e}",
            path.display()
        ))
    })?;
    let text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id));
    let bos = text(tok.bos_token_id());
    let eos = text(tok.eos_token_id());
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model.config.max_position_embeddings,
        "bos_token": bos,
        "eos_token": eos,
        "clean_up_tokenization_spaces": false,
        "chat_template": tok.chat_template(),
    });
    write_json(&dir.join("tokenizer_config.json"), &config)?;
    let mut specials = serde_json::Map::new();
    if let Some(b) = bos {
        specials.insert("bos_token".into(), json!(b));
    }
    if let Some(e) = eos {
        specials.insert("eos_token".into(), json!(e));
    }
    write_json(
        &dir.join("special_tokens_map.json"),
        &Value::Object(specials),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"{"format_version": 1, "graphs": {"model": "model.onnx"}}"#;

    fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn refused(dir: &Path) -> String {
        let err = check_replaceable(dir).unwrap_err().to_string();
        assert!(err.contains("remove it or choose another folder"), "{err}");
        err
    }

    #[test]
    fn an_earlier_export_is_replaceable_with_everything_it_writes() {
        let mut files = vec![(MANIFEST_FILE, MANIFEST)];
        files.extend(EXPORT_FILES[1..].iter().map(|f| (*f, "{}")));
        let dir = folder(&files);
        for kind in GraphKind::ALL {
            std::fs::write(dir.path().join(kind.file_name()), "").unwrap();
            std::fs::write(dir.path().join(format!("{}.data", kind.file_name())), "").unwrap();
        }
        std::fs::create_dir(dir.path().join(TRT_CACHE)).unwrap();
        std::fs::write(dir.path().join(TRT_CACHE).join("engine"), "").unwrap();
        check_replaceable(dir.path()).unwrap();
        // empty, or absent: replaceable too
        check_replaceable(tempfile::tempdir().unwrap().path()).unwrap();
        check_replaceable(&dir.path().join("absent")).unwrap();
    }

    #[test]
    fn a_folder_with_a_stray_manifest_or_foreign_entries_is_refused() {
        // the probe's case: any file named m2r2_export.json, beside the user's notes
        let dir = folder(&[(MANIFEST_FILE, "{}"), ("notes.txt", "notes")]);
        let err = refused(dir.path());
        assert!(err.contains("not this exporter's manifest"), "{err}");
        let dir = folder(&[(MANIFEST_FILE, "[1, 2]")]);
        refused(dir.path());
        let dir = folder(&[(MANIFEST_FILE, "not json")]);
        assert!(refused(dir.path()).contains("is not JSON"));
        let dir = folder(&[("notes.txt", "notes")]);
        assert!(refused(dir.path()).contains("no m2r2_export.json"));
        // a real manifest beside the user's files: the first foreign entry is named
        let dir = folder(&[
            (MANIFEST_FILE, MANIFEST),
            ("model.onnx", ""),
            ("notes.txt", "notes"),
            ("b.onnx", ""),
        ]);
        let err = refused(dir.path());
        assert!(
            err.contains("the file b.onnx, which an export does not write"),
            "{err}"
        );
        // a folder under a file's name is no export's
        let dir = folder(&[(MANIFEST_FILE, MANIFEST)]);
        std::fs::create_dir(dir.path().join("model.onnx")).unwrap();
        assert!(refused(dir.path()).contains("the folder model.onnx"));
    }

    #[test]
    fn feed_needs_draft_and_verifier() {
        use GraphKind::*;
        let err = check_feed(&[Feed]).unwrap_err().to_string();
        assert!(
            err.contains("feed without draft and verifier") && err.contains("add draft,verifier"),
            "{err}"
        );
        let err = check_feed(&[Model, Draft, Feed]).unwrap_err().to_string();
        assert!(
            err.contains("add verifier to --graphs, or drop feed"),
            "{err}"
        );
        check_feed(&[Draft, Verifier, Feed]).unwrap();
        check_feed(&[Model]).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_link_resolves_to_its_folder_and_a_dangling_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let canonical = std::fs::canonicalize(&target).unwrap();
        assert_eq!(resolve_link(&link).unwrap(), canonical);
        assert_eq!(resolve_link(&dir.path().join("link/")).unwrap(), canonical);
        assert_eq!(resolve_link(&target).unwrap(), target);
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).unwrap();
        let err = resolve_link(&dangling).unwrap_err().to_string();
        assert!(
            err.contains("is a symbolic link to") && err.contains("gone"),
            "{err}"
        );
    }
}
