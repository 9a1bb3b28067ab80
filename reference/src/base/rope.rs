//! Rotary position embedding, HF rotate-half convention (not the interleaved GPT-J one).
//!
//! For head vector `x` of size `Dh` split in halves `x1 = x[..Dh/2]`, `x2 = x[Dh/2..]`, position `p`:
//! `x1' = x1 cos(p f) - x2 sin(p f)`, `x2' = x2 cos(p f) + x1 sin(p f)` with
//! `f_i = theta^(-2i/Dh)` (possibly rescaled, see [`inverse_frequencies`]).
//! PyTorch: `q * cos + rotate_half(q) * sin`, `rotate_half(x) = cat(-x2, x1)`.

use crate::base::config::{ModelConfig, RopeScaling};
use ndarray::{Array2, ArrayViewMut2};

/// `inv_freq` as HF computes it (f32), including `linear` and `llama3` scaling.
///
/// # Shapes
/// -> `[Dh/2]`
pub fn inverse_frequencies(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    // PyTorch: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    let base = theta as f32;
    let inv: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    match scaling {
        RopeScaling::Default => inv,
        RopeScaling::Linear { factor } => inv.iter().map(|f| f / *factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            // HF `_compute_llama3_parameters`: long wavelengths are divided by `factor`, short ones
            // kept, and the band in between interpolated smoothly.
            let (factor, low, high) = (
                *factor as f32,
                *low_freq_factor as f32,
                *high_freq_factor as f32,
            );
            let old_len = *original_max_position_embeddings as f32;
            let low_freq_wavelen = old_len / low;
            let high_freq_wavelen = old_len / high;
            inv.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    let scaled = if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        f
                    };
                    // HF: is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if medium {
                        let smooth = (old_len / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect()
        }
    }
}

/// Positions whose `cos` / `sin` are precomputed; later ones are computed when used (the same
/// f32 expression, so the same bits). Bounds the table by a constant instead of by
/// `max_position_embeddings`, which a 1 KB config could set to 2^40 (a file may claim sizes it
/// does not back, so nothing is sized by a claim alone): 16384 positions
/// of `Dh / 2 = 64` frequencies are 8 MiB.
pub const ROPE_TABLE_POSITIONS: usize = 16384;

/// `cos(p f_i)` and `sin(p f_i)`: precomputed for the first [`ROPE_TABLE_POSITIONS`] positions
/// of the context.
#[derive(Clone, Debug)]
pub struct Rope {
    /// `[Dh/2]` the frequencies `f_i`
    inv: Vec<f32>,
    /// `[min(max_pos, ROPE_TABLE_POSITIONS), Dh/2]`
    cos: Array2<f32>,
    /// `[min(max_pos, ROPE_TABLE_POSITIONS), Dh/2]`
    sin: Array2<f32>,
}

impl Rope {
    pub fn new(config: &ModelConfig) -> Self {
        let inv = inverse_frequencies(config.head_dim, config.rope_theta, &config.rope_scaling);
        let positions = config.max_position_embeddings.min(ROPE_TABLE_POSITIONS);
        let angle = |p: usize, i: usize| angle(p, inv[i]);
        Rope {
            cos: Array2::from_shape_fn((positions, inv.len()), |(p, i)| angle(p, i).cos()),
            sin: Array2::from_shape_fn((positions, inv.len()), |(p, i)| angle(p, i).sin()),
            inv,
        }
    }

    /// `[Dh/2]` the frequencies `f_i` (what the naive layer rotates by, `base::layer_naive`).
    pub fn frequencies(&self) -> &[f32] {
        &self.inv
    }

    /// Rotate every head of every row in place; row `t` is at absolute position `pos0 + t`.
    ///
    /// # Shapes
    /// - `x`: `[T, heads * Dh]`
    pub fn apply(&self, mut x: ArrayViewMut2<f32>, pos0: usize, head_dim: usize) {
        let half = head_dim / 2;
        let (mut cos_far, mut sin_far) = (vec![0.0; half], vec![0.0; half]);
        for (t, mut row) in x.rows_mut().into_iter().enumerate() {
            let pos = pos0 + t;
            let (cos, sin) = if pos < self.cos.nrows() {
                (
                    self.cos.row(pos).to_slice().expect("contiguous"),
                    self.sin.row(pos).to_slice().expect("contiguous"),
                )
            } else {
                for (i, &f) in self.inv.iter().enumerate() {
                    cos_far[i] = angle(pos, f).cos();
                    sin_far[i] = angle(pos, f).sin();
                }
                (&cos_far[..], &sin_far[..])
            };
            let row = row.as_slice_mut().expect("rows are contiguous");
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (x1, x2) = (head[i], head[i + half]);
                    head[i] = x1 * cos[i] - x2 * sin[i];
                    head[i + half] = x2 * cos[i] + x1 * sin[i];
                }
            }
        }
    }
}

/// PyTorch: `freqs = position_ids.float() * inv_freq` (f32), then cos / sin in f32.
fn angle(p: usize, f: f32) -> f32 {
    p as f32 * f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    #[test]
    fn default_frequencies_hand_computed() {
        // Dh = 4, theta = 100: f = [1, 100^-0.5 = 0.1]
        let f = inverse_frequencies(4, 100.0, &RopeScaling::Default);
        assert_abs_diff_eq!(f[0], 1.0);
        assert_abs_diff_eq!(f[1], 0.1, epsilon = 1e-7);
    }

    #[test]
    fn rotation_hand_computed() {
        let mut config = builtin::tiny_config();
        config.head_dim = 4;
        config.num_attention_heads = 1;
        config.rope_theta = 100.0;
        config.max_position_embeddings = 4;
        let rope = Rope::new(&config);
        // Position 2: angles [2, 0.2]. x = [x1 | x2] = [1, 2 | 3, 4]
        let mut x = array![[1.0f32, 2.0, 3.0, 4.0]];
        rope.apply(x.view_mut(), 2, 4);
        let (c0, s0, c1, s1) = (2f32.cos(), 2f32.sin(), 0.2f32.cos(), 0.2f32.sin());
        let want = array![[
            1.0 * c0 - 3.0 * s0,
            2.0 * c1 - 4.0 * s1,
            3.0 * c0 + 1.0 * s0,
            4.0 * c1 + 2.0 * s1
        ]];
        assert_abs_diff_eq!(x, want, epsilon = 1e-6);
        // Position 0 is the identity.
        let mut y = array![[1.0f32, 2.0, 3.0, 4.0]];
        rope.apply(y.view_mut(), 0, 4);
        assert_eq!(y, array![[1.0f32, 2.0, 3.0, 4.0]]);
    }

    /// Past the precomputed table the rotation is computed on the fly, bit for bit the table's
    /// expression; the table stays at [`ROPE_TABLE_POSITIONS`] rows however long the context.
    #[test]
    fn positions_past_the_table_are_computed_alike() {
        let mut config = builtin::tiny_config();
        config.max_position_embeddings = 1 << 40;
        let rope = Rope::new(&config);
        assert_eq!(rope.cos.nrows(), ROPE_TABLE_POSITIONS);
        let dh = config.head_dim;
        let x: Vec<f32> = (0..dh).map(|i| i as f32 * 0.37 - 1.0).collect();
        for pos in [ROPE_TABLE_POSITIONS - 1, ROPE_TABLE_POSITIONS, 1 << 30] {
            let mut got = ndarray::Array2::from_shape_vec((1, dh), x.clone()).unwrap();
            rope.apply(got.view_mut(), pos, dh);
            let half = dh / 2;
            for i in 0..half {
                let a = pos as f32 * rope.inv[i];
                let (c, s) = (a.cos(), a.sin());
                assert_eq!(
                    got[[0, i]].to_bits(),
                    (x[i] * c - x[i + half] * s).to_bits()
                );
                assert_eq!(
                    got[[0, i + half]].to_bits(),
                    (x[i + half] * c + x[i] * s).to_bits()
                );
            }
        }
    }

    #[test]
    fn llama3_scaling_bands() {
        // theta 10000, Dh 8: wavelengths 2*pi*[1, 10, 100, 1000]; old length 64 -> low band > 64,
        // high band < 16: f0 kept, f1 (62.8) smoothed, f2 and f3 divided by the factor.
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let base = inverse_frequencies(8, 10000.0, &RopeScaling::Default);
        let f = inverse_frequencies(8, 10000.0, &scaling);
        assert_eq!(f[0], base[0]);
        let wavelen = 2.0 * std::f32::consts::PI / base[1];
        let smooth = (64.0 / wavelen - 1.0) / 3.0;
        assert_abs_diff_eq!(
            f[1],
            (1.0 - smooth) * base[1] / 8.0 + smooth * base[1],
            epsilon = 1e-9
        );
        assert_abs_diff_eq!(f[2], base[2] / 8.0);
        assert_abs_diff_eq!(f[3], base[3] / 8.0);
    }
}
