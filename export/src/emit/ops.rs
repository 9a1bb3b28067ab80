//! Row-wise operators (reference `ops.rs`) and the linear map (reference `matmul::linear`).

use crate::builder::{Attr, GraphBuilder};

/// RMSNorm over the last axis: `w * (x / sqrt(mean(x^2) + eps))`.
///
/// Emitted as `Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt -> Div(x, .) -> Mul(w)`, the pattern
/// ONNX Runtime's optimiser (level `extended` and above, CPU and CUDA) fuses into one
/// `SimplifiedLayerNormalization` node (`onnx-runner/tests/fusion.rs`): one kernel instead of
/// eight per norm, which matters because a decode step's cost on ONNX Runtime's CUDA provider is
/// mostly per-node overhead (docs/GPU.md). The file keeps standard operators only, so TensorRT and
/// other runtimes read the unfused form. The reference
/// multiplies by `1 / sqrt(..)` after dividing the sum by `D`; the order differs by rounding only
/// (within the exports' tolerance, docs/EQUIVALENCE.md).
///
/// # Shapes
/// - `x`: `[..., D]`, `w`: `[D]` -> `[..., D]`
pub fn rms_norm(b: &mut GraphBuilder, x: &str, w: &str, eps: f32) -> String {
    let two = b.scalar_f32(2.0);
    let sq = b.binary("Pow", x, &two);
    let mean = if b.opset >= 18 {
        // ReduceMean-18 takes the axes as an input
        let axes = b.const_i64(&[-1]);
        b.node(
            "ReduceMean",
            &[&sq, &axes],
            vec![("keepdims", Attr::Int(1))],
        )
    } else {
        b.node(
            "ReduceMean",
            &[&sq],
            vec![("axes", Attr::Ints(vec![-1])), ("keepdims", Attr::Int(1))],
        )
    };
    let eps = b.scalar_f32(eps);
    let var = b.binary("Add", &mean, &eps);
    let root = b.unary("Sqrt", &var);
    let normed = b.binary("Div", x, &root);
    b.binary("Mul", w, &normed)
}

/// SwiGLU gating: `silu(gate) * up` with `silu(x) = x * sigmoid(x)`.
pub fn swiglu(b: &mut GraphBuilder, gate: &str, up: &str) -> String {
    let sig = b.unary("Sigmoid", gate);
    let silu = b.binary("Mul", gate, &sig);
    b.binary("Mul", &silu, up)
}

/// `x W^T (+ bias)` with `W` in the `[out, in]` layout (reference `matmul::linear`).
///
/// # Shapes
/// - `x`: `[..., in]`, `w`: `[out, in]`, `bias`: `[out]` -> `[..., out]`
pub fn linear(b: &mut GraphBuilder, x: &str, w: &str, bias: Option<&str>) -> String {
    let wt = b.transposed(w);
    let y = b.binary("MatMul", x, &wt);
    match bias {
        Some(bias) => b.binary("Add", &y, bias),
        None => y,
    }
}

/// Numerically stable softmax over the last axis (reference `softmax_inplace`).
pub fn softmax(b: &mut GraphBuilder, x: &str) -> String {
    b.node("Softmax", &[x], vec![("axis", Attr::Int(-1))])
}
