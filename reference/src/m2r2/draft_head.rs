//! The pruned draft head of FLOPs-aware drafting (docs/m2r2/cost.md).
//!
//! For a small model the LM head dominates a draft step (SmolLM2: 28.3 M of about 78 M
//! multiply-adds). The draft only has to guess the verifier's token, so it may score a subset of
//! the vocabulary: `K` token ids (chosen by `m2r2 draft-head`, the most frequent response tokens of
//! the distillation data), stored as `draft_head.json` in an M2R2 weights folder. The verifier keeps
//! the full head, so output stays lossless; only acceptance can drop.
//!
//! ```text
//! pruned[k] = FinalNorm(u_gd) . W_head[subset[k]]            K dot products instead of V
//! draft logits [V] = pruned[k] at subset[k], -inf elsewhere
//! ```
//!
//! Each pruned logit is the same dot product as the full head's (bitwise), so the pruned draft is
//! the full exit argmax restricted to the subset. As a `[V]` vector with `-inf` outside the subset,
//! the draft logits feed the speculative loop unchanged: greedy drafts pick from the subset, and
//! speculative sampling sees `q = 0` outside it (a token the draft cannot propose is only reached
//! through the residual `norm(max(0, p - q))`, which is then `p` there: still lossless).
//! The confidence and entropy gate scores are computed on these pruned logits (the distribution
//! over the subset); the entropy score keeps its `ln V` normalisation.
//!
//! File format: `{"tokens": [id, ...]}`, ids strictly ascending, each `< V`, at least one.

use crate::base::matmul::linear_out_rows;
use crate::base::model::{Model, Output};
use crate::base::ops::argmax;
use crate::base::work::Work;
use crate::error::{Error, Result};
use ndarray::{Array2, ArrayView2};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File of the pruned head inside an M2R2 weights folder (and an ONNX export folder).
pub const DRAFT_HEAD_FILE: &str = "draft_head.json";

/// The token ids the pruned draft head scores (strictly ascending).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftHead {
    pub tokens: Vec<u32>,
}

impl DraftHead {
    /// A head over `tokens`, checked against a vocabulary of `vocab_size` (`file` names the source
    /// in errors).
    ///
    /// # Errors
    /// An empty list, ids not strictly ascending (unsorted or repeated), an id `>= vocab_size`.
    pub fn new(tokens: Vec<u32>, vocab_size: usize, file: &str) -> Result<Self> {
        if tokens.is_empty() {
            return Err(Error::config(
                file,
                "the draft head's token list is empty: it needs at least one token id",
            ));
        }
        if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
            let what = if w[0] == w[1] {
                "repeats"
            } else {
                "is not sorted:"
            };
            return Err(Error::config(
                file,
                format!(
                    "the draft head's token ids must be strictly ascending; the list {what} {} then {}",
                    w[0], w[1]
                ),
            ));
        }
        let last = *tokens.last().expect("not empty");
        if last as usize >= vocab_size {
            return Err(Error::config(
                file,
                format!(
                    "the draft head names token id {last}, but the vocabulary has {vocab_size} tokens"
                ),
            ));
        }
        Ok(DraftHead { tokens })
    }

    /// Parse the JSON text of a `draft_head.json` (e.g. embedded with `include_bytes!`); `file`
    /// names it in errors.
    pub fn from_json(bytes: &[u8], vocab_size: usize, file: &str) -> Result<Self> {
        let head: DraftHead = serde_json::from_slice(bytes).map_err(|e| {
            Error::config(
                file,
                format!("not a draft head (expected {{\"tokens\": [ids]}}): {e}"),
            )
        })?;
        DraftHead::new(head.tokens, vocab_size, file)
    }

    /// Read and check `path`.
    pub fn load(path: &Path, vocab_size: usize) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        DraftHead::from_json(&bytes, vocab_size, &path.display().to_string())
    }

    /// Write `dir/draft_head.json`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(DRAFT_HEAD_FILE);
        let text = serde_json::to_string(self).expect("serialisable");
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
    }

    /// `K`, the number of token ids scored.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a head has at least one token (checked at construction).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The draft token: the argmax of full logits restricted to the subset.
    ///
    /// # Shapes
    /// - `logits`: `[V]`
    pub fn draft(&self, logits: &[f32]) -> u32 {
        let sub: Vec<f32> = self.tokens.iter().map(|&t| logits[t as usize]).collect();
        self.tokens[argmax(&sub)]
    }

    /// The subset's logits `FinalNorm(u) . W_head[subset[k]]` of `model`, and the work: the final
    /// norm and `K` head rows per row of `u`.
    ///
    /// # Shapes
    /// - `u`: `[R, D]` -> `[R, K]`
    pub fn subset_logits(&self, model: &Model, u: ArrayView2<f32>) -> Output {
        let h = model.final_norm(u);
        let head = model.weights.lm_head();
        let work = Work::read(model.weights.final_norm.len())
            + Work::matmul(u.nrows(), self.len(), head.ncols(), false);
        Output {
            logits: linear_out_rows(h.view(), head.view(), &self.tokens),
            work,
        }
    }

    /// Scatter subset logits into a full-vocabulary row: `out[subset[k]] = sub[k]`, `-inf`
    /// elsewhere.
    ///
    /// # Shapes
    /// - `sub`: `[K]` -> `[V]`
    ///
    /// # Panics
    /// If `sub.len() != K` (a caller's bug).
    pub fn scatter(&self, sub: &[f32], vocab_size: usize) -> Vec<f32> {
        assert_eq!(sub.len(), self.len(), "subset logits of the wrong length");
        let mut out = vec![f32::NEG_INFINITY; vocab_size];
        for (&t, &x) in self.tokens.iter().zip(sub) {
            out[t as usize] = x;
        }
        out
    }

    /// The pruned draft logits of `model`: [`subset_logits`](Self::subset_logits) scattered into
    /// `[V]` rows with `-inf` outside the subset.
    ///
    /// # Shapes
    /// - `u`: `[R, D]` -> `[R, V]`
    pub fn exit_logits(&self, model: &Model, u: ArrayView2<f32>) -> Output {
        let Output { logits: sub, work } = self.subset_logits(model, u);
        let v = model.config.vocab_size;
        let rows: Vec<f32> = sub
            .rows()
            .into_iter()
            .flat_map(|row| self.scatter(&row.to_vec(), v))
            .collect();
        let out = Array2::from_shape_vec((u.nrows(), v), rows).expect("R rows of V logits");
        Output { logits: out, work }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use proptest::prelude::*;

    fn err(text: &str, vocab: usize) -> String {
        DraftHead::from_json(text.as_bytes(), vocab, "x/draft_head.json")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn validation_errors_name_the_file() {
        for (text, want) in [
            ("not json", "not a draft head"),
            (
                "{\"tokens\": [1, 2], \"extra\": 1}",
                "unknown field `extra`",
            ),
            ("{\"tokens\": [-1]}", "not a draft head"),
            ("{\"tokens\": []}", "empty"),
            ("{\"tokens\": [3, 1]}", "is not sorted: 3 then 1"),
            ("{\"tokens\": [1, 1]}", "repeats 1 then 1"),
            (
                "{\"tokens\": [1, 8]}",
                "token id 8, but the vocabulary has 8",
            ),
        ] {
            let e = err(text, 8);
            assert!(e.contains(want), "{text}: {e}");
            assert!(e.starts_with("x/draft_head.json: "), "{e}");
        }
        let ok = DraftHead::from_json(b"{\"tokens\": [0, 7]}", 8, "f").unwrap();
        assert_eq!(ok.tokens, vec![0, 7]);
    }

    #[test]
    fn save_load_round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let head = DraftHead::new(vec![2, 5, 9], 10, "t").unwrap();
        head.save(dir.path()).unwrap();
        let path = dir.path().join(DRAFT_HEAD_FILE);
        assert_eq!(DraftHead::load(&path, 10).unwrap(), head);
        let e = DraftHead::load(&path, 9).unwrap_err().to_string();
        assert!(
            e.contains(DRAFT_HEAD_FILE) && e.contains("token id 9"),
            "{e}"
        );
        let e = DraftHead::load(&dir.path().join("nope.json"), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.json"), "{e}");
    }

    #[test]
    fn draft_and_scatter_hand_computed() {
        let head = DraftHead::new(vec![1, 3, 5], 8, "t").unwrap();
        // the full argmax (7) is outside the subset: the best subset token wins
        assert_eq!(head.draft(&[0.0, 0.5, 0.0, 0.7, 0.0, 0.1, 0.0, 9.0]), 3);
        let ninf = f32::NEG_INFINITY;
        assert_eq!(
            head.scatter(&[1.0, 2.0, 3.0], 7),
            vec![ninf, 1.0, ninf, 2.0, ninf, 3.0, ninf]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The pruned logits are the full exit logits on the subset, bit for bit, and -inf
        /// elsewhere; the work counts K head rows instead of V.
        #[test]
        fn pruned_logits_are_the_full_logits_on_the_subset(
            moe in any::<bool>(),
            rows in 1usize..4,
            pick in proptest::collection::btree_set(0u32..256, 1..40),
            seed in any::<u64>(),
        ) {
            let name = if moe { "tiny-moe" } else { "tiny" };
            let model = builtin::builtin(name).unwrap();
            let (v, d) = (model.config.vocab_size, model.config.hidden_size);
            let tokens: Vec<u32> = pick.into_iter().filter(|&t| (t as usize) < v).collect();
            prop_assume!(!tokens.is_empty());
            let head = DraftHead::new(tokens, v, "t").unwrap();
            let u = Array2::from_shape_fn((rows, d), |(r, c)| {
                let x = (seed ^ ((r * d + c) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 2001;
                x as f32 / 500.0 - 2.0
            });
            let Output { logits: full, work: full_work } = model.head(u.view());
            let Output { logits: pruned, work } = head.exit_logits(&model, u.view());
            prop_assert_eq!(pruned.dim(), (rows, v));
            for r in 0..rows {
                for t in 0..v {
                    let want = if head.tokens.binary_search(&(t as u32)).is_ok() {
                        full[[r, t]]
                    } else {
                        f32::NEG_INFINITY
                    };
                    prop_assert_eq!(pruned[[r, t]].to_bits(), want.to_bits());
                }
            }
            let saved = Work::matmul(rows, v - head.len(), d, false);
            prop_assert_eq!(work.flops() + saved.flops(), full_work.flops());
            prop_assert_eq!(work.weight_bytes + saved.weight_bytes, full_work.weight_bytes);
        }
    }
}
