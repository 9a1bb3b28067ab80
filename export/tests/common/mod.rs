//! Helpers shared by the exporter's tests: random inputs, running a one-off graph under ONNX
//! Runtime, the Python checker, and max-abs-diff comparisons that print before asserting.

#![allow(dead_code)]

use export::builder::{Dim, Elem, GraphBuilder, WeightsDtype};
use export::proto::ModelProto;
use export::write::write_graph;
use ndarray::{ArrayD, IxDyn};
use onnx_runner::ep::EpConfig;
use onnx_runner::session::{Input, OnnxSession, Outputs};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::weights::M2r2Weights;
use std::path::{Path, PathBuf};

/// Seeded `N(0, std^2)` tensor.
pub fn random(shape: &[usize], std: f32, seed: u64) -> ArrayD<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        std * reference::io::builtin::standard_normal(&mut rng)
    })
}

/// A builder for a one-off module graph at the default opset, f32 weights.
pub fn builder(name: &str) -> GraphBuilder {
    GraphBuilder::new(name, 17, WeightsDtype::F32)
}

/// Declare `[1, T, X]` input / output dims.
pub fn rows_dims(x: usize) -> Vec<Dim> {
    vec![
        Dim::Named("batch"),
        Dim::Named("sequence_length"),
        Dim::Fixed(x),
    ]
}

/// Write `model` into `dir`, load it in ONNX Runtime (CPU) and run it.
pub fn run_graph(dir: &Path, model: ModelProto, inputs: &[(&str, Input<'_>)]) -> Outputs {
    onnx_runner::runtime::init()
        .expect("ONNX Runtime (set ORT_DYLIB_PATH or run `m2r2 fetch onnxruntime`)");
    let name = model
        .graph
        .as_ref()
        .and_then(|g| g.name.clone())
        .unwrap_or_else(|| "graph".into());
    let path = dir.join(format!("{name}.onnx"));
    write_graph(model, &path, false).expect("write graph");
    let mut session = OnnxSession::load(&path, &EpConfig::cpu()).expect("load graph");
    session.run(inputs).expect("run graph")
}

/// Declare an f32 graph output.
pub fn output(b: &mut GraphBuilder, name: &str, value: &str, dims: &[Dim]) {
    b.output(name, value, Elem::F32, dims);
}

/// Max |a - b| (infinite on a shape mismatch), printed with a label.
pub fn max_diff(label: &str, a: &ArrayD<f32>, b: &ArrayD<f32>) -> f32 {
    let d = if a.shape() == b.shape() {
        a.iter()
            .zip(b.iter())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    } else {
        f32::INFINITY
    };
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    println!("{label}: max |onnx - reference| = {d:.3e} (max |reference| = {scale:.3})");
    d
}

/// The interpreter with the `onnx` package (`M2R2_PYTHON`, set by scripts/test.sh).
pub fn python() -> PathBuf {
    match std::env::var_os("M2R2_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "M2R2_PYTHON is not set: the onnx.checker tests need a Python with onnx==1.23.2 \
             (scripts/test.sh sets it up; by hand: python3 -m venv V && V/bin/pip install -r \
             scripts/onnx-check/requirements.txt && export M2R2_PYTHON=V/bin/python)"
        ),
    }
}

/// Run onnx.checker (full_check) and strict shape inference on every graph; panic with the
/// checker's message on failure.
pub fn onnx_check(paths: &[PathBuf]) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/onnx-check/check_graphs.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .args(paths)
        .output()
        .expect("run the Python checker");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "onnx.checker rejected a graph: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The built-in `name`'s M2R2 weights as the f16 tests export them: tiny-moe with a pruned draft
/// head (its `draft_head.weight` is f16 too), tiny with a bridge (its maps are f16 initializers).
pub fn f16_case(name: &str) -> (reference::base::model::Model, M2r2Weights) {
    let model = reference::io::builtin::builtin(name).unwrap();
    let mut m2r2 = M2r2Weights::builtin_for(name, &model.config).unwrap();
    if name == "tiny-moe" {
        m2r2.draft_head =
            Some(DraftHead::new(vec![1, 2, 3, 50, 99], model.config.vocab_size, "t").unwrap());
    } else {
        let config = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
        m2r2 = m2r2.with_bridge(&model.config, config, 9, 0.3).unwrap();
    }
    (model, m2r2)
}
