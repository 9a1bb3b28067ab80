//! Rotary position embedding (reference `rope.rs`), HF rotate-half convention. The angles come
//! from `position_ids`: `angle = f32(p) * inv_freq`, the reference's product, so any position works
//! (no table limited to the context).

use crate::builder::{Attr, GraphBuilder};
use reference::base::config::ModelConfig;
use reference::base::rope::inverse_frequencies;

/// `cos` and `sin` of every row's angles, each repeated over both halves of a head, and the
/// rotate-half matrix; shared by all layers.
pub struct RopeTables {
    /// `[B, 1, T, Dh]`: `cos` of the `Dh/2` angles, twice
    pub cos: String,
    /// `[B, 1, T, Dh]`: `sin` of the `Dh/2` angles, twice
    pub sin: String,
    /// `[Dh, Dh]`: `x R = rotate_half(x) = cat(-x2, x1)`
    pub rotate_half: String,
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
        let angle = b.node("Concat", &[&angle, &angle], vec![("axis", Attr::Int(-1))]);
        let rotate = rotate_half_matrix(config.head_dim);
        RopeTables {
            cos: b.unary("Cos", &angle),
            sin: b.unary("Sin", &angle),
            rotate_half: b.const_f32_matrix("rope/rotate_half", config.head_dim, &rotate),
        }
    })
}

/// Row-major `[Dh, Dh]` `R` with `x R = cat(-x2, x1)` for a row `x = cat(x1, x2)`: column `k < Dh/2`
/// holds `-1` in row `k + Dh/2`, column `k >= Dh/2` holds `1` in row `k - Dh/2`, the rest zero.
fn rotate_half_matrix(dh: usize) -> Vec<f32> {
    let half = dh / 2;
    let mut r = vec![0.0f32; dh * dh];
    for k in 0..half {
        r[(k + half) * dh + k] = -1.0;
        r[k * dh + k + half] = 1.0;
    }
    r
}

/// Rotate every head: `x cos + rotate_half(x) sin`, i.e. `x1' = x1 cos - x2 sin`,
/// `x2' = x2 cos + x1 sin` with the same roundings (`x R` has one non-zero term per column, so it
/// is exact), in four nodes: the rotation is a `MatMul` with [`RopeTables::rotate_half`] rather
/// than `Split`, `Neg` and `Concat`, since every node costs a kernel launch on a GPU.
///
/// # Shapes
/// - `x`: `[B, heads, T, Dh]` -> same
pub fn apply(b: &mut GraphBuilder, rope: &RopeTables, x: &str) -> String {
    b.scoped("rope", |b| {
        let rotated = b.binary("MatMul", x, &rope.rotate_half);
        let xc = b.binary("Mul", x, &rope.cos);
        let rs = b.binary("Mul", &rotated, &rope.sin);
        b.binary("Add", &xc, &rs)
    })
}

#[cfg(test)]
mod tests {
    use super::rotate_half_matrix;

    /// `x R` against `cat(-x2, x1)` computed by hand.
    #[test]
    fn rotate_half_matrix_rotates_half() {
        let dh = 6;
        let r = rotate_half_matrix(dh);
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let xr: Vec<f32> = (0..dh)
            .map(|k| (0..dh).map(|j| x[j] * r[j * dh + k]).sum())
            .collect();
        assert_eq!(xr, [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]);
    }
}
