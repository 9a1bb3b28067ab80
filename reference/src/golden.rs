//! Golden files: a decode recorded by the reference so that any other implementation (or a later
//! version of this one) can be checked against it, tensor by tensor.
//!
//! Format (safetensors). Every mode:
//! - `prompt_tokens`: I64 `[P]`
//! - `tokens`: I64 `[n]`, the emitted tokens
//! - `logits`: F32 `[n, V]`, row i is the distribution token i was chosen from
//! - metadata: `format = "m2r2-golden"`, `format_version`, `model` (name as given), `config_hash`
//!   ([`ModelConfig::hash`]), `config` (the config as JSON), `mode`, `m2r2_version`.
//!
//! `mode = greedy` files are format version 1 (unchanged since version 1, so older readers keep
//! reading them). The M2R2 modes (`early-exit`, `speculative`) are format version 2: their extra
//! tensors and metadata are listed in [`m2r2`]. A version-1 reader refuses them instead of checking
//! them as greedy decodes.

use crate::base::config::ModelConfig;
use crate::base::model::Model;
use crate::base::ops::argmax;
use crate::error::{Error, Result};
use ndarray::{Array2, ArrayView2};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

mod m2r2;
pub use m2r2::{M2r2Golden, M2r2Record, weights_hash};

pub const GOLDEN_FORMAT: &str = "m2r2-golden";
/// The newest format version this reads and writes (greedy files are still written as version 1).
pub const GOLDEN_FORMAT_VERSION: u32 = 2;
/// The format version of `mode = greedy` files.
pub const GREEDY_FORMAT_VERSION: u32 = 1;
/// Default tolerance of `golden check` on logits: f32 through a different but valid reduction order
/// (another BLAS, another runtime) moves logits by about 1e-5 on the small models; 1e-4 leaves room.
pub const DEFAULT_ATOL: f32 = 1e-4;

#[derive(Clone, Debug, PartialEq)]
pub struct Golden {
    pub model: String,
    pub config_hash: String,
    pub config_json: String,
    pub mode: String,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    /// `[n, V]`
    pub logits: Array2<f32>,
    /// The M2R2 mode's settings and per-step records; `None` for `mode = greedy`.
    pub m2r2: Option<M2r2Golden>,
}

impl Golden {
    /// Record `steps` greedy tokens after `prompt`.
    pub fn record_greedy(
        model: &Model,
        name: &str,
        prompt: &[u32],
        steps: usize,
    ) -> Result<Golden> {
        let (tokens, logits) = replay(model, prompt, steps, None)?;
        Ok(Golden {
            model: name.into(),
            config_hash: model.config.hash(),
            config_json: serde_json::to_string(&model.config).expect("config serialises"),
            mode: "greedy".into(),
            prompt_tokens: prompt.to_vec(),
            tokens,
            logits,
            m2r2: None,
        })
    }

    /// The format version this golden is written as.
    pub fn format_version(&self) -> u32 {
        if self.m2r2.is_some() {
            GOLDEN_FORMAT_VERSION
        } else {
            GREEDY_FORMAT_VERSION
        }
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let ids =
            |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|&t| i64::from(t).to_le_bytes()).collect() };
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![
            (
                "prompt_tokens".into(),
                Dtype::I64,
                vec![self.prompt_tokens.len()],
                ids(&self.prompt_tokens),
            ),
            (
                "tokens".into(),
                Dtype::I64,
                vec![self.tokens.len()],
                ids(&self.tokens),
            ),
            (
                "logits".into(),
                Dtype::F32,
                vec![self.logits.nrows(), self.logits.ncols()],
                f32_bytes(self.logits.iter()),
            ),
        ];
        let mut metadata = HashMap::from([
            ("format".to_string(), GOLDEN_FORMAT.to_string()),
            (
                "format_version".to_string(),
                self.format_version().to_string(),
            ),
            ("model".to_string(), self.model.clone()),
            ("config_hash".to_string(), self.config_hash.clone()),
            ("config".to_string(), self.config_json.clone()),
            ("mode".to_string(), self.mode.clone()),
            (
                "m2r2_version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
        ]);
        if let Some(m2r2) = &self.m2r2 {
            tensors.extend(m2r2.tensors());
            metadata.extend(m2r2.metadata());
        }
        let label = path.display().to_string();
        let views = tensors
            .iter()
            .map(|(name, dtype, shape, data)| {
                Ok((
                    name.as_str(),
                    tensor_view(&label, *dtype, shape.clone(), data)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(io) => Error::io(path, io),
            other => Error::format(&label, other.to_string()),
        })
    }

    pub fn read(path: &Path) -> Result<Golden> {
        let label = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&label, e.to_string()))?;
        let (_, meta) =
            SafeTensors::read_metadata(&bytes).map_err(|e| Error::format(&label, e.to_string()))?;
        let file = GoldenFile {
            label: label.clone(),
            st,
            meta: meta.metadata().clone().unwrap_or_default(),
        };
        if file.field("format")? != GOLDEN_FORMAT {
            return Err(Error::format(
                &label,
                "not a golden file (metadata `format` is not m2r2-golden)",
            ));
        }
        let version = file.field("format_version")?;
        let mode = file.field("mode")?;
        match (version.as_str(), mode.as_str()) {
            ("1", "greedy") | ("2", _) => {}
            ("1", other) => {
                return Err(Error::format(
                    &label,
                    format!("golden format version 1 has no mode `{other}` (only greedy)"),
                ));
            }
            _ => {
                return Err(Error::format(
                    &label,
                    format!(
                        "golden format version {version} is not supported (this m2r2 reads 1 and {GOLDEN_FORMAT_VERSION})"
                    ),
                ));
            }
        }
        let prompt_tokens = file.ids("prompt_tokens")?;
        let tokens = file.ids("tokens")?;
        let (shape, data) = file.f32s("logits")?;
        if shape.len() != 2 || shape[0] != tokens.len() {
            return Err(Error::ShapeMismatch {
                file: label.clone(),
                tensor: "logits".into(),
                expected: vec![tokens.len(), shape.get(1).copied().unwrap_or(0)],
                actual: shape,
            });
        }
        let m2r2 = match mode.as_str() {
            "greedy" => None,
            _ => Some(M2r2Golden::read(&file, &mode, tokens.len())?),
        };
        Ok(Golden {
            model: file.field("model")?,
            config_hash: file.field("config_hash")?,
            config_json: file.field("config")?,
            mode,
            prompt_tokens,
            tokens,
            logits: Array2::from_shape_vec((shape[0], shape[1]), data).expect("shape checked"),
            m2r2,
        })
    }

    /// The config recorded in the file.
    pub fn config(&self) -> Result<ModelConfig> {
        serde_json::from_str(&self.config_json)
            .map_err(|e| Error::format("golden metadata `config`", e.to_string()))
    }

    /// Recompute this greedy golden with `model` along the recorded tokens and compare tensor by
    /// tensor. M2R2 modes need the M2R2 weights: see [`Golden::check_m2r2`].
    pub fn check(&self, model: &Model, atol: f32) -> Result<CheckReport> {
        if self.m2r2.is_some() {
            return Err(Error::Invalid(format!(
                "this golden records mode `{}`: checking it needs the M2R2 weights (check_m2r2)",
                self.mode
            )));
        }
        self.check_config(model)?;
        let (greedy, logits) = replay(
            model,
            &self.prompt_tokens,
            self.tokens.len(),
            Some(&self.tokens),
        )?;
        let mut entries = vec![compare("logits", self.logits.view(), logits.view(), atol)];
        let first_mismatch = self.tokens.iter().zip(&greedy).position(|(a, b)| a != b);
        entries.push(TensorCheck {
            name: "tokens".into(),
            ok: first_mismatch.is_none(),
            max_abs: first_mismatch.map_or(0.0, |_| 1.0),
            max_rel: 0.0,
            at: first_mismatch.map_or(vec![], |i| vec![i]),
            note: match first_mismatch {
                None => format!("{} greedy tokens equal", self.tokens.len()),
                Some(i) => format!(
                    "step {i}: golden {} vs recomputed {}",
                    self.tokens[i], greedy[i]
                ),
            },
        });
        Ok(CheckReport { entries })
    }
}

impl Golden {
    /// Refuse a model whose config is not the recorded one.
    fn check_config(&self, model: &Model) -> Result<()> {
        if model.config.hash() != self.config_hash {
            return Err(Error::Invalid(format!(
                "the model's config (hash {}) is not the one this golden was recorded with (hash {}, model `{}`)",
                model.config.hash(),
                self.config_hash,
                self.model
            )));
        }
        Ok(())
    }
}

/// A golden file opened for reading: its tensors and metadata, errors naming the file.
struct GoldenFile<'a> {
    label: String,
    st: SafeTensors<'a>,
    meta: HashMap<String, String>,
}

impl GoldenFile<'_> {
    fn field(&self, key: &str) -> Result<String> {
        self.meta.get(key).cloned().ok_or_else(|| {
            Error::format(
                &self.label,
                format!("not a golden file: metadata `{key}` is missing"),
            )
        })
    }

    fn raw(&self, name: &str, dtype: Dtype) -> Result<(Vec<usize>, &[u8])> {
        let t = self.st.tensor(name).map_err(|_| Error::MissingTensor {
            file: self.label.clone(),
            tensor: name.into(),
        })?;
        if t.dtype() != dtype {
            return Err(Error::UnsupportedDtype {
                file: self.label.clone(),
                tensor: name.into(),
                dtype: format!("{:?} (expected {dtype:?})", t.dtype()),
            });
        }
        Ok((t.shape().to_vec(), t.data()))
    }

    fn i64s(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (shape, data) = self.raw(name, Dtype::I64)?;
        let values = data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        Ok((shape, values))
    }

    fn f32s(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (shape, data) = self.raw(name, Dtype::F32)?;
        let values = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Ok((shape, values))
    }

    fn ids(&self, name: &str) -> Result<Vec<u32>> {
        let (_, values) = self.i64s(name)?;
        values
            .into_iter()
            .map(|v| {
                u32::try_from(v)
                    .map_err(|_| Error::format(&self.label, format!("`{name}` holds token id {v}")))
            })
            .collect()
    }

    /// A tensor's shape must be `expected`.
    fn expect_shape(&self, name: &str, shape: &[usize], expected: &[usize]) -> Result<()> {
        if shape != expected {
            return Err(Error::ShapeMismatch {
                file: self.label.clone(),
                tensor: name.into(),
                expected: expected.to_vec(),
                actual: shape.to_vec(),
            });
        }
        Ok(())
    }
}

fn f32_bytes<'a>(values: impl Iterator<Item = &'a f32>) -> Vec<u8> {
    values.flat_map(|v| v.to_le_bytes()).collect()
}

fn tensor_view<'a>(
    label: &str,
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
) -> Result<safetensors::tensor::TensorView<'a>> {
    safetensors::tensor::TensorView::new(dtype, shape, data)
        .map_err(|e| Error::format(label, e.to_string()))
}

/// Decode `steps` tokens after `prompt` and collect each step's logits. With `forced`, feed those
/// tokens instead of the argmax (so logits stay comparable after a mismatch); the argmax tokens are
/// returned either way.
fn replay(
    model: &Model,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
) -> Result<(Vec<u32>, Array2<f32>)> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let mut cache = model.new_cache(prompt.len() + steps)?;
    let first = model.forward(prompt, &mut cache)?.logits;
    let mut row = first.row(first.nrows() - 1).to_owned();
    let mut logits = Array2::zeros((steps, model.config.vocab_size));
    let mut greedy = Vec::with_capacity(steps);
    for step in 0..steps {
        logits.row_mut(step).assign(&row);
        let chosen = argmax(row.as_slice().expect("contiguous")) as u32;
        greedy.push(chosen);
        if step + 1 < steps {
            let next = forced.map_or(chosen, |f| f[step]);
            row = model.forward(&[next], &mut cache)?.logits.row(0).to_owned();
        }
    }
    Ok((greedy, logits))
}

/// The result of comparing one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCheck {
    pub name: String,
    pub ok: bool,
    pub max_abs: f32,
    pub max_rel: f32,
    /// Index of the largest absolute difference (or of the first mismatching token).
    pub at: Vec<usize>,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub entries: Vec<TensorCheck>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.entries.iter().all(|e| e.ok)
    }
}

/// Compare two tensors elementwise: OK when every `|a - b| <= atol`.
pub fn compare(name: &str, want: ArrayView2<f32>, got: ArrayView2<f32>, atol: f32) -> TensorCheck {
    if want.shape() != got.shape() {
        return TensorCheck {
            name: name.into(),
            ok: false,
            max_abs: f32::INFINITY,
            max_rel: f32::INFINITY,
            at: vec![],
            note: format!("shape {:?} vs {:?}", want.shape(), got.shape()),
        };
    }
    let (mut max_abs, mut max_rel, mut at) = (0.0f32, 0.0f32, vec![0, 0]);
    for ((idx, &w), &g) in want.indexed_iter().zip(got.iter()) {
        let diff = (w - g).abs();
        // NaN anywhere is a mismatch.
        let diff = if diff.is_nan() { f32::INFINITY } else { diff };
        if diff > max_abs {
            max_abs = diff;
            at = vec![idx.0, idx.1];
        }
        max_rel = max_rel.max(diff / w.abs().max(1e-6));
    }
    TensorCheck {
        name: name.into(),
        ok: max_abs <= atol,
        max_abs,
        max_rel,
        at,
        note: format!("atol {atol:e}"),
    }
}

/// Compare two integer tensors exactly; `at` is the first index that differs (row-major, in
/// `shape` of the recorded tensor) or where one tensor ends.
///
/// # Shapes
/// - `want`, `got`: flat, row-major with rows of `cols` (`cols = 1` for a vector)
pub fn compare_ints(name: &str, want: &[i64], got: &[i64], cols: usize) -> TensorCheck {
    let cols = cols.max(1);
    let first = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .or_else(|| (want.len() != got.len()).then_some(want.len().min(got.len())));
    let index = |i: usize| {
        if cols == 1 {
            vec![i]
        } else {
            vec![i / cols, i % cols]
        }
    };
    TensorCheck {
        name: name.into(),
        ok: first.is_none(),
        max_abs: first.map_or(0.0, |_| 1.0),
        max_rel: 0.0,
        at: first.map_or(vec![], index),
        note: match first {
            None => format!("{} values equal", want.len()),
            Some(i) => format!(
                "at {:?}: golden {} vs recomputed {}",
                index(i),
                want.get(i).map_or("(end)".into(), |v| v.to_string()),
                got.get(i).map_or("(end)".into(), |v| v.to_string())
            ),
        },
    }
}

/// [`compare`] for NaN-padded tensors (gate scores): NaN in both is equal (not evaluated), NaN in
/// one only is a mismatch.
pub fn compare_padded(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    atol: f32,
) -> TensorCheck {
    let same_padding =
        want.shape() == got.shape() && want.iter().zip(got).all(|(a, b)| a.is_nan() == b.is_nan());
    if !same_padding {
        return compare(name, want, got, atol);
    }
    let zero = |a: ArrayView2<f32>| a.mapv(|v| if v.is_nan() { 0.0 } else { v });
    compare(name, zero(want).view(), zero(got).view(), atol)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;

    #[test]
    fn round_trip_and_self_check() {
        let model = builtin::builtin("tiny").unwrap();
        let g = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 5).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        g.write(&path).unwrap();
        let back = Golden::read(&path).unwrap();
        assert_eq!(back, g);
        assert_eq!(back.config().unwrap(), model.config);
        let report = back.check(&model, DEFAULT_ATOL).unwrap();
        assert!(report.ok(), "{report:?}");
        assert_eq!(
            report.entries[0].max_abs, 0.0,
            "the reference reproduces itself bit for bit"
        );
    }

    #[test]
    fn perturbed_logits_are_reported_where_they_differ() {
        let model = builtin::builtin("tiny").unwrap();
        let mut g = Golden::record_greedy(&model, "tiny", &[5, 6], 3).unwrap();
        g.logits[[1, 7]] += 0.01;
        let report = g.check(&model, DEFAULT_ATOL).unwrap();
        assert!(!report.ok());
        let logits = &report.entries[0];
        assert_eq!(logits.at, vec![1, 7]);
        assert!((logits.max_abs - 0.01).abs() < 1e-4, "{logits:?}");
    }

    #[test]
    fn another_model_is_refused() {
        let tiny = builtin::builtin("tiny").unwrap();
        let moe = builtin::builtin("tiny-moe").unwrap();
        let g = Golden::record_greedy(&tiny, "tiny", &[1], 2).unwrap();
        let err = g.check(&moe, DEFAULT_ATOL).unwrap_err().to_string();
        assert!(
            err.contains("not the one this golden was recorded with"),
            "{err}"
        );
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}").unwrap();
        let err = Golden::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("bad.safetensors") && err.contains("corrupt"),
            "{err}"
        );
        let err = Golden::read(&dir.path().join("missing.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.safetensors"), "{err}");
    }
}
