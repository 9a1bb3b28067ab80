//! `export --static-cache L` (docs/STATIC.md): the four written graphs are standard opset 24
//! (`Attention` in the form TensorRT's parser takes), model.onnx with at most 20 nodes per decoder
//! layer on average (dense models) and fixed `[B, Hkv, L, Dh]` buffers in and out; they pass
//! onnx.checker with strict shape inference, and `check_folder` (`--check`) passes on them; the
//! manifest records `static_cache`; bad lengths are clear errors.

mod common;

use export::builder::{STATIC_OPSET, WeightsDtype};
use export::check::{Comparison, MERGED_F16_TOLERANCE, TOLERANCE, check_folder, probe_tokens};
use export::folder::{ExportRequest, MANIFEST_FILE, export};
use export::graphs::{ExportOptions, GraphKind};
use export::proto::ModelProto;
use export::proto::type_proto;
use export::write::read_graph;
use reference::base::model::Model;
use reference::m2r2::weights::M2r2Weights;
use std::collections::BTreeMap;
use std::path::Path;

fn options(l_max: usize, dtype: WeightsDtype) -> ExportOptions {
    ExportOptions {
        model_name: "test".into(),
        opset: 17,
        weights_dtype: dtype,
        draft_gate: 1,
        static_cache: Some(l_max),
        merge_adapters: false,
    }
}

fn write(
    model: &Model,
    m2r2: &M2r2Weights,
    options: ExportOptions,
    graphs: &[GraphKind],
    out: &Path,
) -> export::Result<()> {
    let request = ExportRequest {
        model,
        tokenizer: None,
        m2r2,
        options,
        graphs: graphs.to_vec(),
        external_data: false,
    };
    export(&request, out, &mut |_| {}).map(|_| ())
}

fn builtin(name: &str) -> (Model, M2r2Weights) {
    let model = reference::io::builtin::builtin(name).unwrap();
    let m2r2 = M2r2Weights::builtin_for(name, &model.config).unwrap();
    (model, m2r2)
}

/// `check_folder` (`--check`) on all four graphs of `out`, the probe split in half: every row
/// within its tolerance (`label` names the case in the failure). Returns the rows.
fn check_all(label: &str, out: &Path, model: &Model, m2r2: &M2r2Weights) -> Vec<Comparison> {
    let tokens = probe_tokens(model, None).unwrap();
    let rows = check_folder(
        out,
        model,
        m2r2,
        1,
        &GraphKind::ALL,
        &tokens,
        tokens.len() / 2,
    )
    .unwrap();
    let bad: Vec<_> = rows.iter().filter(|r| !r.ok()).collect();
    assert!(bad.is_empty(), "{label}: {bad:?}");
    rows
}

/// op type -> count
fn ops(model: &ModelProto) -> BTreeMap<String, usize> {
    let mut ops = BTreeMap::new();
    for n in &model.graph.as_ref().unwrap().node {
        *ops.entry(n.op_type.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    ops
}

/// Standard domain only, opset 24, an IR version ONNX Runtime 1.31 reads, `Attention` without
/// past inputs or present outputs.
fn check_standard(name: &str, path: &Path) -> ModelProto {
    let proto = read_graph(path).unwrap();
    assert!(
        proto.ir_version.unwrap() <= 13,
        "{name}: ORT 1.31 reads IR <= 13"
    );
    assert_eq!(proto.opset_import.len(), 1, "{name}: one opset import");
    let opset = &proto.opset_import[0];
    assert_eq!(opset.domain.as_deref().unwrap_or(""), "", "{name}");
    assert_eq!(opset.version, Some(STATIC_OPSET), "{name}");
    let graph = proto.graph.as_ref().unwrap();
    for node in &graph.node {
        assert_eq!(
            node.domain.as_deref().unwrap_or(""),
            "",
            "{name}: node {:?} outside the standard domain",
            node.name
        );
        // the form TensorRT's parser takes: 4-D Q, K, V and mask, no past inputs or presents
        if node.op_type.as_deref() == Some("Attention") {
            assert_eq!(node.input.len(), 4, "{name}: {:?}", node.name);
            assert_eq!(node.output.len(), 1, "{name}: {:?}", node.name);
        }
    }
    proto
}

/// [`check_standard`], the LLM operators once or twice per layer, and the buffers' fixed shape.
/// Returns nodes per decoder layer.
fn check_written(name: &str, path: &Path, model: &Model, l_max: usize) -> f64 {
    let proto = check_standard(name, path);
    let n = model.config.num_hidden_layers;
    let graph = proto.graph.as_ref().unwrap();
    let ops = ops(&proto);
    let count = |op: &str| ops.get(op).copied().unwrap_or(0);
    assert_eq!(count("RMSNormalization"), 2 * n + 1, "{name}: {ops:?}");
    assert_eq!(count("RotaryEmbedding"), 2 * n, "{name}: {ops:?}");
    assert_eq!(count("TensorScatter"), 2 * n, "{name}: {ops:?}");
    assert_eq!(count("Attention"), n, "{name}: {ops:?}");
    for node in graph
        .node
        .iter()
        .filter(|x| x.op_type.as_deref() == Some("Attention"))
    {
        assert_eq!(node.input.len(), 4, "{name}: Q, K, V and attn_mask");
        assert!(
            !node
                .attribute
                .iter()
                .any(|a| a.name.as_deref() == Some("is_causal")),
            "{name}: the mask is explicit (is_causal aligns to the upper left)"
        );
    }
    // the buffers: fixed [batch, Hkv, L, Dh] in and out
    let c = &model.config;
    let dims = |v: &export::proto::ValueInfoProto| -> Vec<Option<i64>> {
        let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref().unwrap().value.as_ref()
        else {
            panic!("a tensor")
        };
        t.shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| match d.value {
                Some(export::proto::tensor_shape_proto::dimension::Value::DimValue(v)) => Some(v),
                _ => None,
            })
            .collect()
    };
    let buffer = vec![
        None,
        Some(c.num_key_value_heads as i64),
        Some(l_max as i64),
        Some(c.head_dim as i64),
    ];
    for l in 0..n {
        for io in [&graph.input, &graph.output] {
            for v in io.iter().filter(|v| {
                let name = v.name.as_deref().unwrap();
                name.starts_with(&format!("past_key_values.{l}."))
                    || name.starts_with(&format!("present.{l}."))
            }) {
                assert_eq!(dims(v), buffer, "{name}: {:?}", v.name);
            }
        }
    }
    let inputs: Vec<&str> = graph
        .input
        .iter()
        .map(|v| v.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        &inputs[..4],
        ["input_ids", "position_ids", "attn_mask", "write_indices"]
    );
    assert_eq!(inputs.len(), 4 + 2 * n);
    let per_layer = graph.node.len() as f64 / n as f64;
    eprintln!(
        "{name}: {} nodes, {per_layer:.2} per decoder layer; {ops:?}",
        graph.node.len()
    );
    per_layer
}

#[test]
fn tiny_static_graph_is_standard_opset_24_within_20_nodes_per_layer() {
    let dir = tempfile::tempdir().unwrap();
    let (model, m2r2) = builtin("tiny");
    let out = dir.path().join("tiny");
    write(
        &model,
        &m2r2,
        options(48, WeightsDtype::F32),
        &GraphKind::ALL,
        &out,
    )
    .unwrap();
    let per_layer = check_written("tiny", &out.join("model.onnx"), &model, 48);
    assert!(per_layer <= 20.0, "tiny: {per_layer:.2} nodes per layer");

    for kind in [GraphKind::Draft, GraphKind::Verifier, GraphKind::Feed] {
        check_standard(kind.name(), &out.join(kind.file_name()));
    }

    // the manifest says every graph is static; no genai_config.json
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert_eq!(manifest["static_cache"]["l_max"], 48);
    assert_eq!(manifest["static_cache"]["opset"], 24);
    assert_eq!(
        manifest["static_cache"]["graphs"],
        serde_json::json!(["model", "draft", "verifier", "feed"])
    );
    assert!(!out.join("genai_config.json").exists());
    let opened = onnx_runner::manifest::ExportDir::open(&out).unwrap();
    for kind in [
        onnx_runner::manifest::GraphKind::Model,
        onnx_runner::manifest::GraphKind::Draft,
        onnx_runner::manifest::GraphKind::Verifier,
        onnx_runner::manifest::GraphKind::Feed,
    ] {
        assert_eq!(opened.static_l_max(kind), Some(48), "{kind:?}");
    }

    // --check: the static model.onnx step by step through the runner, the others chunk by chunk
    // with their buffers fed as inputs; draft and feed -> verifier against model.onnx
    let tokens = probe_tokens(&model, None).unwrap();
    let rows = check_all("tiny", &out, &model, &m2r2);
    let static_rows = rows
        .iter()
        .filter(|r| r.graph == "model.onnx (static)")
        .count();
    let decode_steps = tokens.len() - tokens.len() / 2;
    assert_eq!(
        static_rows,
        1 + decode_steps + 2 * model.config.num_hidden_layers
    );

    // an old (dynamic) manifest has no static_cache and loads as before
    let plain = dir.path().join("plain");
    let dynamic = ExportOptions {
        static_cache: None,
        merge_adapters: false,
        ..options(48, WeightsDtype::F32)
    };
    write(&model, &m2r2, dynamic, &[GraphKind::Model], &plain).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plain.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert!(manifest.get("static_cache").is_none());
    let opened = onnx_runner::manifest::ExportDir::open(&plain).unwrap();
    assert_eq!(
        opened.static_l_max(onnx_runner::manifest::GraphKind::Model),
        None
    );
}

#[test]
fn smollm2_static_graph_is_within_20_nodes_per_layer() {
    let loaded =
        reference::io::load::load_model("smollm2").expect("run `m2r2 fetch smollm2` first");
    let model = &loaded.model;
    let m2r2 = M2r2Weights::builtin_for("smollm2", &model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let options = ExportOptions {
        draft_gate: m2r2.config.draft_gate,
        ..options(64, WeightsDtype::F32)
    };
    write(model, &m2r2, options, &[GraphKind::Model], &out).unwrap();
    let per_layer = check_written("smollm2", &out.join("model.onnx"), model, 64);
    assert!(per_layer <= 20.0, "smollm2: {per_layer:.2} nodes per layer");
}

/// onnx.checker (full_check) with strict shape inference on the four static graphs: dense f32
/// and f16, MoE.
#[test]
fn static_graphs_pass_onnx_checker() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (i, (name, dtype)) in [
        ("tiny", WeightsDtype::F32),
        ("tiny", WeightsDtype::F16),
        ("tiny-moe", WeightsDtype::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let (model, m2r2) = builtin(name);
        let out = dir.path().join(format!("{i}-{name}"));
        write(&model, &m2r2, options(16, dtype), &GraphKind::ALL, &out).unwrap();
        if name == "tiny-moe" {
            check_written(name, &out.join("model.onnx"), &model, 16);
        }
        paths.extend(GraphKind::ALL.map(|k| out.join(k.file_name())));
    }
    common::onnx_check(&paths);
}

/// `--weights-dtype f16` static graphs run in ONNX Runtime and equal the reference with its
/// weights rounded to f16 (`--check` of all four graphs, as the dynamic f16 test does): dense with
/// a bridge (also with `--merge-adapters`), and MoE with a pruned draft head.
#[test]
fn f16_static_graphs_match_the_reference_with_rounded_weights() {
    let dir = tempfile::tempdir().unwrap();
    for (name, merge_adapters) in [("tiny", false), ("tiny", true), ("tiny-moe", false)] {
        let (model, m2r2) = common::f16_case(name);
        let out = dir.path().join(format!("{name}-{merge_adapters}"));
        let options = ExportOptions {
            merge_adapters,
            ..options(32, WeightsDtype::F16)
        };
        write(&model, &m2r2, options, &GraphKind::ALL, &out).unwrap();
        let (model16, m2r2_16) = export::check::rounded_to_f16(&model, &m2r2);
        let rows = check_all(name, &out, &model16, &m2r2_16);
        for graph in [
            "model.onnx (static)",
            "draft.onnx",
            "verifier.onnx",
            "feed.onnx",
        ] {
            assert!(
                rows.iter().any(|r| r.graph.starts_with(graph)),
                "{name}: {graph} was checked: {:?}",
                rows.iter().map(|r| &r.graph).collect::<Vec<_>>()
            );
        }
        // the merged draft's fast outputs, and only those, have the merged f16 tolerance
        for r in &rows {
            let fast = r.graph == "draft.onnx"
                && ["draft_logits", "exit_prob", "exit_states"]
                    .iter()
                    .any(|t| r.tensor.starts_with(t));
            let want = match fast && merge_adapters {
                true => MERGED_F16_TOLERANCE,
                false => TOLERANCE,
            };
            assert_eq!(r.tolerance, want, "{name} merged {merge_adapters}: {r:?}");
        }
        if merge_adapters {
            // the looser rows are there, and the strict tolerance would refuse one of them
            let fast_rows: Vec<_> = rows.iter().filter(|r| r.tolerance != TOLERANCE).collect();
            assert!(fast_rows.len() >= 4, "{rows:?}");
            assert!(
                fast_rows
                    .iter()
                    .any(|r| r.max_abs_diff > TOLERANCE * r.max_abs_ref.max(1.0)),
                "{fast_rows:?}"
            );
        }
    }
}

#[test]
fn clear_errors_for_static_lengths_and_graphs() {
    let dir = tempfile::tempdir().unwrap();
    let (model, m2r2) = builtin("tiny");
    let context = model.config.max_position_embeddings;
    let run = |options: ExportOptions, graphs: &[GraphKind]| {
        write(&model, &m2r2, options, graphs, &dir.path().join("x"))
            .unwrap_err()
            .to_string()
    };
    let err = run(options(0, WeightsDtype::F32), &GraphKind::ALL);
    assert!(err.contains("--static-cache 0"), "{err}");
    let err = run(options(context + 1, WeightsDtype::F32), &GraphKind::ALL);
    assert!(
        err.contains(&format!("1..={context}")) && err.contains("max_position_embeddings"),
        "{err}"
    );
    assert!(!dir.path().join("x").exists(), "nothing written");
}

/// `--merge-adapters`: the static draft.onnx with the adapters merged and the streams stacked is
/// standard opset 24, has at most 30 nodes per draft layer on average (against about 80 in the
/// adapter form) plus its heads, passes `--check` against the reference and onnx.checker (f32 and
/// f16), and the manifest says so; without `--static-cache`, or with a mixture-of-experts layer
/// below the draft gate, it is refused by name before anything is written.
#[test]
fn merged_adapters_draft_is_a_third_of_the_nodes_and_checks() {
    let dir = tempfile::tempdir().unwrap();
    let (model, m2r2) = builtin("tiny");
    let merged = |dtype| ExportOptions {
        merge_adapters: true,
        ..options(32, dtype)
    };
    let e = m2r2.config.gate_layer(1);
    let nodes = |path: &Path| ops(&read_graph(path).unwrap()).values().sum::<usize>();
    let mut paths = Vec::new();
    for (name, dtype) in [("f32", WeightsDtype::F32), ("f16", WeightsDtype::F16)] {
        let out = dir.path().join(name);
        write(&model, &m2r2, merged(dtype), &GraphKind::ALL, &out).unwrap();
        let draft = check_standard("merged draft", &out.join("draft.onnx"));
        let per_layer = draft.graph.as_ref().unwrap().node.len() as f64 / e as f64;
        paths.push(out.join("draft.onnx"));
        if dtype == WeightsDtype::F16 {
            continue;
        }
        let plain = dir.path().join("plain");
        write(
            &model,
            &m2r2,
            options(32, dtype),
            &[GraphKind::Draft],
            &plain,
        )
        .unwrap();
        let (merged_nodes, plain_nodes) = (
            nodes(&out.join("draft.onnx")),
            nodes(&plain.join("draft.onnx")),
        );
        assert!(
            (merged_nodes as f64) < 0.6 * plain_nodes as f64 && per_layer <= 30.0 + 60.0 / e as f64,
            "merged draft: {merged_nodes} nodes ({per_layer:.1} per layer), adapter form {plain_nodes}"
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(MANIFEST_FILE)).unwrap()).unwrap();
        assert_eq!(manifest["static_cache"]["merged_adapters"], true);
        let rows = check_all("merged", &out, &model, &m2r2);
        assert!(
            rows.iter().any(|r| r.graph == "draft.onnx"),
            "the draft was checked"
        );
    }
    common::onnx_check(&paths);

    let refused = |model: &Model, m2r2: &M2r2Weights, options: ExportOptions| {
        let out = dir.path().join("refused");
        let err = write(model, m2r2, options, &GraphKind::ALL, &out)
            .unwrap_err()
            .to_string();
        assert!(!out.exists(), "nothing written: {err}");
        err
    };
    let dynamic = ExportOptions {
        static_cache: None,
        ..merged(WeightsDtype::F32)
    };
    let err = refused(&model, &m2r2, dynamic);
    assert!(
        err.contains("--merge-adapters") && err.contains("--static-cache"),
        "{err}"
    );
    let (moe, moe_m2r2) = builtin("tiny-moe");
    let err = refused(&moe, &moe_m2r2, merged(WeightsDtype::F32));
    assert!(
        err.contains("--merge-adapters") && err.contains("mixture of experts"),
        "{err}"
    );
}
