//! OnnxSession on a tiny hand-made graph (tests/fixtures/affine.onnx, written by make_affine.py):
//! outputs against hand-computed values, input checks naming the file and tensor, and fail-fast
//! execution providers on a CPU-only ONNX Runtime.

use ndarray::{ArrayD, IxDyn, array};
use onnx_runner::ep::{Ep, EpConfig};
use onnx_runner::session::{DType, Dim, Input, OnnxSession};
use onnx_runner::{Error, runtime};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/affine.onnx")
}

fn load() -> OnnxSession {
    OnnxSession::load(&fixture(), &EpConfig::cpu()).expect("the fixture loads on the CPU")
}

#[test]
fn runtime_reports_its_version_and_is_idempotent() {
    let first = runtime::init().unwrap();
    let again = runtime::init().unwrap();
    assert!(std::ptr::eq(first, again));
    // api-30 bindings: ONNX Runtime 1.30 or newer
    let minor: u32 = first.version.split('.').nth(1).unwrap().parse().unwrap();
    assert!(first.version.starts_with("1.") && minor >= 30, "{first:?}");
    assert!(first.path.is_file(), "{first:?}");
}

#[test]
fn describes_inputs_and_outputs() {
    let s = load();
    let names: Vec<_> = s.inputs().iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["x", "ids"]);
    assert_eq!(s.inputs()[0].dtype, DType::F32);
    assert_eq!(
        s.inputs()[0].dims,
        [Dim::Symbolic("batch".into()), Dim::Fixed(3)]
    );
    assert_eq!(s.inputs()[1].dtype, DType::I64);
    let outs: Vec<_> = s.outputs().iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outs, ["y", "ids_f"]);
    assert_eq!(s.ep_used(), Ep::Cpu);
    assert_eq!(
        s.metadata("m2r2.graph").unwrap().as_deref(),
        Some("fixture")
    );
}

#[test]
fn runs_against_hand_computed_values() {
    let mut s = load();
    let x = array![[1.0f32, 0.0, -1.0], [0.5, 2.0, 1.0]].into_dyn();
    let ids = array![[3i64, -7, 0, 12]].into_dyn();
    // x @ [[1,2],[3,4],[5,6]] + [0.5, -1]:
    // row 0: [1 - 5, 2 - 6] + c = [-3.5, -5];  row 1: [0.5 + 6 + 5, 1 + 8 + 6] + c = [12, 14]
    let out = s
        .run(&[("x", Input::F32(x.view())), ("ids", Input::I64(ids.view()))])
        .unwrap();
    let y = out.get("y").unwrap();
    assert_eq!(y, &array![[-3.5f32, -5.0], [12.0, 14.0]].into_dyn());
    assert_eq!(
        out.get("ids_f").unwrap(),
        &array![[3.0f32, -7.0, 0.0, 12.0]].into_dyn()
    );
    // a transposed (non-contiguous) view is made contiguous first
    let xt = array![[1.0f32, 0.5], [0.0, 2.0], [-1.0, 1.0]];
    let out = s
        .run(&[
            ("x", Input::F32(xt.t().into_dyn())),
            ("ids", Input::I64(ids.view())),
        ])
        .unwrap();
    assert_eq!(out.get("y").unwrap(), y);
    // an empty batch is fine
    let empty = ArrayD::<f32>::zeros(IxDyn(&[0, 3]));
    let no_ids = ArrayD::<i64>::zeros(IxDyn(&[0, 0]));
    let out = s
        .run(&[
            ("x", Input::F32(empty.view())),
            ("ids", Input::I64(no_ids.view())),
        ])
        .unwrap();
    assert_eq!(out.get("y").unwrap().shape(), [0, 2]);
}

#[test]
fn bad_inputs_name_the_file_and_tensor() {
    let mut s = load();
    let x = array![[1.0f32, 2.0, 3.0]].into_dyn();
    let ids = array![[1i64]].into_dyn();
    let file = fixture().display().to_string();
    let message = |r: onnx_runner::Result<_>| match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };

    let e = message(s.run(&[("x", Input::F32(x.view()))]));
    assert!(
        e.contains(&file) && e.contains("input `ids` was not given"),
        "{e}"
    );

    let e = message(s.run(&[
        ("x", Input::F32(x.view())),
        ("ids", Input::I64(ids.view())),
        ("z", Input::F32(x.view())),
    ]));
    assert!(e.contains("no input `z`") && e.contains("x, ids"), "{e}");

    let e = message(s.run(&[
        ("x", Input::I64(ids.view())),
        ("ids", Input::I64(ids.view())),
    ]));
    assert!(
        e.contains("`x` is i64") && e.contains("f32 [batch, 3]"),
        "{e}"
    );

    let wide = array![[1.0f32, 2.0, 3.0, 4.0]].into_dyn();
    let e = message(s.run(&[
        ("x", Input::F32(wide.view())),
        ("ids", Input::I64(ids.view())),
    ]));
    assert!(e.contains("`x` has shape [1, 4]"), "{e}");

    let flat = array![1i64, 2].into_dyn();
    let e = message(s.run(&[
        ("x", Input::F32(x.view())),
        ("ids", Input::I64(flat.view())),
    ]));
    assert!(
        e.contains("`ids` has shape [2]") && e.contains("[batch, sequence_length]"),
        "{e}"
    );

    let out = s
        .run(&[("x", Input::F32(x.view())), ("ids", Input::I64(ids.view()))])
        .unwrap();
    let e = out.get("logits").unwrap_err().to_string();
    assert!(
        e.contains(&file) && e.contains("output `logits` is missing") && e.contains("y, ids_f"),
        "{e}"
    );
}

#[test]
fn a_missing_graph_is_a_clear_error() {
    let e =
        OnnxSession::load(&fixture().with_file_name("nope.onnx"), &EpConfig::cpu()).unwrap_err();
    assert!(
        e.to_string().contains("nope.onnx: no such graph file"),
        "{e}"
    );
}

/// On a CPU-only ONNX Runtime (the PyPI `onnxruntime` wheel), asking for a GPU provider fails with
/// the provider's own reason; with fallback the session runs on the CPU and says so.
#[test]
fn gpu_providers_fail_fast_on_a_cpu_build() {
    for ep in [Ep::Cuda, Ep::TensorRt] {
        if onnx_runner::ep::compiled_in(ep).unwrap() {
            eprintln!("skipping the fail-fast check of {ep}: this ONNX Runtime has it compiled in");
            continue;
        }
        let err = OnnxSession::load(&fixture(), &EpConfig::new(ep)).unwrap_err();
        let Error::ExecutionProvider {
            ep: name, reason, ..
        } = &err
        else {
            panic!("expected an execution provider error, got {err}");
        };
        assert_eq!(*name, ep.name());
        let provider = if ep == Ep::Cuda { "CUDA" } else { "TensorRT" };
        assert!(
            reason.contains(&format!(
                "{provider} execution provider is not enabled in this build"
            )),
            "{err}"
        );
        assert!(err.to_string().contains("--ep-fallback"), "{err}");

        let config = EpConfig {
            fallback: true,
            ..EpConfig::new(ep)
        };
        let mut s = OnnxSession::load(&fixture(), &config).unwrap();
        assert_eq!(s.ep_used(), Ep::Cpu);
        let x = array![[0.0f32, 0.0, 0.0]].into_dyn();
        let ids = array![[1i64]].into_dyn();
        let out = s
            .run(&[("x", Input::F32(x.view())), ("ids", Input::I64(ids.view()))])
            .unwrap();
        assert_eq!(out.get("y").unwrap(), &array![[0.5f32, -1.0]].into_dyn());
    }
}

/// CUDA graphs asked for by name (`cuda_graph: Some(true)`) are not dropped when `fallback` puts
/// the graph on the CPU, which has none: the load fails naming why; left to the default, the
/// session falls back (and its warning says the graphs are off).
#[test]
fn cuda_graphs_asked_for_are_not_dropped_by_a_fallback() {
    if onnx_runner::ep::compiled_in(Ep::Cuda).unwrap() {
        eprintln!("skipping: this ONNX Runtime has the CUDA provider compiled in");
        return;
    }
    let config = |cuda_graph| EpConfig {
        fallback: true,
        cuda_graph,
        ..EpConfig::new(Ep::Cuda)
    };
    let err = OnnxSession::load_with_cuda_graph(&fixture(), &config(Some(true)), true).unwrap_err();
    let Error::CudaGraph { file, reason } = &err else {
        panic!("expected a CUDA graph error, got {err}");
    };
    assert_eq!(*file, fixture().display().to_string());
    assert!(
        reason.contains("CUDA graphs need the CUDA execution provider, which is not available")
            && reason.contains("CUDA execution provider is not enabled in this build"),
        "{err}"
    );
    let s = OnnxSession::load_with_cuda_graph(&fixture(), &config(None), true).unwrap();
    assert_eq!(s.ep_used(), Ep::Cpu);
}
