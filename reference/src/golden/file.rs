//! The golden file on disk (safetensors): writing a [`Golden`] and reading one back, with errors
//! naming the file, the tensor and the metadata key.

use super::{
    GOLDEN_FORMAT, GOLDEN_FORMAT_VERSION, GOLDEN_MODES, GROWN_TREE_FORMAT_VERSION, Golden,
    M2r2Golden, Pins, TREE_FORMAT_VERSION, Tolerance, metadata, shown,
};
use crate::error::{Error, Result};
use ndarray::Array2;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

impl Golden {
    pub fn write(&self, path: &Path) -> Result<()> {
        if self.m2r2.as_ref().is_some_and(M2r2Golden::is_tree) && self.version < TREE_FORMAT_VERSION
        {
            return Err(Error::Invalid(format!(
                "a token-tree golden is format version {TREE_FORMAT_VERSION} at least, not {}",
                self.version
            )));
        }
        if self.m2r2.as_ref().is_some_and(M2r2Golden::is_varying_tree)
            && self.version < GROWN_TREE_FORMAT_VERSION
        {
            return Err(Error::Invalid(format!(
                "a golden of token trees that change from round to round is format version \
                 {GROWN_TREE_FORMAT_VERSION} at least, not {}",
                self.version
            )));
        }
        if self.m2r2.is_some() && self.pins.rtol.is_some() {
            // the reader refuses it (`Golden::read`): nothing writes a file it cannot read back
            return Err(Error::Invalid(format!(
                "a {} golden cannot pin rtol: M2R2 goldens are checked with atol alone",
                self.mode
            )));
        }
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
        if self.version >= 3 {
            let stops = self.stop_tokens.as_deref().unwrap_or(&[]);
            metadata.insert("stop_tokens".into(), format!("{stops:?}"));
            let steps = self.max_steps.unwrap_or(self.tokens.len());
            metadata.insert("max_steps".into(), steps.to_string());
            // f32's Display is the shortest text that parses back to the same value.
            let pins = &self.pins;
            for (key, value) in [
                ("atol", pins.atol.map(|x| x.to_string())),
                ("rtol", pins.rtol.map(|x| x.to_string())),
                ("expect_dtype", pins.expect_dtype.clone()),
            ] {
                if let Some(value) = value {
                    metadata.insert(key.into(), value);
                }
            }
        }
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
        crate::io::checkpoint::write_safetensors(views, Some(metadata), path)
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
            ("1", "greedy") | ("2" | "3" | "4" | "5", _) => {}
            ("1", other) => {
                return Err(Error::format(
                    &label,
                    format!(
                        "golden format version 1 has no mode `{}` (only greedy)",
                        shown(other)
                    ),
                ));
            }
            _ => {
                return Err(Error::format(
                    &label,
                    format!(
                        "golden format version {} is not supported (this m2r2 reads 1 to \
                         {GOLDEN_FORMAT_VERSION}; a newer m2r2 wrote it?)",
                        shown(&version)
                    ),
                ));
            }
        }
        if !GOLDEN_MODES.contains(&mode.as_str()) {
            return Err(Error::format(
                &label,
                format!(
                    "unknown mode `{}` (expected greedy, early-exit or speculative)",
                    shown(&mode)
                ),
            ));
        }
        let config_json = file.json_object("config")?;
        let config_hash = file.field("config_hash")?;
        metadata::check_config_hash(&file.label, &config_json, &config_hash)?;
        // the vocabulary the token ids and the logits' rows index (a config without one bounds
        // nothing; one that is not a count is refused, as the Python reader refuses it)
        let vocab = match serde_json::from_str::<serde_json::Value>(&config_json)
            .ok()
            .and_then(|c| c.get("vocab_size").cloned())
        {
            None => None,
            Some(v) => match v.as_u64().filter(|&n| n > 0) {
                Some(n) => Some(n),
                None => {
                    return Err(Error::format(
                        &label,
                        format!("metadata `config`: vocab_size {v} is not a count of tokens"),
                    ));
                }
            },
        };
        let prompt_tokens = file.ids("prompt_tokens", "position", vocab)?;
        let tokens = file.ids("tokens", "step", vocab)?;
        let (shape, data) = file.f32s("logits")?;
        let width_ok = |w: usize| vocab.is_none_or(|v| w as u64 == v);
        if shape.len() != 2 || shape[0] != tokens.len() || !width_ok(shape[1]) {
            return Err(Error::ShapeMismatch {
                file: label.clone(),
                tensor: "logits".into(),
                expected: vec![
                    tokens.len(),
                    vocab.map_or(shape.get(1).copied().unwrap_or(0), |v| v as usize),
                ],
                actual: shape,
            });
        }
        // The file's bytes bound `n * V` (checked by safetensors), but not `V` when `n` is 0:
        // ndarray refuses shapes above isize::MAX elements.
        let logits = Array2::from_shape_vec((shape[0], shape[1]), data).map_err(|e| {
            Error::format(&label, format!("tensor `logits` of shape {shape:?}: {e}"))
        })?;
        let version: u32 = version.parse().expect("matched above");
        let m2r2 = match mode.as_str() {
            "greedy" => None,
            _ => Some(M2r2Golden::read(
                &file,
                &mode,
                tokens.len(),
                version,
                vocab,
            )?),
        };
        let (stop_tokens, max_steps, pins) = match version {
            3.. => {
                let stops = file.id_list("stop_tokens")?;
                let steps = file.count("max_steps")?;
                file.check_stop(&tokens, &stops, steps)?;
                let expect_dtype = file.meta.get("expect_dtype").cloned();
                if let Some(dtype) = &expect_dtype
                    && !["f32", "f16"].contains(&dtype.as_str())
                {
                    return Err(file.bad("expect_dtype", dtype));
                }
                let pins = Pins {
                    atol: file.optional_number("atol")?,
                    rtol: file.optional_number("rtol")?,
                    expect_dtype,
                };
                // a check of an M2R2 golden on the reference takes atol alone: a pinned rtol
                // would be refused there and applied by `compare`
                if let (Some(_), Some(value)) = (&m2r2, file.meta.get("rtol")) {
                    return Err(Error::format(
                        &label,
                        format!(
                            "metadata `rtol` = `{}` is pinned in an M2R2 golden (mode \
                             `{mode}`): M2R2 goldens are checked with atol alone (a relative \
                             tolerance is for greedy goldens); pin `atol` instead",
                            shown(value)
                        ),
                    ));
                }
                (Some(stops), Some(steps), pins)
            }
            _ => (None, None, Pins::default()),
        };
        let model = file.field("model")?;
        metadata::check_known(
            &file.label,
            &file.meta,
            file.st.names(),
            version,
            m2r2.as_ref(),
        )?;
        Ok(Golden {
            model,
            config_hash,
            config_json,
            mode,
            prompt_tokens,
            tokens,
            logits,
            m2r2,
            writer: file.meta.get("m2r2_version").cloned(),
            stop_tokens,
            max_steps,
            pins,
            version,
        })
    }
}

/// A golden file opened for reading: its tensors and metadata, errors naming the file.
pub(in crate::golden) struct GoldenFile<'a> {
    pub(in crate::golden) label: String,
    pub(in crate::golden) st: SafeTensors<'a>,
    pub(in crate::golden) meta: HashMap<String, String>,
}

impl GoldenFile<'_> {
    pub(in crate::golden) fn field(&self, key: &str) -> Result<String> {
        self.meta.get(key).cloned().ok_or_else(|| {
            Error::format(
                &self.label,
                format!("not a golden file: metadata `{key}` is missing"),
            )
        })
    }

    /// Metadata `key` as a count: decimal digits only.
    pub(in crate::golden) fn count(&self, key: &str) -> Result<usize> {
        let value = self.field(key)?;
        value
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| value.parse().ok())
            .flatten()
            .ok_or_else(|| self.bad(key, &value))
    }

    /// The tokens agree with where the decode stops: within the budget, no stop token before the
    /// last, and fewer tokens than the budget only when the last is a stop token.
    fn check_stop(&self, tokens: &[u32], stops: &[u32], steps: usize) -> Result<()> {
        let n = tokens.len();
        let early = tokens
            .iter()
            .take(n.saturating_sub(1))
            .position(|t| stops.contains(t));
        let problem = if n > steps {
            Some(format!("{n} tokens for `max_steps` = {steps}"))
        } else if let Some(i) = early {
            Some(format!(
                "stop token {} at step {i}, before the last",
                tokens[i]
            ))
        } else if n < steps && !tokens.last().is_some_and(|t| stops.contains(t)) {
            Some(format!(
                "{n} tokens for `max_steps` = {steps}, the last not a stop token"
            ))
        } else {
            None
        };
        match problem {
            Some(p) => Err(Error::format(
                &self.label,
                format!("`tokens` do not agree with `stop_tokens` and `max_steps`: {p}"),
            )),
            None => Ok(()),
        }
    }

    /// Optional metadata `key` parsed as a finite number >= 0 (a tolerance).
    pub(in crate::golden) fn optional_number(&self, key: &str) -> Result<Option<f32>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(value) => match value.parse::<f32>() {
                Ok(x) if Tolerance::check_bound(key, x).is_ok() => Ok(Some(x)),
                _ => Err(self.bad(key, value)),
            },
        }
    }

    /// Metadata `key` as a JSON list of token ids.
    pub(in crate::golden) fn id_list(&self, key: &str) -> Result<Vec<u32>> {
        let value = self.field(key)?;
        serde_json::from_str(&value).map_err(|_| self.bad(key, &value))
    }

    /// Metadata `key` holds `value`, which is not valid: quoted escaped ([`shown`]).
    pub(in crate::golden) fn bad(&self, key: &str, value: &str) -> Error {
        Error::format(
            &self.label,
            format!("metadata `{key}` = `{}` is not valid", shown(value)),
        )
    }

    pub(in crate::golden) fn raw(&self, name: &str, dtype: Dtype) -> Result<(Vec<usize>, &[u8])> {
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

    pub(in crate::golden) fn i64s(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (shape, data) = self.raw(name, Dtype::I64)?;
        let values = data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        Ok((shape, values))
    }

    pub(in crate::golden) fn f32s(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let (shape, data) = self.raw(name, Dtype::F32)?;
        let values = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Ok((shape, values))
    }

    /// A list of token ids, each below `vocab` when it is known; `row` names an index of the list
    /// in errors (`step`, `position`).
    pub(in crate::golden) fn ids(
        &self,
        name: &str,
        row: &str,
        vocab: Option<u64>,
    ) -> Result<Vec<u32>> {
        let (shape, values) = self.i64s(name)?;
        // a list of ids: one dimension (`[1, T]` would read as T ids)
        if shape.len() != 1 {
            return Err(Error::ShapeMismatch {
                file: self.label.clone(),
                tensor: name.into(),
                expected: vec![values.len()],
                actual: shape,
            });
        }
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let outside = match vocab {
                    Some(size) if u64::try_from(v).is_ok_and(|v| v >= size) => {
                        format!(", outside the vocabulary of {size} tokens (metadata `config`)")
                    }
                    _ => String::new(),
                };
                match u32::try_from(v) {
                    Ok(id) if outside.is_empty() => Ok(id),
                    _ => Err(Error::format(
                        &self.label,
                        format!("`{name}` holds token id {v} at {row} {i}{outside}"),
                    )),
                }
            })
            .collect()
    }

    /// Metadata `key`, which must hold a JSON object (the model's config).
    pub(in crate::golden) fn json_object(&self, key: &str) -> Result<String> {
        let text = self.field(key)?;
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(_)) => Ok(text),
            _ => Err(Error::format(
                &self.label,
                format!("metadata `{key}` is not a JSON object"),
            )),
        }
    }

    /// A tensor's shape must be `expected`.
    pub(in crate::golden) fn expect_shape(
        &self,
        name: &str,
        shape: &[usize],
        expected: &[usize],
    ) -> Result<()> {
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

pub(in crate::golden) fn f32_bytes<'a>(values: impl Iterator<Item = &'a f32>) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// `g` with `edit` applied, written: reading it back fails naming the file and `needle`.
    fn refused(g: &Golden, edit: &dyn Fn(&mut Golden), needle: &str) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        let mut bad = g.clone();
        edit(&mut bad);
        bad.write(&path).unwrap();
        let err = Golden::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("g.safetensors") && err.contains(needle),
            "{err}"
        );
    }

    /// Format 3's metadata must agree with itself and with the tokens; each refusal names the
    /// file and the key.
    #[test]
    fn stops_budgets_and_pins_are_validated() {
        let model = crate::io::builtin::builtin("tiny").unwrap();
        let g = Golden::record_greedy(&model, "tiny", &[1, 2], 4).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        let refused = |edit: &dyn Fn(&mut Golden), needle: &str| refused(&g, edit, needle);
        refused(&|b| b.max_steps = Some(3), "4 tokens for `max_steps` = 3");
        refused(&|b| b.max_steps = Some(9), "the last not a stop token");
        let second = g.tokens[1];
        let first = g.tokens.iter().position(|&t| t == second).unwrap();
        refused(
            &|b| b.stop_tokens = Some(vec![second]),
            &format!("stop token {second} at step {first}, before the last"),
        );
        refused(
            &|b| b.pins.expect_dtype = Some("f64".into()),
            "`expect_dtype` = `f64`",
        );
        refused(&|b| b.pins.atol = Some(-1.0), "`atol` = `-1`");
        // a golden that stopped early at its stop token reads back
        let mut stopped = g.clone();
        (stopped.max_steps, stopped.stop_tokens) = (Some(9), Some(vec![g.tokens[3]]));
        if !g.tokens[..3].contains(&g.tokens[3]) {
            stopped.write(&path).unwrap();
            assert_eq!(Golden::read(&path).unwrap().max_steps, Some(9));
        }
    }

    /// An unknown mode is refused by name (not for the M2R2 metadata it lacks), and a token id
    /// outside the config's vocabulary by its tensor and index, as a negative one is.
    #[test]
    fn unknown_modes_and_ids_outside_the_vocabulary_are_refused() {
        let model = crate::io::builtin::builtin("tiny").unwrap();
        let g = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 6).unwrap();
        refused(
            &g,
            &|b| b.mode = "banana".into(),
            "unknown mode `banana` (expected greedy, early-exit or speculative)",
        );
        // a value read from the file is quoted escaped: its control characters shown, not sent
        refused(
            &g,
            &|b| b.mode = "gr\u{1}eedy\n\"".into(),
            "unknown mode `gr\\u{1}eedy\\n\\\"` (expected",
        );
        refused(
            &g,
            &|b| b.pins.expect_dtype = Some("f\u{1b}[1m32".into()),
            "metadata `expect_dtype` = `f\\u{1b}[1m32` is not valid",
        );
        refused(
            &g,
            &|b| b.tokens[4] = 999,
            "`tokens` holds token id 999 at step 4, outside the vocabulary of 320 tokens \
             (metadata `config`)",
        );
        refused(
            &g,
            &|b| b.prompt_tokens[2] = 320,
            "`prompt_tokens` holds token id 320 at position 2, outside the vocabulary",
        );
        // the logits' rows cover the vocabulary; a vocabulary that is not a count bounds nothing
        refused(
            &g,
            &|b| b.logits = b.logits.slice(ndarray::s![.., ..319]).to_owned(),
            "expected [6, 320]",
        );
        for (bad, shown) in [
            ("-1", "-1"),
            ("0", "0"),
            ("\"320\"", "\"320\""),
            ("3.5", "3.5"),
            // a float to serde_json, as to the Python reader
            ("-0", "-0.0"),
        ] {
            refused(
                &g,
                &|b| {
                    let mut config: serde_json::Value =
                        serde_json::from_str(&b.config_json).unwrap();
                    config["vocab_size"] = serde_json::from_str(bad).unwrap();
                    b.config_json = config.to_string();
                    b.config_hash = crate::base::config::hash_of_json(&b.config_json);
                },
                &format!("vocab_size {shown} is not a count of tokens"),
            );
        }
    }

    /// The metadata of a version-1 greedy golden of `tiny` with this `config`.
    fn version_1(config: &str) -> HashMap<String, String> {
        let hash = crate::base::config::hash_of_json(config);
        HashMap::from(
            [
                ("format", GOLDEN_FORMAT),
                ("format_version", "1"),
                ("mode", "greedy"),
                ("model", "tiny"),
                ("config_hash", &hash),
                ("config", config),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    /// Token lists of two dimensions (`[1, T]` would read as T ids) and a `config` that is not a
    /// JSON object are refused, naming the file and what.
    #[test]
    fn token_lists_and_the_config_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        let write = |tokens_shape: Vec<usize>, config: &str| {
            let ids: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
            let logits: Vec<u8> = [0f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
            let views = [
                ("prompt_tokens", Dtype::I64, vec![2], &ids[..]),
                ("tokens", Dtype::I64, tokens_shape, &ids[..]),
                ("logits", Dtype::F32, vec![2, 2], &logits[..]),
            ]
            .map(|(name, dtype, shape, data)| {
                (name, tensor_view("t", dtype, shape, data).unwrap())
            });
            safetensors::serialize_to_file(views, Some(version_1(config)), &path).unwrap();
            Golden::read(&path).map_err(|e| e.to_string())
        };
        assert!(write(vec![2], "{}").is_ok());
        let err = write(vec![1, 2], "{}").unwrap_err();
        assert!(
            err.contains("g.safetensors") && err.contains("`tokens` has shape [1, 2]"),
            "{err}"
        );
        for config in ["{not json", "[1]"] {
            let err = write(vec![2], config).unwrap_err();
            assert!(
                err.contains("metadata `config` is not a JSON object"),
                "{err}"
            );
        }
    }

    /// No tokens, and logits `[0, 2^63]`: zero bytes, so safetensors accepts the shape, but no
    /// array has it.
    #[test]
    fn logits_of_no_rows_and_too_many_columns_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        let one = 1i64.to_le_bytes();
        let views = [
            ("prompt_tokens", Dtype::I64, vec![1], &one[..]),
            ("tokens", Dtype::I64, vec![0], &[][..]),
            ("logits", Dtype::F32, vec![0, 1 << 63], &[][..]),
        ]
        .map(|(name, dtype, shape, data)| (name, tensor_view("t", dtype, shape, data).unwrap()));
        safetensors::serialize_to_file(views, Some(version_1("{}")), &path).unwrap();
        let err = Golden::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("g.safetensors")
                && err.contains("tensor `logits` of shape [0, 9223372036854775808]"),
            "{err}"
        );
    }
}
