//! M2R2 goldens on disk: the extra tensors and metadata of the early-exit and speculative modes
//! (layouts in the [module docs](super)), and their reader; token trees are handed to
//! [`tree_file`](super::tree_file).

use super::rounds::{check_emitted, check_round_tokens};
use super::tree_file;
use super::{GraphOutputs, M2r2Golden, M2r2Record, RoundTensors, WeightsId, logits_rows};
use crate::decode::speculative::DraftLength;
use crate::error::{Error, Result};
use crate::golden::file::{GoldenFile, f32_bytes};
use crate::m2r2::exit_threshold::ExitThreshold;
use ndarray::Array2;
use safetensors::Dtype;

impl M2r2Golden {
    /// Extra tensors of this mode, `(name, dtype, shape, bytes)`.
    pub(in crate::golden) fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
        let ints = |v: &mut dyn Iterator<Item = &i64>| -> Vec<u8> {
            v.flat_map(|x| x.to_le_bytes()).collect()
        };
        match &self.record {
            M2r2Record::EarlyExit {
                exit_gate,
                gate_scores,
                ..
            } => vec![
                (
                    "exit_gate".into(),
                    Dtype::I64,
                    vec![exit_gate.len()],
                    ints(&mut exit_gate.iter()),
                ),
                (
                    "gate_scores".into(),
                    Dtype::F32,
                    gate_scores.shape().to_vec(),
                    f32_bytes(gate_scores.iter()),
                ),
            ],
            M2r2Record::Speculative { rounds, graphs, .. } => vec![
                (
                    "round_drafted".into(),
                    Dtype::I64,
                    rounds.drafted.shape().to_vec(),
                    ints(&mut rounds.drafted.iter()),
                ),
                (
                    "round_accepted".into(),
                    Dtype::I64,
                    vec![rounds.accepted.len()],
                    ints(&mut rounds.accepted.iter()),
                ),
                (
                    "round_base_token".into(),
                    Dtype::I64,
                    vec![rounds.base_token.len()],
                    ints(&mut rounds.base_token.iter()),
                ),
                (
                    "round_scores".into(),
                    Dtype::F32,
                    rounds.scores.shape().to_vec(),
                    f32_bytes(rounds.scores.iter()),
                ),
            ]
            .into_iter()
            .chain(graphs.iter().flat_map(|g| {
                [
                    (
                        "verify_logits".to_string(),
                        Dtype::F32,
                        g.verify_logits.shape().to_vec(),
                        f32_bytes(g.verify_logits.iter()),
                    ),
                    (
                        "draft_logits".to_string(),
                        Dtype::F32,
                        g.draft_logits.shape().to_vec(),
                        f32_bytes(g.draft_logits.iter()),
                    ),
                ]
            }))
            .collect(),
            M2r2Record::SpeculativeTree {
                recipe,
                rounds,
                graphs,
            } => tree_file::tree_tensors(recipe, rounds, graphs),
        }
    }

    /// Extra metadata of this mode.
    pub(in crate::golden) fn metadata(&self) -> Vec<(String, String)> {
        let mut meta = vec![
            ("m2r2_config".to_string(), self.config_json.clone()),
            ("m2r2_hash".to_string(), self.weights.hash.clone()),
        ];
        if let Some(w) = &self.weights.without_defaults {
            meta.push(("m2r2_weights_hash".to_string(), w.clone()));
        }
        match &self.record {
            M2r2Record::EarlyExit {
                gate,
                threshold,
                kv_policy,
                ..
            } => {
                meta.push(("gate".into(), gate.to_string()));
                // f32's Display is the shortest text that parses back to the same value.
                meta.push(("threshold".into(), threshold.to_string()));
                meta.push(("kv_policy".into(), kv_policy.to_string()));
            }
            M2r2Record::Speculative {
                draft_gate,
                gate,
                draft_length,
                ..
            } => {
                meta.push(("draft_gate".into(), draft_gate.to_string()));
                meta.push(("gate".into(), gate.map_or("none".into(), |g| g.to_string())));
                meta.push(("draft_max".into(), draft_length.max().to_string()));
                match draft_length {
                    DraftLength::Fixed(_) => meta.push(("draft_length".into(), "fixed".into())),
                    DraftLength::Dynamic { threshold, .. } => {
                        meta.push(("draft_length".into(), "dynamic".into()));
                        meta.push(("draft_threshold".into(), threshold.to_string()));
                    }
                }
            }
            M2r2Record::SpeculativeTree { recipe, .. } => {
                meta.extend(tree_file::tree_metadata(recipe));
            }
        }
        meta
    }

    /// Read the mode's tensors and metadata; `n` is the number of tokens, `vocab` the config's
    /// vocabulary (when it has one), which bounds the rounds' token ids.
    pub(in crate::golden) fn read(
        file: &GoldenFile<'_>,
        mode: &str,
        n: usize,
        version: u32,
        vocab: Option<u64>,
    ) -> Result<M2r2Golden> {
        let bad = |key: &str, value: &str| file.bad(key, value);
        let parsed = |key: &str| -> Result<String> { file.field(key) };
        let number = |key: &str| -> Result<f32> {
            let v = parsed(key)?;
            v.parse().map_err(|_| bad(key, &v))
        };
        let config_json = parsed("m2r2_config")?;
        let config: crate::m2r2::config::M2r2Config = serde_json::from_str(&config_json)
            .map_err(|e| Error::format(&file.label, format!("metadata `m2r2_config`: {e}")))?;
        let j = config.num_gates();
        let record = match mode {
            "early-exit" => {
                let (shape, exit_gate) = file.i64s("exit_gate")?;
                file.expect_shape("exit_gate", &shape, &[n])?;
                let (shape, scores) = file.f32s("gate_scores")?;
                file.expect_shape("gate_scores", &shape, &[n, j])?;
                let gate = parsed("gate")?;
                let policy = parsed("kv_policy")?;
                M2r2Record::EarlyExit {
                    gate: gate.parse().map_err(|_| bad("gate", &gate))?,
                    threshold: {
                        let t = parsed("threshold")?;
                        let threshold: ExitThreshold =
                            t.parse().map_err(|_| bad("threshold", &t))?;
                        threshold
                            .check(j, "metadata `threshold`")
                            .map_err(|_| bad("threshold", &t))?;
                        threshold
                    },
                    kv_policy: policy.parse().map_err(|_| bad("kv_policy", &policy))?,
                    exit_gate,
                    gate_scores: Array2::from_shape_vec((n, j), scores).expect("shape checked"),
                }
            }
            "speculative" if parsed("draft_length")? == "tree" => {
                tree_file::read_tree(file, n, version, vocab)?
            }
            "speculative" => {
                let draft_gate = parsed("draft_gate")?;
                let draft_gate: usize = draft_gate
                    .parse()
                    .map_err(|_| bad("draft_gate", &draft_gate))?;
                let gate = match parsed("gate")?.as_str() {
                    "none" => None,
                    g => Some(g.parse().map_err(|_| bad("gate", g))?),
                };
                // `M + 1` columns of `round_scores` must fit an array even with no rounds, where
                // the file's bytes do not bound `M`.
                let max = parsed("draft_max")?;
                let max: usize = max
                    .parse()
                    .ok()
                    .filter(|&m| m < isize::MAX as usize)
                    .ok_or_else(|| bad("draft_max", &max))?;
                let draft_length = match parsed("draft_length")?.as_str() {
                    "fixed" => DraftLength::Fixed(max),
                    "dynamic" => DraftLength::Dynamic {
                        max,
                        gate: gate.ok_or_else(|| bad("gate", "none"))?,
                        threshold: number("draft_threshold")?,
                    },
                    other => return Err(bad("draft_length", other)),
                };
                let (shape, accepted) = file.i64s("round_accepted")?;
                let r = accepted.len();
                file.expect_shape("round_accepted", &shape, &[r])?;
                // Every token after the first comes from a round. With a round, the bytes of
                // `round_drafted` bound `M`, which sizes the rounds a check recomputes.
                if r == 0 && n > 1 {
                    return Err(Error::format(
                        &file.label,
                        format!("tensor `round_accepted` has no rounds for {n} tokens"),
                    ));
                }
                let (shape, base_token) = file.i64s("round_base_token")?;
                file.expect_shape("round_base_token", &shape, &[r])?;
                let (shape, drafted) = file.i64s("round_drafted")?;
                file.expect_shape("round_drafted", &shape, &[r, max])?;
                let (shape, scores) = file.f32s("round_scores")?;
                file.expect_shape("round_scores", &shape, &[r, max + 1])?;
                // Shapes checked against the file's, whose element counts safetensors
                // checked against its bytes (and `max + 1 <= isize::MAX` when `r` is 0).
                let rounds = RoundTensors {
                    drafted: Array2::from_shape_vec((r, max), drafted).expect("shape checked"),
                    accepted,
                    base_token,
                    scores: Array2::from_shape_vec((r, max + 1), scores).expect("shape checked"),
                };
                let fixed = matches!(draft_length, DraftLength::Fixed(_));
                check_round_tokens(file, &rounds, fixed, vocab)?;
                for (round, &a) in rounds.accepted.iter().enumerate() {
                    let drafts = rounds.drafted_in(round).len();
                    if !(0..=drafts as i64).contains(&a) {
                        return Err(Error::format(
                            &file.label,
                            format!(
                                "tensor `round_accepted`: round {round} accepted {a} of its \
                                 {drafts} drafts"
                            ),
                        ));
                    }
                }
                check_emitted(file, &rounds.accepted, n)?;
                let graphs = match version {
                    3.. => Some(Box::new(GraphOutputs {
                        verify_logits: logits_rows(
                            file,
                            "verify_logits",
                            rounds.verify_rounds().len(),
                        )?,
                        draft_logits: logits_rows(
                            file,
                            "draft_logits",
                            rounds.proposal_rounds().len(),
                        )?,
                    })),
                    _ => {
                        // a file that holds them but says an older version (edited?) would have
                        // them skipped as "not recorded"
                        let held = ["verify_logits", "draft_logits"]
                            .into_iter()
                            .find(|name| file.st.tensor(name).is_ok());
                        if let Some(name) = held {
                            return Err(Error::format(
                                &file.label,
                                format!(
                                    "holds `{name}`, which format version {version} does not \
                                     record (version 3 does): is `format_version` edited?"
                                ),
                            ));
                        }
                        None
                    }
                };
                M2r2Record::Speculative {
                    draft_gate,
                    gate,
                    draft_length,
                    rounds,
                    graphs,
                }
            }
            other => unreachable!("mode `{other}`: Golden::read reads the M2R2 modes alone"),
        };
        Ok(M2r2Golden {
            config_json,
            weights: WeightsId {
                hash: parsed("m2r2_hash")?,
                without_defaults: match file.meta.get("m2r2_weights_hash") {
                    Some(w) if w.len() == 16 && w.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        Some(w.clone())
                    }
                    Some(w) => return Err(bad("m2r2_weights_hash", w)),
                    None => None,
                },
            },
            record,
        })
    }
}
