//! ARLA, Accelerated Residual Latent Attention (docs/m2r2/arla.md): the exit decision at gate `g`
//! from the fast exit states `u_1..u_g` of one token, by attention in a small latent space.
//!
//! ```text
//! z_i = P RMSNorm_arla(u_i) + E[i]          i = 1..g          [d_lat]
//! q = W_q z_g,  k_i = W_k z_i,  v_i = W_v z_i                 [d_lat]
//! a = softmax_i(q . k_i / sqrt(d_lat))                         [g]
//! o = sum_i a_i v_i                                            [d_lat]
//! p_exit = sigmoid(w_o . (o + z_g) + b_o)                      scalar; exit when p_exit >= tau
//! ```
//!
//! Weights live in their own file, `arla.safetensors` (f32 when written; f32, f16 or bf16 read):
//!
//! | tensor                  | shape            | symbol                 |
//! |-------------------------|------------------|------------------------|
//! | `arla.norm.weight`      | `[D]`            | RMSNorm_arla weight    |
//! | `arla.proj.weight`      | `[d_lat, D]`     | P                      |
//! | `arla.gate_embed.weight`| `[J, d_lat]`     | E (row i-1 for gate i) |
//! | `arla.q.weight`         | `[d_lat, d_lat]` | W_q                    |
//! | `arla.k.weight`         | `[d_lat, d_lat]` | W_k                    |
//! | `arla.v.weight`         | `[d_lat, d_lat]` | W_v                    |
//! | `arla.out.weight`       | `[d_lat]`        | w_o                    |
//! | `arla.out.bias`         | `[1]`            | b_o                    |
//!
//! Matrices use PyTorch's `nn.Linear` layout (`y = W x` with `W: [out, in]`), so an `nn.Module`
//! with submodules `norm, proj, gate_embed (nn.Embedding), q, k, v, out` saves exactly these names
//! under the prefix `arla.`.

use crate::base::layer_naive::{matvec, rms_norm_row};
use crate::base::matmul::{dot, linear};
use crate::base::ops::{rms_norm, softmax_inplace};
use crate::base::weights::TensorSource;
use crate::error::{Error, Result};
use crate::io::builtin::standard_normal;
use crate::io::checkpoint::{SafetensorsSource, write_f32_safetensors};
use ndarray::{Array1, Array2, ArrayView1, s};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;

/// File name of the ARLA weights inside an M2R2 weights folder.
pub const ARLA_FILE: &str = "arla.safetensors";

/// The ARLA tensor names in file order (see the table in the module docs).
pub const ARLA_TENSORS: [&str; 8] = [
    "arla.norm.weight",
    "arla.proj.weight",
    "arla.gate_embed.weight",
    "arla.q.weight",
    "arla.k.weight",
    "arla.v.weight",
    "arla.out.weight",
    "arla.out.bias",
];

/// ARLA weights. Legend: `D` hidden size, `J` gates, `d_lat` latent size.
#[derive(Clone, Debug, PartialEq)]
pub struct Arla {
    /// `[D]` RMSNorm_arla weight
    pub norm: Array1<f32>,
    /// `[d_lat, D]` P
    pub proj: Array2<f32>,
    /// `[J, d_lat]` E: row `i` is added to the latent of gate `i + 1`
    pub gate_embed: Array2<f32>,
    /// `[d_lat, d_lat]` W_q
    pub wq: Array2<f32>,
    /// `[d_lat, d_lat]` W_k
    pub wk: Array2<f32>,
    /// `[d_lat, d_lat]` W_v
    pub wv: Array2<f32>,
    /// `[d_lat]` w_o
    pub wo: Array1<f32>,
    /// b_o
    pub bo: f32,
}

/// Expected shape of each tensor of [`ARLA_TENSORS`], in the same order.
fn shapes(d_model: usize, n_gates: usize, latent: usize) -> [Vec<usize>; 8] {
    [
        vec![d_model],
        vec![latent, d_model],
        vec![n_gates, latent],
        vec![latent, latent],
        vec![latent, latent],
        vec![latent, latent],
        vec![latent],
        vec![1],
    ]
}

impl Arla {
    /// D
    pub fn d_model(&self) -> usize {
        self.proj.ncols()
    }

    /// J: the gates this ARLA has embeddings for.
    pub fn n_gates(&self) -> usize {
        self.gate_embed.nrows()
    }

    /// d_lat
    pub fn latent(&self) -> usize {
        self.proj.nrows()
    }

    /// `p_exit` at gate `g = exit_states.len()` (1-based) from the fast exit states `u_1..u_g`
    /// of one token (equations in the module docs). `eps` is the base model's
    /// `rms_norm_eps`. Each `z_i` depends only on `u_i`, and every product goes through the
    /// batch-invariant [`linear`] / [`dot`], so the result does not depend on anything but the
    /// token's own states.
    ///
    /// # Shapes
    /// - `exit_states`: `g` views of `[D]`, `1 <= g <= J` -> scalar in `[0, 1]`
    ///
    /// # Panics
    /// If `g` is 0 or above `J`, or a state is not of length `D` (callers check; see
    /// [`crate::m2r2::exit_gate::gate_score`]).
    pub fn exit_prob(&self, exit_states: &[ArrayView1<f32>], eps: f32) -> f32 {
        let g = exit_states.len();
        let (d, lat) = (self.d_model(), self.latent());
        assert!(
            g >= 1 && g <= self.n_gates(),
            "ARLA at gate {g}: gates are 1..={}",
            self.n_gates()
        );
        // u: [g, D]
        let mut u = Array2::zeros((g, d));
        for (mut row, state) in u.rows_mut().into_iter().zip(exit_states) {
            assert_eq!(
                state.len(),
                d,
                "ARLA exit state of length {}, expected {d}",
                state.len()
            );
            row.assign(state);
        }
        // z_i = P RMSNorm_arla(u_i) + E[i]                                   [g, d_lat]
        let normed = rms_norm(u.view(), &self.norm, eps);
        let mut z = linear(normed.view(), self.proj.view(), None);
        z += &self.gate_embed.slice(s![..g, ..]);
        let z_g = z.slice(s![g - 1..g, ..]); // [1, d_lat]
        // q = W_q z_g, k_i = W_k z_i, v_i = W_v z_i
        let q = linear(z_g, self.wq.view(), None); // [1, d_lat]
        let k = linear(z.view(), self.wk.view(), None); // [g, d_lat]
        let v = linear(z.view(), self.wv.view(), None); // [g, d_lat]
        // a = softmax_i(q . k_i / sqrt(d_lat))                               [g]
        let mut a = linear(q.view(), k.view(), None).row(0).to_owned();
        let sqrt_lat = (lat as f32).sqrt();
        a.mapv_inplace(|x| x / sqrt_lat);
        softmax_inplace(a.view_mut());
        // o = sum_i a_i v_i, in order i = 1..g                               [d_lat]
        let mut o = Array1::<f32>::zeros(lat);
        for (a_i, v_i) in a.iter().zip(v.rows()) {
            o.scaled_add(*a_i, &v_i);
        }
        // p = sigmoid(w_o . (o + z_g) + b_o)
        let h = o + z_g.row(0);
        let logit = dot(
            self.wo.as_slice().expect("owned vector"),
            h.as_slice().expect("owned vector"),
        ) + self.bo;
        1.0 / (1.0 + (-logit).exp())
    }

    /// [`Arla::exit_prob`] as the module docs' equations, one vector at a time: the same products
    /// ([`dot`], through `matvec`) in the same order, so the same bits (tested).
    ///
    /// # Shapes
    /// As [`Arla::exit_prob`].
    ///
    /// # Panics
    /// If `g` is 0 or above `J`.
    pub fn exit_prob_naive(&self, exit_states: &[ArrayView1<f32>], eps: f32) -> f32 {
        let g = exit_states.len();
        assert!(g >= 1 && g <= self.n_gates(), "ARLA at gate {g}");
        // z_i = P RMSNorm_arla(u_i) + E[i]                                   g x [d_lat]
        let z: Vec<Array1<f32>> = exit_states
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let normed = rms_norm_row(&u.to_owned(), &self.norm, eps);
                matvec(self.proj.view(), None, &normed) + self.gate_embed.row(i)
            })
            .collect();
        let z_g = &z[g - 1];
        // q = W_q z_g, k_i = W_k z_i, v_i = W_v z_i                           [d_lat]
        let q = matvec(self.wq.view(), None, z_g);
        let k_rows: Vec<Array1<f32>> = z
            .iter()
            .map(|z_i| matvec(self.wk.view(), None, z_i))
            .collect();
        let v: Vec<Array1<f32>> = z
            .iter()
            .map(|z_i| matvec(self.wv.view(), None, z_i))
            .collect();
        // a = softmax_i(q . k_i / sqrt(d_lat))                                [g]
        let k_views: Vec<ArrayView1<f32>> = k_rows.iter().map(|k| k.view()).collect();
        let k = ndarray::stack(ndarray::Axis(0), &k_views).expect("g rows of d_lat"); // [g, d_lat]
        let mut a = matvec(k.view(), None, &q);
        let sqrt_lat = (self.latent() as f32).sqrt();
        a.mapv_inplace(|x| x / sqrt_lat);
        softmax_inplace(a.view_mut());
        // o = sum_i a_i v_i                                                   [d_lat]
        let mut o = Array1::<f32>::zeros(self.latent());
        for (a_i, v_i) in a.iter().zip(&v) {
            o.scaled_add(*a_i, v_i);
        }
        // p = sigmoid(w_o . (o + z_g) + b_o)
        let h = o + z_g;
        let logit = dot(
            self.wo.as_slice().expect("owned vector"),
            h.as_slice().expect("owned vector"),
        ) + self.bo;
        1.0 / (1.0 + (-logit).exp())
    }

    /// Seeded random ARLA weights, drawn from one ChaCha8 stream in [`ARLA_TENSORS`] order, each
    /// row-major: norm `1 + 0.1 N(0,1)`, P `N(0,1) / sqrt(D)`, E `N(0,1)`, W_q, W_k, W_v and w_o
    /// `N(0,1) / sqrt(d_lat)`; `b_o = 0` (not drawn). With these, `p_exit` spreads over `(0, 1)`
    /// around 0.5, so the default threshold exits some tokens and not others.
    pub fn random(d_model: usize, n_gates: usize, latent: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut draw = |shape: (usize, usize), mean: f32, std: f32| {
            Array2::from_shape_simple_fn(shape, || mean + std * standard_normal(&mut rng))
        };
        let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
        let norm = draw((1, d_model), 1.0, 0.1).remove_axis(ndarray::Axis(0));
        let proj = draw((latent, d_model), 0.0, inv_sqrt(d_model));
        let gate_embed = draw((n_gates, latent), 0.0, 1.0);
        let wq = draw((latent, latent), 0.0, inv_sqrt(latent));
        let wk = draw((latent, latent), 0.0, inv_sqrt(latent));
        let wv = draw((latent, latent), 0.0, inv_sqrt(latent));
        let wo = draw((1, latent), 0.0, inv_sqrt(latent)).remove_axis(ndarray::Axis(0));
        Arla {
            norm,
            proj,
            gate_embed,
            wq,
            wk,
            wv,
            wo,
            bo: 0.0,
        }
    }

    /// Read `path` (an `arla.safetensors`), checking every tensor's presence, shape against
    /// `(D, J, d_lat)` and finiteness, and refusing tensors not in the table.
    pub fn load(path: &Path, d_model: usize, n_gates: usize, latent: usize) -> Result<Self> {
        let label = path.display().to_string();
        let src = SafetensorsSource::open_files(&[path.to_path_buf()])?;
        if let Some(name) = src
            .names()
            .into_iter()
            .find(|n| !ARLA_TENSORS.contains(&n.as_str()))
        {
            return Err(Error::format(
                &label,
                format!(
                    "unknown tensor `{name}` (ARLA tensors: {})",
                    ARLA_TENSORS.join(", ")
                ),
            ));
        }
        let read = |i: usize| -> Result<Vec<f32>> {
            let name = ARLA_TENSORS[i];
            let expected = shapes(d_model, n_gates, latent)[i].clone();
            let t = src.read(name)?.ok_or_else(|| Error::MissingTensor {
                file: label.clone(),
                tensor: name.into(),
            })?;
            if t.shape != expected {
                return Err(Error::ShapeMismatch {
                    file: label.clone(),
                    tensor: name.into(),
                    expected,
                    actual: t.shape,
                });
            }
            if let Some(v) = t.data.iter().find(|v| !v.is_finite()) {
                return Err(Error::format(
                    &label,
                    format!("tensor `{name}` holds a non-finite value ({v})"),
                ));
            }
            Ok(t.data)
        };
        let matrix = |data: Vec<f32>, rows: usize, cols: usize| {
            Array2::from_shape_vec((rows, cols), data).expect("shape checked")
        };
        Ok(Arla {
            norm: Array1::from_vec(read(0)?),
            proj: matrix(read(1)?, latent, d_model),
            gate_embed: matrix(read(2)?, n_gates, latent),
            wq: matrix(read(3)?, latent, latent),
            wk: matrix(read(4)?, latent, latent),
            wv: matrix(read(5)?, latent, latent),
            wo: Array1::from_vec(read(6)?),
            bo: read(7)?[0],
        })
    }

    /// Write all tensors of the table to `path` as f32 safetensors.
    pub fn save(&self, path: &Path) -> Result<()> {
        let flat = |v: ndarray::ArrayViewD<f32>| v.iter().copied().collect::<Vec<f32>>();
        let data = [
            flat(self.norm.view().into_dyn()),
            flat(self.proj.view().into_dyn()),
            flat(self.gate_embed.view().into_dyn()),
            flat(self.wq.view().into_dyn()),
            flat(self.wk.view().into_dyn()),
            flat(self.wv.view().into_dyn()),
            flat(self.wo.view().into_dyn()),
            vec![self.bo],
        ];
        let shapes = shapes(self.d_model(), self.n_gates(), self.latent());
        let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = ARLA_TENSORS
            .iter()
            .zip(shapes)
            .zip(data)
            .map(|((name, shape), data)| (name.to_string(), shape, data))
            .collect();
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_f32_safetensors(path, &tensors, Some(metadata))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    /// D = 2, d_lat = 2, J = 2, eps = 0.
    fn hand_arla() -> Arla {
        Arla {
            norm: array![1.0, 1.0],
            proj: array![[1.0, 0.0], [0.0, 1.0]],
            gate_embed: array![[0.0, 0.0], [1.0, 0.0]],
            wq: array![[1.0, 0.0], [0.0, 1.0]],
            wk: array![[1.0, 0.0], [0.0, 1.0]],
            wv: array![[1.0, 0.0], [0.0, 0.0]],
            wo: array![1.0, 1.0],
            bo: -3.0,
        }
    }

    #[test]
    fn exit_prob_hand_computed() {
        let arla = hand_arla();
        let u1 = array![1.0f32, 1.0]; // rms 1 -> normed [1, 1]
        let u2 = array![3.0f32, -3.0]; // rms 3 -> normed [1, -1]

        // Gate 1: z_1 = [1, 1] + E[0] = [1, 1]; one key, a = [1]; o = v_1 = W_v z_1 = [1, 0].
        // logit = w_o . (o + z_1) + b_o = (2 + 1) - 3 = 0 -> p = 0.5.
        assert_eq!(arla.exit_prob(&[u1.view()], 0.0), 0.5);

        // Gate 2: z_2 = [1, -1] + E[1] = [2, -1]; q = z_2 = [2, -1]; k_1 = [1, 1], k_2 = [2, -1].
        // q.k = [1, 5], / sqrt(2) = [0.70711, 3.53553]; a = softmax = [0.0558072, 0.9441928].
        // v_1 = [1, 0], v_2 = [2, 0]: o = [a_1 + 2 a_2, 0] = [2 - a_1, 0].
        // o + z_2 = [4 - a_1, -1]; logit = 4 - a_1 - 1 - 3 = -a_1 = -0.0558072.
        // p = sigmoid(-0.0558072) = 0.4860518.
        let p = arla.exit_prob(&[u1.view(), u2.view()], 0.0);
        assert_abs_diff_eq!(p, 0.486_051_8, epsilon = 1e-6);
    }

    /// The naive twin gives `exit_prob`'s bits at every gate, for random weights and states.
    #[test]
    fn exit_prob_naive_is_exit_prob_bitwise() {
        let arla = Arla::random(64, 3, 16, 5);
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for _ in 0..50 {
            let us: Vec<Array1<f32>> = (0..3)
                .map(|_| Array1::from_shape_simple_fn(64, || 3.0 * standard_normal(&mut rng)))
                .collect();
            let views: Vec<_> = us.iter().map(|u| u.view()).collect();
            for g in 1..=3 {
                let fast = arla.exit_prob(&views[..g], 1e-5);
                let naive = arla.exit_prob_naive(&views[..g], 1e-5);
                assert_eq!(
                    fast.to_bits(),
                    naive.to_bits(),
                    "gate {g}: {fast} vs {naive}"
                );
            }
        }
        let u1 = array![1.0f32, 1.0];
        let u2 = array![3.0f32, -3.0];
        let naive = hand_arla().exit_prob_naive(&[u1.view(), u2.view()], 0.0);
        assert_abs_diff_eq!(naive, 0.486_051_8, epsilon = 1e-6);
    }

    #[test]
    #[should_panic(expected = "ARLA at gate 3")]
    fn too_many_states_panics() {
        let u = array![1.0f32, 1.0];
        hand_arla().exit_prob(&[u.view(), u.view(), u.view()], 0.0);
    }

    #[test]
    fn random_is_deterministic_and_spread() {
        let a = Arla::random(64, 3, 16, 1);
        assert_eq!(a, Arla::random(64, 3, 16, 1));
        assert_ne!(a, Arla::random(64, 3, 16, 2));
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let ps: Vec<f32> = (0..200)
            .map(|_| {
                let us: Vec<Array1<f32>> = (0..2)
                    .map(|_| Array1::from_shape_simple_fn(64, || standard_normal(&mut rng)))
                    .collect();
                let views: Vec<_> = us.iter().map(|u| u.view()).collect();
                a.exit_prob(&views, 1e-5)
            })
            .collect();
        assert!(ps.iter().all(|p| p.is_finite() && (0.0..=1.0).contains(p)));
        let above = ps.iter().filter(|&&p| p >= 0.5).count();
        assert!((20..180).contains(&above), "{above} of 200 above 0.5");
    }

    #[test]
    fn save_load_round_trip_and_rejections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ARLA_FILE);
        let a = Arla::random(8, 3, 4, 7);
        a.save(&path).unwrap();
        assert_eq!(Arla::load(&path, 8, 3, 4).unwrap(), a);

        let err = Arla::load(&path, 8, 2, 4).unwrap_err().to_string();
        assert!(
            err.contains("`arla.gate_embed.weight` has shape [3, 4], expected [2, 4]"),
            "{err}"
        );
        assert!(err.contains(ARLA_FILE), "{err}");

        let write = |tensors: &[(String, Vec<usize>, Vec<f32>)]| {
            write_f32_safetensors(&path, tensors, None).unwrap();
            Arla::load(&path, 8, 3, 4).unwrap_err().to_string()
        };
        let err = write(&[("arla.norm.weight".into(), vec![8], vec![1.0; 8])]);
        assert!(
            err.contains("tensor `arla.proj.weight` is missing"),
            "{err}"
        );
        let err = write(&[("arla.extra".into(), vec![1], vec![1.0])]);
        assert!(err.contains("unknown tensor `arla.extra`"), "{err}");
        let err = write(&[("arla.norm.weight".into(), vec![8], vec![f32::NAN; 8])]);
        assert!(err.contains("non-finite"), "{err}");
    }
}
