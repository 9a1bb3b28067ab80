//! ONNX Runtime fuses the exported RMSNorm (`Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul`) into
//! `SimplifiedLayerNormalization` nodes, in every graph and at both ReduceMean forms (axes as an
//! attribute up to opset 17, as an input from opset 18). The oracle is ONNX Runtime's own optimiser:
//! the test reads back the graph it saved after optimisation. On a GPU a decode step costs about
//! one kernel launch per node, so the fusion is what cuts model.onnx from 64 to 50 nodes a layer
//! (docs/GPU.md); a change to the emitter that breaks the pattern fails here, not silently there.

use export::folder::{ExportRequest, export};
use export::graphs::{ExportOptions, GraphKind};
use export::write::read_graph;
use onnx_runner::ep::EpConfig;
use onnx_runner::session::OnnxSession;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// How many nodes of `op_type` the graph of `path` has (any domain).
fn count(path: &Path, op_type: &str) -> usize {
    let model = read_graph(path).expect("the graph decodes");
    let graph = model.graph.expect("a model has a graph");
    graph
        .node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some(op_type))
        .count()
}

fn export_tiny(opset: i64, dir: &Path) {
    let loaded = reference::io::load::load_model("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &loaded.model.config).unwrap();
    let request = ExportRequest {
        model: &loaded.model,
        tokenizer: None,
        m2r2: &weights,
        options: ExportOptions {
            model_name: "tiny".into(),
            opset,
            weights_dtype: export::builder::WeightsDtype::F32,
            draft_gate: weights.config.draft_gate,
            static_cache: None,
            merge_adapters: false,
        },
        graphs: GraphKind::ALL.to_vec(),
        external_data: false,
    };
    export(&request, dir, &mut |_| {}).expect("the export succeeds");
}

#[test]
fn onnx_runtime_fuses_every_exported_rms_norm() {
    for opset in [17, 18] {
        let dir = tempfile::tempdir().unwrap();
        export_tiny(opset, dir.path());
        for kind in GraphKind::ALL {
            let file = dir.path().join(format!("{}.onnx", kind.name()));
            let norms = count(&file, "Pow");
            assert!(norms > 0, "{}: no RMSNorm emitted", file.display());
            assert_eq!(count(&file, "ReduceMean"), norms, "{}", file.display());

            let optimized = dir.path().join(format!("{}.optimized.onnx", kind.name()));
            let ep = EpConfig {
                optimized_model: Some(optimized.clone()),
                ..EpConfig::cpu()
            };
            OnnxSession::load(&file, &ep).expect("the graph loads");
            let fused = count(&optimized, "SimplifiedLayerNormalization")
                + count(&optimized, "SkipSimplifiedLayerNormalization");
            // Every norm is fused, or merged with an identical one first (layer 0's slow and fast
            // streams normalise the same embeddings with the same weight: common subexpression
            // elimination keeps one), so none is left unfused.
            assert!(
                fused > 0 && fused <= norms,
                "opset {opset}, {}: {norms} norms exported, {fused} fused",
                kind.name()
            );
            assert_eq!(count(&optimized, "Pow"), 0, "opset {opset} {}", kind.name());
            assert_eq!(
                count(&optimized, "ReduceMean"),
                0,
                "opset {opset} {}",
                kind.name()
            );
        }
    }
}
