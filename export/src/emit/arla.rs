//! ARLA (reference `arla.rs`): `p_exit` at gate `g` from the fast exit states `u_1..u_g` of each row.
//!
//! ```text
//! z_i = P RMSNorm_arla(u_i) + E[i]                  [B, T, g, d_lat]
//! q = W_q z_g, k_i = W_k z_i, v_i = W_v z_i
//! a = softmax_i(q . k_i / sqrt(d_lat))              [B, T, 1, g]
//! p = sigmoid(w_o . (sum_i a_i v_i + z_g) + b_o)    [B, T]
//! ```

use crate::builder::{Attr, GraphBuilder};
use crate::emit::ops::{linear, rms_norm, softmax};
use reference::m2r2::arla::Arla;
use reference::m2r2::weight_names::OnnxInitializer;

/// # Shapes
/// - `states`: `g` values of `[B, T, D]` (`u_1..u_g`) -> `[B, T]`
pub fn exit_prob(b: &mut GraphBuilder, arla: &Arla, eps: f32, states: &[String]) -> String {
    let g = states.len() as i64;
    b.scoped("arla", |b| {
        let w = |b: &mut GraphBuilder, i: usize, data: ndarray::ArrayViewD<f32>| {
            b.weight(&OnnxInitializer::Arla(i).name(), data)
        };
        let norm = w(b, 0, arla.norm.view().into_dyn());
        let proj = w(b, 1, arla.proj.view().into_dyn());
        let embed = w(b, 2, arla.gate_embed.view().into_dyn());
        let wq = w(b, 3, arla.wq.view().into_dyn());
        let wk = w(b, 4, arla.wk.view().into_dyn());
        let wv = w(b, 5, arla.wv.view().into_dyn());
        let wo = w(b, 6, arla.wo.view().into_dyn());
        let bo_data = ndarray::arr1(&[arla.bo]);
        let bo = w(b, 7, bo_data.view().into_dyn());

        let axis2 = b.const_i64(&[2]);
        let parts: Vec<String> = states
            .iter()
            .map(|u| b.binary("Unsqueeze", u, &axis2))
            .collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let u = b.node("Concat", &refs, vec![("axis", Attr::Int(2))]); // [B, T, g, D]
        let normed = rms_norm(b, &u, &norm, eps);
        let z = linear(b, &normed, &proj, None); // [B, T, g, d_lat]
        let (zero, end, axis0) = (b.const_i64(&[0]), b.const_i64(&[g]), b.const_i64(&[0]));
        let e = b.node("Slice", &[&embed, &zero, &end, &axis0], vec![]); // [g, d_lat]
        let z = b.binary("Add", &z, &e);
        let (last_start, last_end) = (b.const_i64(&[g - 1]), b.const_i64(&[g]));
        let z_g = b.node("Slice", &[&z, &last_start, &last_end, &axis2], vec![]); // [B, T, 1, d_lat]
        let q = linear(b, &z_g, &wq, None);
        let k = linear(b, &z, &wk, None); // [B, T, g, d_lat]
        let v = linear(b, &z, &wv, None);
        let kt = b.node(
            "Transpose",
            &[&k],
            vec![("perm", Attr::Ints(vec![0, 1, 3, 2]))],
        );
        let dots = b.binary("MatMul", &q, &kt); // [B, T, 1, g]
        let sqrt_lat = b.scalar_f32((arla.latent() as f32).sqrt());
        let scores = b.binary("Div", &dots, &sqrt_lat);
        let a = softmax(b, &scores);
        let o = b.binary("MatMul", &a, &v); // [B, T, 1, d_lat]
        let h = b.binary("Add", &o, &z_g);
        let axes = b.const_i64(&[-1]);
        let wo_col = b.binary("Unsqueeze", &wo, &axes); // [d_lat, 1]
        let logit = b.binary("MatMul", &h, &wo_col); // [B, T, 1, 1]
        let logit = b.binary("Add", &logit, &bo);
        let p = b.unary("Sigmoid", &logit);
        let squeeze = b.const_i64(&[2, 3]);
        b.binary("Squeeze", &p, &squeeze)
    })
}
