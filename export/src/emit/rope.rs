//! Rotary position embedding (reference `rope.rs`), HF rotate-half convention. The angles come
//! from `position_ids`: `angle = f32(p) * inv_freq`, the reference's product, so any position works
//! (no table limited to the context).

use crate::builder::{Attr, GraphBuilder};
use reference::base::config::ModelConfig;
use reference::base::rope::inverse_frequencies;

/// `cos` and `sin` of every row's angles, shared by all layers.
pub struct RopeTables {
    /// `[B, 1, T, Dh/2]`
    pub cos: String,
    /// `[B, 1, T, Dh/2]`
    pub sin: String,
    pub head_dim: usize,
}

/// # Shapes
/// - `position_ids`: int64 `[B, T]`
pub fn tables(b: &mut GraphBuilder, config: &ModelConfig, position_ids: &str) -> RopeTables {
    b.scoped("rope", |b| {
        let inv = inverse_frequencies(config.head_dim, config.rope_theta, &config.rope_scaling);
        let inv = b.const_f32("rope/inv_freq", &inv);
        let pos = b.node("Cast", &[position_ids], vec![("to", Attr::Int(1))]);
        let axis2 = b.const_i64(&[2]);
        let pos = b.binary("Unsqueeze", &pos, &axis2); // [B, T, 1]
        let angle = b.binary("Mul", &pos, &inv); // [B, T, Dh/2]
        let axis1 = b.const_i64(&[1]);
        let angle = b.binary("Unsqueeze", &angle, &axis1); // [B, 1, T, Dh/2]
        RopeTables {
            cos: b.unary("Cos", &angle),
            sin: b.unary("Sin", &angle),
            head_dim: config.head_dim,
        }
    })
}

/// Rotate every head: `x1' = x1 cos - x2 sin`, `x2' = x2 cos + x1 sin`.
///
/// # Shapes
/// - `x`: `[B, heads, T, Dh]` -> same
pub fn apply(b: &mut GraphBuilder, rope: &RopeTables, x: &str) -> String {
    b.scoped("rope", |b| {
        let half = rope.head_dim as i64 / 2;
        let split = b.const_i64(&[half, half]);
        let halves = b.node_n("Split", &[x, &split], 2, vec![("axis", Attr::Int(-1))]);
        let (x1, x2) = (&halves[0], &halves[1]);
        let x1c = b.binary("Mul", x1, &rope.cos);
        let x2s = b.binary("Mul", x2, &rope.sin);
        let y1 = b.binary("Sub", &x1c, &x2s);
        let x2c = b.binary("Mul", x2, &rope.cos);
        let x1s = b.binary("Mul", x1, &rope.sin);
        let y2 = b.binary("Add", &x2c, &x1s);
        b.node("Concat", &[&y1, &y2], vec![("axis", Attr::Int(-1))])
    })
}
