//! Golden files of the M2R2 modes (format version 2): an early-exit or self-speculative greedy
//! decode with every step's decisions, so a deployment can check its M2R2 behaviour against the
//! reference.
//!
//! Dimensions: `n` emitted tokens, `J` gates, `V` vocabulary, `R` verification rounds, `M` the
//! longest draft (`draft_max`).
//!
//! | mode          | tensor             | dtype | shape      | meaning                                         |
//! |---------------|--------------------|-------|------------|-------------------------------------------------|
//! | both          | `logits`           | F32   | `[n, V]`   | the logits token i was emitted from             |
//! | `early-exit`  | `exit_gate`        | I64   | `[n]`      | gate token i exited at (1-based), 0 = all layers |
//! | `early-exit`  | `gate_scores`      | F32   | `[n, J]`   | gate scores, NaN where a gate was not evaluated |
//! | `speculative` | `round_drafted`    | I64   | `[R, M]`   | drafted tokens, padded with -1                  |
//! | `speculative` | `round_accepted`   | I64   | `[R]`      | drafted tokens accepted                         |
//! | `speculative` | `round_base_token` | I64   | `[R]`      | the base token after them (correction or bonus) |
//! | `speculative` | `round_scores`     | F32   | `[R, M+1]` | draft gate scores (dynamic drafting), NaN pad   |
//! | `speculative` | `verify_logits`    | F32   | `[T, V]`   | every verified row (format 3), see below        |
//! | `speculative` | `draft_logits`     | F32   | `[Q, V]`   | the draft's logits at every proposal (format 3) |
//!
//! `verify_logits` holds the prompt's last row, then round by round every row the verifier
//! finished (the round's first token and each drafted one, accepted or not): `T = 1 + Σ_r
//! (d_r + 1)` with `d_r` the drafts of round r. `draft_logits` holds the draft's exit logits at
//! every proposal, round by round: `Q = Σ_r p_r`, `p_r` the larger of `d_r` and the scores of
//! round r (a dynamic draft stops at a proposal whose score is under the threshold). With a
//! pruned draft head the draft's logits are `-inf` outside its tokens.
//!
//! Metadata of both modes: `m2r2_config` (the [`M2r2Config`](crate::m2r2::config::M2r2Config) as
//! JSON, with its `bridge` entry when the drafts read the verified state), `m2r2_hash`
//! ([`weights_hash`], the bridge's maps included) and, since the drafting defaults were left out
//! of a second hash, `m2r2_weights_hash` ([`weights_hash_without_defaults`]; see [`WeightsId`]).
//! Early exit: `gate`, `threshold`, `kv_policy`.
//! Speculative: `draft_gate` (1-based), `gate` (scored at each proposal, or `none`),
//! `draft_length` (`fixed` or `dynamic`), `draft_max`, and `draft_threshold` when dynamic.
//!
//! Logits. Early exit: row i is the exit logits `LMHead(FinalNorm(u_g))` of the gate token i exited
//! at, or the final logits when it ran all layers. Speculative: the base model's (verify) logits
//! each token was emitted from (row 0: the prompt's).
//!
//! Speculative goldens that draft a token tree (`draft_length` = `tree`, format version 4; 5 when
//! the tree changes from round to round) record the tree's rounds instead of `round_drafted` and
//! `round_scores`: see [`tree`].
use super::file::{GoldenFile, f32_bytes};
use crate::decode::early_exit::KvPolicy;
use crate::decode::speculative::{DraftLength, SpeculativeOutput};
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::exit_threshold::ExitThreshold;
use crate::m2r2::weights::M2r2Weights;
use ndarray::Array2;
use safetensors::Dtype;
use sha2::{Digest, Sha256};

mod check;
mod record;
#[cfg(test)]
mod tests;
pub mod tree;
mod tree_compare;
mod tree_file;
#[cfg(test)]
mod tree_grown_tests;
mod tree_replay;
mod tree_rounds;
#[cfg(test)]
mod tree_tests;
#[cfg(test)]
mod weights_id_tests;

pub use check::{EngineGraphs, REFERENCE, SpeculativeEngine};
pub(super) use check::{compare_graph_outputs, compare_rounds, compare_scores};
pub use record::early_exit_logits;
pub use tree::{TreeEngine, TreeRecipe, TreeRounds};
pub(super) use tree_compare::{compare_tree_graph_outputs, compare_tree_rounds};

/// What an M2R2 golden records besides the greedy fields.
#[derive(Clone, Debug, PartialEq)]
pub struct M2r2Golden {
    /// `m2r2_config`: the M2R2 settings as JSON
    pub config_json: String,
    /// `m2r2_hash` and `m2r2_weights_hash`: the M2R2 weights recorded with.
    pub weights: WeightsId,
    pub record: M2r2Record,
}

/// Which M2R2 weights a golden was recorded with, or an engine runs: two hashes of them.
///
/// The first, `m2r2_hash`, covers the whole `m2r2_config.json`, decoding defaults included, so
/// re-choosing the drafting policy (`tune-drafting --write`) or an early-exit threshold changed it
/// and orphaned every golden of those weights. The second, `m2r2_weights_hash`, leaves out the
/// defaults a golden records for itself. Two identities match by the second when both have it
/// (goldens and exports from before it have only the first), else by the first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsId {
    /// `m2r2_hash`: [`weights_hash`].
    pub hash: String,
    /// `m2r2_weights_hash`: [`weights_hash_without_defaults`]; `None` in goldens and export
    /// manifests written before it.
    pub without_defaults: Option<String>,
}

impl WeightsId {
    /// Both hashes of `weights`.
    pub fn of(weights: &M2r2Weights) -> Self {
        WeightsId {
            hash: weights_hash(weights),
            without_defaults: Some(weights_hash_without_defaults(weights)),
        }
    }

    /// Whether these are the weights `recorded` names: by `m2r2_weights_hash` when both have it,
    /// else by `m2r2_hash`.
    pub fn matches(&self, recorded: &WeightsId) -> bool {
        match (&self.without_defaults, &recorded.without_defaults) {
            (Some(a), Some(b)) => a == b,
            _ => self.hash == recorded.hash,
        }
    }
}

/// `hash H` (`hash H, weights hash W` when it has the second): how messages name an identity.
impl std::fmt::Display for WeightsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hash {}", self.hash)?;
        if let Some(w) = &self.without_defaults {
            write!(f, ", weights hash {w}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum M2r2Record {
    EarlyExit {
        gate: GateKind,
        /// Shared, or per gate (metadata `threshold` = `A,B,...`, written since per-gate
        /// thresholds; older readers refuse such files by name).
        threshold: ExitThreshold,
        kv_policy: KvPolicy,
        /// `[n]` 1-based exit gate, 0 = all layers
        exit_gate: Vec<i64>,
        /// `[n, J]` NaN where not evaluated
        gate_scores: Array2<f32>,
    },
    Speculative {
        /// 1-based
        draft_gate: usize,
        /// The gate scored at each proposal (needed by dynamic drafting).
        gate: Option<GateKind>,
        draft_length: DraftLength,
        rounds: RoundTensors,
        /// What the verifier and the draft produced along the rounds; `None` in files before
        /// format version 3.
        graphs: Option<Box<GraphOutputs>>,
    },
    /// Speculative decoding with a token tree (format version 4; 5 when rounds grow or carry a
    /// lookup branch: [`tree`]).
    SpeculativeTree {
        /// The shape, the draft gate, and how each round's tree is chosen.
        recipe: TreeRecipe,
        rounds: TreeRounds,
        /// `verify_logits`: the prompt's row, then every node of every round; `draft_logits`:
        /// every proposing node of every round
        graphs: Box<GraphOutputs>,
    },
}

/// What each graph of a speculative deployment produced along the recorded rounds (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphOutputs {
    /// `[T, V]`: the prompt's last row, then every verified row, round by round
    pub verify_logits: Array2<f32>,
    /// `[Q, V]`: the draft's logits at every proposal, round by round
    pub draft_logits: Array2<f32>,
}

/// The speculative rounds as padded tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundTensors {
    /// `[R, M]` padded with -1
    pub drafted: Array2<i64>,
    /// `[R]`
    pub accepted: Vec<i64>,
    /// `[R]`
    pub base_token: Vec<i64>,
    /// `[R, M+1]` padded with NaN
    pub scores: Array2<f32>,
}

impl RoundTensors {
    /// Rounds recorded.
    pub fn len(&self) -> usize {
        self.accepted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }

    /// The tokens round `r` drafted (its row of `drafted` without the padding).
    pub fn drafted_in(&self, r: usize) -> Vec<i64> {
        self.drafted
            .row(r)
            .iter()
            .copied()
            .filter(|&t| t >= 0)
            .collect()
    }

    /// Proposals the draft made in round `r`: its drafts, or one more where a dynamic draft
    /// stopped at a score under the threshold.
    pub fn proposals(&self, r: usize) -> usize {
        let scored = self.scores.row(r).iter().filter(|s| !s.is_nan()).count();
        self.drafted_in(r).len().max(scored)
    }

    /// The round of each row of `verify_logits` (`None` for the prompt's row).
    pub fn verify_rounds(&self) -> Vec<Option<usize>> {
        let mut rows = vec![None];
        for r in 0..self.len() {
            rows.extend(std::iter::repeat_n(Some(r), self.drafted_in(r).len() + 1));
        }
        rows
    }

    /// The round of each row of `draft_logits`.
    pub fn proposal_rounds(&self) -> Vec<Option<usize>> {
        (0..self.len())
            .flat_map(|r| std::iter::repeat_n(Some(r), self.proposals(r)))
            .collect()
    }

    /// The round that emitted each of `n` tokens (`None` for the first, from the prompt's row).
    pub fn step_rounds(&self, n: usize) -> Vec<Option<usize>> {
        step_rounds(&self.accepted, n)
    }

    fn from_output(out: &SpeculativeOutput, max: usize) -> RoundTensors {
        let r = out.rounds.len();
        let mut drafted = Array2::from_elem((r, max), -1i64);
        let mut scores = Array2::from_elem((r, max + 1), f32::NAN);
        for (i, round) in out.rounds.iter().enumerate() {
            for (k, &t) in round.drafted.iter().enumerate() {
                drafted[[i, k]] = i64::from(t);
            }
            for (k, &s) in round.scores.iter().enumerate() {
                scores[[i, k]] = s;
            }
        }
        RoundTensors {
            drafted,
            accepted: out.rounds.iter().map(|r| r.accepted as i64).collect(),
            base_token: out.rounds.iter().map(|r| i64::from(r.base_token)).collect(),
            scores,
        }
    }
}

/// The round that emitted each of `n` tokens, rounds accepting `accepted` drafts each (`None`
/// for the first token, from the prompt's row).
fn step_rounds(accepted: &[i64], n: usize) -> Vec<Option<usize>> {
    let mut steps = vec![None; n.min(1)];
    for (r, &accepted) in accepted.iter().enumerate() {
        let emitted = (accepted.max(0) as usize + 1).min(n.saturating_sub(steps.len()));
        steps.extend(std::iter::repeat_n(Some(r), emitted));
    }
    steps
}

/// SHA-256 (first 8 bytes, hex) of the M2R2 settings, every adapter and ARLA tensor's bytes and
/// the pruned draft head's token ids (when there is one), in a fixed order: a check with other
/// adapters, gates or draft head is refused. `m2r2_hash` of goldens and export manifests.
pub fn weights_hash(weights: &M2r2Weights) -> String {
    let config = serde_json::to_string(&weights.config).expect("config serialises");
    hash_with(&config, weights)
}

/// The decoding defaults of `m2r2_config.json`, which a golden records for itself (or, for
/// `seed`, which only says where the weights came from).
const DECODING_DEFAULTS: [&str; 8] = [
    "draft_gate",
    "draft_len",
    "dynamic_draft",
    "draft_tree",
    "prompt_lookup",
    "onnx_drafting",
    "early_exit",
    "seed",
];

/// [`weights_hash`] with the settings' decoding defaults left out (the drafting fields,
/// `early_exit`, `arla.threshold`, `seed`): what the weights compute, whatever they draft or exit
/// by default. `m2r2_weights_hash` of goldens and export manifests.
pub fn weights_hash_without_defaults(weights: &M2r2Weights) -> String {
    let mut config = serde_json::to_value(&weights.config).expect("config serialises");
    let object = config.as_object_mut().expect("the config is a JSON object");
    for key in DECODING_DEFAULTS {
        object.remove(key);
    }
    if let Some(arla) = object.get_mut("arla").and_then(|a| a.as_object_mut()) {
        arla.remove("threshold");
    }
    hash_with(&format!("weights {config}"), weights)
}

/// The hash of `config` (the settings as text) and every tensor of `weights`.
fn hash_with(config: &str, weights: &M2r2Weights) -> String {
    let mut h = Sha256::new();
    let mut tensor = |name: &str, values: &mut dyn Iterator<Item = &f32>| {
        h.update(name.as_bytes());
        for v in values {
            h.update(v.to_le_bytes());
        }
    };
    tensor(config, &mut std::iter::empty());
    let acc = &weights.accelerator;
    let header = format!(
        "accelerator rank {} alpha {} rslora {} targets {:?}",
        acc.rank, acc.alpha, acc.use_rslora, acc.targets
    );
    tensor(&header, &mut std::iter::empty());
    for (l, layer) in acc.layers.iter().enumerate() {
        for (target, lora) in layer.iter().flat_map(|a| &a.loras) {
            // A pair's own alpha (PEFT's alpha_pattern) is hashed only where it differs from the
            // default, so the hashes of single-alpha weights stay as they were. Its rank is the
            // count of A's values.
            let own_alpha = if lora.alpha() != acc.alpha {
                format!(" alpha {}", lora.alpha())
            } else {
                String::new()
            };
            tensor(&format!("{l}.{target}.a{own_alpha}"), &mut lora.a().iter());
            tensor(&format!("{l}.{target}.b"), &mut lora.b().iter());
        }
    }
    if let Some(arla) = &weights.arla {
        tensor("arla.norm", &mut arla.norm.iter());
        tensor("arla.proj", &mut arla.proj.iter());
        tensor("arla.gate_embed", &mut arla.gate_embed.iter());
        tensor("arla.wq", &mut arla.wq.iter());
        tensor("arla.wk", &mut arla.wk.iter());
        tensor("arla.wv", &mut arla.wv.iter());
        tensor("arla.wo", &mut arla.wo.iter());
        tensor("arla.bo", &mut std::iter::once(&arla.bo));
    }
    if let Some(bridge) = &weights.bridge {
        // The bridge changes the drafts; weights without one hash as they always did.
        for (site, lora) in &bridge.maps {
            tensor(&format!("bridge.{}.a", site.name()), &mut lora.a().iter());
            tensor(&format!("bridge.{}.b", site.name()), &mut lora.b().iter());
        }
    }
    if let Some(head) = &weights.draft_head {
        // The pruned draft head changes the drafts (and so the rounds) of speculative decoding.
        h.update(format!("draft_head {:?}", head.tokens).as_bytes());
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl M2r2Golden {
    /// Extra tensors of this mode, `(name, dtype, shape, bytes)`.
    pub(super) fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
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

    /// Whether this records a token tree (format version 4).
    pub fn is_tree(&self) -> bool {
        matches!(self.record, M2r2Record::SpeculativeTree { .. })
    }

    /// Whether this records token trees that change from round to round (format version 5).
    pub fn is_varying_tree(&self) -> bool {
        matches!(&self.record, M2r2Record::SpeculativeTree { recipe, .. } if recipe.varies())
    }

    /// Extra metadata of this mode.
    pub(super) fn metadata(&self) -> Vec<(String, String)> {
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

    /// Read the mode's tensors and metadata; `n` is the number of tokens.
    pub(super) fn read(
        file: &GoldenFile<'_>,
        mode: &str,
        n: usize,
        version: u32,
    ) -> Result<M2r2Golden> {
        let bad = |key: &str, value: &str| {
            Error::format(
                &file.label,
                format!("metadata `{key}` = `{value}` is not valid"),
            )
        };
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
                tree_file::read_tree(file, n, version)?
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
                    _ => None,
                };
                M2r2Record::Speculative {
                    draft_gate,
                    gate,
                    draft_length,
                    rounds,
                    graphs,
                }
            }
            other => {
                return Err(Error::format(
                    &file.label,
                    format!("unknown golden mode `{other}` (greedy, early-exit, speculative)"),
                ));
            }
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

/// An F32 tensor `name` of `rows` rows of logits, read from `file` (any width: a logits tensor's
/// width is checked against the golden's `logits` where it is compared).
fn logits_rows(file: &GoldenFile<'_>, name: &str, rows: usize) -> Result<Array2<f32>> {
    let (shape, values) = file.f32s(name)?;
    let width = shape.get(1).copied().unwrap_or(0);
    file.expect_shape(name, &shape, &[rows, width])?;
    Array2::from_shape_vec((rows, width), values).map_err(|e| {
        Error::format(
            &file.label,
            format!("tensor `{name}` of shape {shape:?}: {e}"),
        )
    })
}
