//! The written files: onnx.checker (full_check) and strict shape inference on every graph and
//! flavour, protobuf round trips (inline and external data), and the export folder's rules (manifest
//! last, no half-written folder, clear errors).

mod common;

use export::builder::WeightsDtype;
use export::check::check_folder;
use export::emit::model::DRAFT_HEAD_WEIGHT;
use export::folder::{ExportRequest, MANIFEST_FILE, export};
use export::graphs::{ExportOptions, GraphKind, build};
use export::write::{read_graph, write_graph, write_graph_limited};
use reference::base::model::Model;
use reference::m2r2::draft_head::{DRAFT_HEAD_FILE, DraftHead};
use reference::m2r2::weights::M2r2Weights;
use std::path::{Path, PathBuf};

fn options(opset: i64, dtype: WeightsDtype) -> ExportOptions {
    ExportOptions {
        model_name: "test".into(),
        opset,
        weights_dtype: dtype,
        draft_gate: 1,
        static_cache: None,
        merge_adapters: false,
    }
}

fn request<'a>(
    model: &'a Model,
    m2r2: &'a M2r2Weights,
    options: ExportOptions,
    external: bool,
) -> ExportRequest<'a> {
    ExportRequest {
        model,
        tokenizer: None,
        m2r2,
        options,
        graphs: GraphKind::ALL.to_vec(),
        external_data: external,
    }
}

fn builtin(name: &str) -> (Model, M2r2Weights) {
    let model = reference::io::builtin::builtin(name).unwrap();
    let m2r2 = M2r2Weights::builtin_for(name, &model.config).unwrap();
    (model, m2r2)
}

fn pruned_head(model: &Model) -> DraftHead {
    DraftHead::new(vec![0, 7, 8, 100, 255], model.config.vocab_size, "test").unwrap()
}

fn graph_paths(dir: &Path) -> Vec<PathBuf> {
    GraphKind::ALL
        .iter()
        .map(|k| dir.join(k.file_name()))
        .collect()
}

#[test]
fn every_graph_and_flavour_passes_onnx_checker() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    let flavours = [
        ("tiny", 17, WeightsDtype::F32, false),
        ("tiny-moe", 17, WeightsDtype::F32, false),
        ("tiny", 17, WeightsDtype::F16, false),
        ("tiny-moe", 17, WeightsDtype::F16, true),
        ("tiny", 17, WeightsDtype::F32, true),
        ("tiny", 21, WeightsDtype::F32, false),
    ];
    for (i, (name, opset, dtype, external)) in flavours.into_iter().enumerate() {
        let (model, mut m2r2) = builtin(name);
        if i % 2 == 0 {
            // a pruned draft head: draft_logits [batch, seq, K] from `draft_head.weight`
            m2r2.draft_head = Some(pruned_head(&model));
        }
        let out = dir.path().join(format!("{i}-{name}"));
        export(
            &request(&model, &m2r2, options(opset, dtype), external),
            &out,
            &mut |_| {},
        )
        .unwrap();
        paths.extend(graph_paths(&out));
    }
    common::onnx_check(&paths);
}

#[test]
fn round_trip_decodes_to_what_was_built() {
    let (model, m2r2) = builtin("tiny-moe");
    let dir = tempfile::tempdir().unwrap();
    for kind in GraphKind::ALL {
        let built = build(kind, &model, &m2r2, &options(17, WeightsDtype::F32)).unwrap();
        // inline: the file decodes to exactly the built model
        let path = dir.path().join(kind.file_name());
        write_graph(built.clone(), &path, false).unwrap();
        assert_eq!(read_graph(&path).unwrap(), built, "{kind:?} inline");
        // external data: the file decodes to the written model, and each external initializer's
        // bytes at its offset are the built raw data
        let ext = dir.path().join(format!("ext-{}", kind.file_name()));
        let written = write_graph(built.clone(), &ext, true).unwrap();
        let decoded = read_graph(&ext).unwrap();
        assert_eq!(decoded, written.proto, "{kind:?} external");
        let data = std::fs::read(ext.with_file_name(written.external.unwrap())).unwrap();
        let built_graph = built.graph.as_ref().unwrap();
        let mut moved = 0;
        for (t, orig) in decoded
            .graph
            .unwrap()
            .initializer
            .iter()
            .zip(&built_graph.initializer)
        {
            assert_eq!(t.name, orig.name);
            if t.external_data.is_empty() {
                assert_eq!(t.raw_data, orig.raw_data);
                continue;
            }
            let field = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key.as_deref() == Some(k))
                    .and_then(|e| e.value.as_ref()?.parse::<usize>().ok())
                    .unwrap()
            };
            let (offset, length) = (field("offset"), field("length"));
            assert_eq!(offset % 4096, 0);
            assert_eq!(
                &data[offset..offset + length],
                orig.raw_data.as_deref().unwrap()
            );
            moved += 1;
        }
        assert!(moved > 0, "{kind:?}: weights moved to the external file");
    }
}

#[test]
fn external_data_runs_like_inline() {
    let (model, m2r2) = builtin("tiny");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ext");
    export(
        &request(&model, &m2r2, options(17, WeightsDtype::F32), true),
        &out,
        &mut |_| {},
    )
    .unwrap();
    assert!(out.join("model.onnx.data").is_file());
    let rows = check_folder(&out, &model, &m2r2, 1, &GraphKind::ALL, &[1, 2, 3, 4, 5], 2).unwrap();
    assert!(rows.iter().all(|r| r.ok()), "{rows:#?}");
}

#[test]
fn manifest_follows_the_contract() {
    let (model, m2r2) = builtin("tiny");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    export(
        &request(&model, &m2r2, options(17, WeightsDtype::F16), false),
        &out,
        &mut |_| {},
    )
    .unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert_eq!(m["format_version"], 1);
    assert_eq!(m["model_name"], "test");
    assert_eq!(m["draft_gate"], 1);
    assert_eq!(m["draft_layers"], m2r2.config.gates[0]);
    assert_eq!(m["has_arla"], true);
    assert_eq!(m["m2r2_hash"], reference::golden::weights_hash(&m2r2));
    assert_eq!(m["opset"], 17);
    assert_eq!(m["weights_dtype"], "f16");
    assert_eq!(m["graphs"]["verifier"], "verifier.onnx");
    assert_eq!(m["config"]["num_hidden_layers"], 8);
    assert_eq!(m["m2r2"]["gates"], serde_json::json!(m2r2.config.gates));
    let g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("genai_config.json")).unwrap()).unwrap();
    assert_eq!(g["model"]["decoder"]["filename"], "model.onnx");
    assert_eq!(g["model"]["decoder"]["num_key_value_heads"], 2);
    // metadata_props of a graph
    let proto = read_graph(&out.join("draft.onnx")).unwrap();
    let meta = |k: &str| {
        proto
            .metadata_props
            .iter()
            .find(|e| e.key.as_deref() == Some(k))
            .and_then(|e| e.value.clone())
    };
    assert_eq!(meta("m2r2.graph").as_deref(), Some("draft"));
    assert_eq!(
        meta("m2r2.layers"),
        Some(format!("0..{}", m2r2.config.gates[0]))
    );
    assert_eq!(meta("m2r2.draft_gate").as_deref(), Some("1"));
    assert_eq!(meta("m2r2.draft_head_tokens").as_deref(), Some("none"));
    assert!(meta("m2r2.config").unwrap().contains("\"hidden_size\":64"));
    assert_eq!(m["draft_head_tokens"], serde_json::Value::Null);
    assert!(!out.join(DRAFT_HEAD_FILE).exists());
}

/// With a pruned draft head: its token ids are copied beside the graphs and named in the manifest;
/// draft.onnx holds `draft_head.weight` `[K, D]` and outputs `draft_logits` `[batch, seq, K]`;
/// the verifier keeps the full head.
#[test]
fn pruned_draft_head_is_recorded() {
    let (model, mut m2r2) = builtin("tiny");
    let head = pruned_head(&model);
    m2r2.draft_head = Some(head.clone());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    export(
        &request(&model, &m2r2, options(17, WeightsDtype::F32), false),
        &out,
        &mut |_| {},
    )
    .unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert_eq!(m["draft_head_tokens"], 5);
    assert_eq!(m["draft_head_file"], DRAFT_HEAD_FILE);
    let path = out.join(DRAFT_HEAD_FILE);
    assert_eq!(
        DraftHead::load(&path, model.config.vocab_size).unwrap(),
        head
    );
    let dims = |kind: GraphKind, name: &str| {
        let proto = read_graph(&out.join(kind.file_name())).unwrap();
        let graph = proto.graph.unwrap();
        let init = graph
            .initializer
            .iter()
            .find(|t| t.name.as_deref() == Some(name));
        init.map(|t| t.dims.clone())
    };
    let d = model.config.hidden_size as i64;
    assert_eq!(dims(GraphKind::Draft, DRAFT_HEAD_WEIGHT), Some(vec![5, d]));
    assert_eq!(dims(GraphKind::Verifier, DRAFT_HEAD_WEIGHT), None);
    assert_eq!(dims(GraphKind::Model, DRAFT_HEAD_WEIGHT), None);
    // ORT runs draft.onnx: draft_logits [1, T, K] within tolerance of the reference's subset logits
    let rows = check_folder(&out, &model, &m2r2, 1, &GraphKind::ALL, &[1, 2, 3, 4, 5], 2).unwrap();
    assert!(rows.iter().all(|r| r.ok()), "{rows:#?}");
}

#[test]
fn refuses_a_foreign_folder_and_leaves_nothing_behind() {
    let (model, m2r2) = builtin("tiny");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("busy");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let err = export(
        &request(&model, &m2r2, options(17, WeightsDtype::F32), false),
        &out,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("not an earlier export"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "no partial folder left");
}

#[test]
fn replaces_an_earlier_export() {
    let (model, m2r2) = builtin("tiny");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let mut req = request(&model, &m2r2, options(17, WeightsDtype::F32), false);
    export(&req, &out, &mut |_| {}).unwrap();
    req.graphs = vec![GraphKind::Model];
    export(&req, &out, &mut |_| {}).unwrap();
    assert!(out.join("model.onnx").is_file());
    assert!(
        !out.join("draft.onnx").exists(),
        "the old folder was replaced, not merged"
    );
}

#[test]
fn clear_errors_for_what_cannot_be_exported() {
    let (model, m2r2) = builtin("tiny");
    let dir = tempfile::tempdir().unwrap();
    let run = |opts: ExportOptions| {
        export(
            &request(&model, &m2r2, opts, false),
            &dir.path().join("x"),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string()
    };
    let err = run(options(13, WeightsDtype::F32));
    assert!(
        err.contains("opset 13 is not supported") && err.contains("17"),
        "{err}"
    );
    let err = run(ExportOptions {
        draft_gate: 9,
        ..options(17, WeightsDtype::F32)
    });
    assert!(err.contains("--draft-gate 9 does not exist"), "{err}");
    let mut odd = model.config.clone();
    odd.head_dim = 15;
    odd.num_attention_heads = 1;
    odd.num_key_value_heads = 1;
    let err = export::graphs::check(
        &Model::new(odd, model.weights.clone()),
        &m2r2,
        &options(17, WeightsDtype::F32),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("head_dim 15 is odd"), "{err}");
    // missing parents are created, but not through a file
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err = export(
        &request(&model, &m2r2, options(17, WeightsDtype::F32), false),
        &file.join("a").join("x"),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!("{} exists and is not a folder", file.display())),
        "{err}"
    );
    assert!(!dir.path().join("x").exists());
}

#[test]
fn external_data_switches_on_above_the_limit() {
    let (model, m2r2) = builtin("tiny");
    let built = build(
        GraphKind::Model,
        &model,
        &m2r2,
        &options(17, WeightsDtype::F32),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("under.onnx");
    let w = write_graph_limited(built.clone(), &small, false, usize::MAX).unwrap();
    assert!(w.external.is_none() && !dir.path().join("under.onnx.data").exists());
    // a limit below the model's size stands in for protobuf's 2 GB
    let big = dir.path().join("over.onnx");
    let w = write_graph_limited(built, &big, false, 100_000).unwrap();
    assert_eq!(w.external.as_deref(), Some("over.onnx.data"));
    assert!(std::fs::metadata(&big).unwrap().len() < 100_000);
}
