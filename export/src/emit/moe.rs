//! Sparse mixture of experts (reference `moe.rs`, HF `MixtralSparseMoeBlock`), expressed with
//! standard operators and static shapes:
//!
//! ```text
//! p        = Softmax(h W_router^T)                        [R, E]   (R = B*T rows)
//! v, idx   = TopK(p, k)                                    [R, k]   (ties: lower index first)
//! w_dense  = ScatterElements(0, idx, v / sum(v))           [R, E]   (zero for unchosen experts)
//! out_e    = down_e(silu(gate_e h) * up_e h)  for ALL e    [E, R, D] (stacked expert weights)
//! y        = sum_e w_dense[:, e] * out_e                   [R, D]
//! ```
//!
//! Every expert runs on every row and the unchosen ones get weight exactly 0, so `y` equals the
//! reference's sum over the chosen experts (adding exact zeros changes nothing). This costs `E / k`
//! times the expert FLOPs of a gather-based formulation but has no data-dependent shapes
//! (`NonZero`, per-expert row lists) and no per-row weight gathers (`[R, k, I, D]` copies):
//! TensorRT parses it into a static engine and ONNX Runtime runs it with plain batched MatMuls.
//! Fast rows (docs/m2r2/streams.md) use the slow row's `idx` with their own `p` gathered there
//! (`GatherElements`) and renormalised.

use crate::builder::{Attr, GraphBuilder};
use crate::emit::ops::{linear, softmax, swiglu};
use reference::base::weight_names::{MlpProj, WeightId};
use reference::base::weights::Moe;

/// Router probabilities over all experts.
///
/// # Shapes
/// - `h`: `[R, D]` -> `[R, E]`
pub fn router_probs(b: &mut GraphBuilder, router: &str, h: &str) -> String {
    let logits = linear(b, h, router, None);
    softmax(b, &logits)
}

/// The mixing weights of the chosen experts `indices`, renormalised over them, scattered into a
/// dense `[R, E]` matrix (zero elsewhere).
///
/// # Shapes
/// - `probs`: `[R, E]`, `chosen`: `[R, k]` (their probabilities), `indices`: int64 `[R, k]`
pub fn dense_weights(b: &mut GraphBuilder, probs: &str, chosen: &str, indices: &str) -> String {
    let last = b.const_i64(&[-1]);
    let total = b.node(
        "ReduceSum",
        &[chosen, &last],
        vec![("keepdims", Attr::Int(1))],
    );
    let w = b.binary("Div", chosen, &total);
    let shape = b.unary("Shape", probs);
    let zeros = b.node(
        "ConstantOfShape",
        &[&shape],
        vec![("value", Attr::F32Tensor(0.0))],
    );
    b.node(
        "ScatterElements",
        &[&zeros, indices, &w],
        vec![("axis", Attr::Int(1))],
    )
}

/// Expert weights of one projection stacked for a batched MatMul: `[E, in, out]`.
fn stacked(b: &mut GraphBuilder, moe: &Moe, l: usize, p: MlpProj) -> String {
    b.scoped(p.module(), |b| {
        let axis0 = b.const_i64(&[0]);
        let parts: Vec<String> = moe
            .experts
            .iter()
            .enumerate()
            .map(|(e, expert)| {
                let lin = match p {
                    MlpProj::Gate => &expert.gate,
                    MlpProj::Up => &expert.up,
                    MlpProj::Down => &expert.down,
                };
                let w = b.weight(
                    &WeightId::Expert(l, e, p).onnx_name(),
                    lin.w.view().into_dyn(),
                );
                b.binary("Unsqueeze", &w, &axis0)
            })
            .collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let all = b.node("Concat", &refs, vec![("axis", Attr::Int(0))]); // [E, out, in]
        b.node(
            "Transpose",
            &[&all],
            vec![("perm", Attr::Ints(vec![0, 2, 1]))],
        )
    })
}

/// The stacked expert weights of one layer, `[E, D, I]`, `[E, D, I]`, `[E, I, D]`.
pub struct Experts {
    gate: String,
    up: String,
    down: String,
}

pub fn experts(b: &mut GraphBuilder, moe: &Moe, l: usize) -> Experts {
    b.scoped("experts", |b| Experts {
        gate: stacked(b, moe, l, MlpProj::Gate),
        up: stacked(b, moe, l, MlpProj::Up),
        down: stacked(b, moe, l, MlpProj::Down),
    })
}

/// `y = sum_e w[:, e] * Expert_e(h)`, all experts on all rows.
///
/// # Shapes
/// - `h`: `[R, D]`, `w`: `[R, E]` -> `[R, D]`
pub fn mix_experts(b: &mut GraphBuilder, experts: &Experts, h: &str, w: &str) -> String {
    let gate = b.binary("MatMul", h, &experts.gate); // [E, R, I]
    let up = b.binary("MatMul", h, &experts.up);
    let act = swiglu(b, &gate, &up);
    let out = b.binary("MatMul", &act, &experts.down); // [E, R, D]
    let wt = b.node("Transpose", &[w], vec![("perm", Attr::Ints(vec![1, 0]))]); // [E, R]
    let last = b.const_i64(&[-1]);
    let wt = b.binary("Unsqueeze", &wt, &last); // [E, R, 1]
    let weighted = b.binary("Mul", &out, &wt);
    let axis0 = b.const_i64(&[0]);
    b.node(
        "ReduceSum",
        &[&weighted, &axis0],
        vec![("keepdims", Attr::Int(0))],
    )
}

/// The MoE block of layer `l` on slow rows and, optionally, fast rows of the same tokens.
///
/// # Shapes
/// - `h`, `h_fast`: `[B, T, D]` (already RMS-normed) -> same
pub fn moe_block(
    b: &mut GraphBuilder,
    moe: &Moe,
    l: usize,
    d: usize,
    h: &str,
    h_fast: Option<&str>,
) -> (String, Option<String>) {
    b.scoped("moe", |b| {
        let router = b.weight(
            &WeightId::Router(l).onnx_name(),
            moe.router.view().into_dyn(),
        );
        let experts = experts(b, moe, l);
        let rows = b.const_i64(&[-1, d as i64]);
        let h2 = b.binary("Reshape", h, &rows); // [R, D]
        let probs = router_probs(b, &router, &h2);
        let k = b.const_i64(&[moe.top_k as i64]);
        let top = b.node_n(
            "TopK",
            &[&probs, &k],
            2,
            vec![
                ("axis", Attr::Int(-1)),
                ("largest", Attr::Int(1)),
                ("sorted", Attr::Int(1)),
            ],
        );
        let (chosen, indices) = (&top[0], &top[1]);
        let w = dense_weights(b, &probs, chosen, indices);
        let y = mix_experts(b, &experts, &h2, &w);
        let shape = b.unary("Shape", h);
        let y = b.binary("Reshape", &y, &shape);
        let y_fast = h_fast.map(|hf| {
            b.scoped("fast", |b| {
                let hf2 = b.binary("Reshape", hf, &rows);
                let probs_f = router_probs(b, &router, &hf2);
                let chosen_f = b.node(
                    "GatherElements",
                    &[&probs_f, indices],
                    vec![("axis", Attr::Int(1))],
                );
                let wf = dense_weights(b, &probs_f, &chosen_f, indices);
                let yf = mix_experts(b, &experts, &hf2, &wf);
                let shape = b.unary("Shape", hf);
                b.binary("Reshape", &yf, &shape)
            })
        });
        (y, y_fast)
    })
}
