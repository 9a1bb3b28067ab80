//! Row-wise operators (reference `ops.rs`) and the linear map (reference `matmul::linear`).

use crate::builder::{Attr, GraphBuilder};

/// RMSNorm over the last axis: `w * (x * 1 / sqrt(sum(x^2) / D + eps))`, the reference's order of
/// operations (the sum divided by `D` rather than a ReduceMean, so the expression is the same).
///
/// # Shapes
/// - `x`: `[..., D]`, `w`: `[D]` -> `[..., D]`
pub fn rms_norm(b: &mut GraphBuilder, x: &str, w: &str, d: usize, eps: f32) -> String {
    let sq = b.binary("Mul", x, x);
    let axes = b.const_i64(&[-1]);
    let sum = b.node("ReduceSum", &[&sq, &axes], vec![("keepdims", Attr::Int(1))]);
    let len = b.scalar_f32(d as f32);
    let mean = b.binary("Div", &sum, &len);
    let eps = b.scalar_f32(eps);
    let var = b.binary("Add", &mean, &eps);
    let root = b.unary("Sqrt", &var);
    let inv = b.unary("Reciprocal", &root);
    let normed = b.binary("Mul", x, &inv);
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
