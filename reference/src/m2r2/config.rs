//! The M2R2 settings of one adapted model (docs/m2r2/streams.md), stored as `m2r2_config.json`
//! beside the adapter: where the exit gates sit, which linear maps carry accelerator adapters, the
//! ARLA latent size and threshold, and the speculative draft settings.
//!
//! Layer conventions (fixed across the crate):
//! - Gates sit after layers `e_1 < ... < e_J` with `0 < e_j < N`, counted 1-based: "gate after
//!   layer e" means code layers `0..e` have run. `e_0 = 0`, `e_{J+1} = N`.
//! - Interval `j` (0-based, `j = 0..=J`) is code layers `e_j .. e_{j+1}` (end exclusive).
//! - Gates are numbered 1-based (`g = 1..=J`); gate `g` sits at the end of interval `g - 1`.
//!
//! ```json
//! {"num_layers": 30, "gates": [7, 15, 22], "draft_gate": 1, "draft_len": 4, "rank": 16,
//!  "alpha": 32.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
//!  "down_proj"], "arla": {"latent": 64, "threshold": 0.5}, "seed": 7}
//! ```

use crate::base::config::ModelConfig;
use crate::base::tree::{MAX_TREE_NODES, TokenTree};
use crate::base::weight_names::Target;
use crate::error::{Error, Result};
use crate::m2r2::bridge_config::BridgeConfig;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::exit_threshold::ExitThreshold;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

/// File name of the M2R2 settings inside an M2R2 weights folder.
pub const M2R2_CONFIG_FILE: &str = "m2r2_config.json";

/// Default number of exit gates J \[ours\].
pub const DEFAULT_NUM_GATES: usize = 3;
/// Default adapter rank r \[ours\].
pub const DEFAULT_RANK: usize = 16;
/// Default adapter alpha (scale `alpha / r` = 2 at the default rank) \[ours\].
pub const DEFAULT_ALPHA: f32 = 32.0;
/// The largest ARLA latent size accepted (a file's value sizes fresh ARLA weights in
/// `train-arla`; real ones are 64).
pub const MAX_ARLA_LATENT: usize = 1 << 16;
/// Default ARLA latent size `d_lat` \[ours\].
pub const DEFAULT_ARLA_LATENT: usize = 64;
/// Default exit threshold tau: exit when the gate score is `>= tau` \[ours\].
pub const DEFAULT_THRESHOLD: f32 = 0.5;
/// Default draft gate `g_d` (1-based) \[ours\].
pub const DEFAULT_DRAFT_GATE: usize = 1;
/// Default draft length gamma \[ours\].
pub const DEFAULT_DRAFT_LEN: usize = 4;

/// In `m2r2_config.json` a target is its module name (`q_proj`, ...).
impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.module())
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Target::from_module(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown target module `{name}` (expected one of {})",
                Target::all_modules()
            ))
        })
    }
}

/// ARLA settings (docs/m2r2/arla.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArlaConfig {
    /// `d_lat`: size of ARLA's latent space.
    pub latent: usize,
    /// tau: exit when the gate score is `>= threshold`. Any finite value: `> 1` never exits,
    /// `<= 0` always exits.
    pub threshold: f32,
}

/// The default of `--mode early-exit` (docs/m2r2/early_exit.md): exit at the first gate `g` whose
/// `gate` score is `>= thresholds[g - 1]` (`m2r2::exit_threshold`). `m2r2 train-arla` calibrates
/// one threshold per gate for each gate kind on held-out data and writes the kind that computes
/// the fewest layers at its target agreement. `None`: gate `arla` (else `confidence`) with
/// `arla.threshold` at every gate (folders from before per-gate thresholds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlyExitConfig {
    pub gate: GateKind,
    /// One per gate; above 1 closes a gate.
    pub thresholds: Vec<f32>,
}

/// Dynamic drafting as the default of speculative decoding (docs/m2r2/speculative.md): keep
/// drafting while the draft gate's score is `>= threshold`, at most `draft_len` tokens. Chosen by
/// measurement for shipped weights (docs/PERFORMANCE.md); `--draft-len N` still asks for fixed
/// drafting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicDraftConfig {
    pub gate: GateKind,
    pub threshold: f32,
}

/// A token tree as the default drafting for speculative decoding (`generate --mode speculative`
/// and `run --onnx DIR --mode speculative` without `--draft-len`, `--dynamic-draft` or
/// `--draft-tree`, greedy only): the tree of shape `widths` (`W1,W2,...`,
/// `decode/tree_speculation.rs`) drafted at gate `draft_gate`, grown per branch while `dynamic`'s
/// gate scores at least its threshold when it is set. Chosen by measurement (`m2r2
/// tune-drafting`, docs/TRAINING.md) when a tree beats the chain. Sampling drafts the chain of
/// `draft_len` and `dynamic_draft`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraftTreeConfig {
    /// `g_d` of the tree, 1-based, in `1..=J`.
    pub draft_gate: usize,
    /// The children of each node per depth: `[2, 1, 1]` is two chains of three drafts.
    pub widths: Vec<usize>,
    /// Grow the tree per branch (`--dynamic-draft` with `--draft-tree`): a node gets its children
    /// only while this gate's score of its draft is at least the threshold; `None`: the whole
    /// shape every round (configs from before dynamic trees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicDraftConfig>,
}

/// ONNX Runtime's own drafting defaults (`onnx_drafting`), where `m2r2 tune-drafting` measured a
/// different winner there than on the reference (docs/TRAINING.md): the fields of the same names
/// at the top level of [`M2r2Config`], which the reference drafts. A plain `m2r2 export` cuts the
/// draft graphs at this `draft_gate`, and the ONNX runner drafts the rest by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineDrafting {
    pub draft_gate: usize,
    pub draft_len: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_draft: Option<DynamicDraftConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_tree: Option<DraftTreeConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup: Option<usize>,
}

/// The M2R2 settings of one adapted model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct M2r2Config {
    /// N of the base model these settings were made for (checked against the model at load).
    pub num_layers: usize,
    /// `e_1 < ... < e_J`, each in `1..N` (1-based layer counts).
    pub gates: Vec<usize>,
    /// `g_d`, 1-based, in `1..=J`.
    pub draft_gate: usize,
    /// gamma: tokens drafted per verification.
    pub draft_len: usize,
    /// r: adapter rank.
    pub rank: usize,
    /// Adapter alpha; the adapter term is scaled by `alpha / r`.
    pub alpha: f32,
    /// Linear maps carrying adapters (attention projections only on MoE models).
    pub targets: Vec<Target>,
    pub arla: ArlaConfig,
    /// The default early exit: gate and per-gate thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_exit: Option<EarlyExitConfig>,
    /// `None`: speculative decoding drafts `draft_len` tokens per verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_draft: Option<DynamicDraftConfig>,
    /// The reference's default token tree; `None` (folders from before trees): it drafts the
    /// chain of `draft_len` / `dynamic_draft` at `draft_gate`, as the ONNX runner always does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_tree: Option<DraftTreeConfig>,
    /// Speculative decoding's default prompt-lookup branch (`decode/prompt_lookup.rs`): each
    /// round also verifies up to this many tokens copied from the text so far, beside the drafts
    /// (greedy, when nothing asks for other drafting); `None`: no branch (folders from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_lookup: Option<usize>,
    /// The bridge from the last verified slow state into the draft ([`crate::m2r2::bridge`]);
    /// `None`: drafts read only their own token (weights folders from before the bridge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeConfig>,
    /// ONNX Runtime's drafting defaults where they differ from the reference's (the fields
    /// above); `None`: both engines draft those ([`M2r2Config::for_onnx`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnx_drafting: Option<EngineDrafting>,
    /// The seed `init-m2r2` drew the weights from (informational; `None` for trained weights).
    #[serde(default)]
    pub seed: Option<u64>,
}

/// The default gates `e_j = floor(j * N / (J + 1))` for `j = 1..=J` (near-equal intervals), with
/// values outside `1..N` and repeats dropped, so a model too shallow for `J` gates gets fewer
/// (N = 2 gives `[1]`; N = 1 gives none, which [`M2r2Config::validate`] refuses).
pub fn default_gates(n_layers: usize, num_gates: usize) -> Vec<usize> {
    let mut gates: Vec<usize> = Vec::new();
    for j in 1..=num_gates {
        let e = j * n_layers / (num_gates + 1);
        if e > 0 && e < n_layers && gates.last().is_none_or(|&last| e > last) {
            gates.push(e);
        }
    }
    gates
}

/// Parse a `--gates` argument such as `"7,15,22"` into `[7, 15, 22]`. Only the syntax is checked
/// here; [`M2r2Config::validate`] checks the values against the model.
pub fn parse_gates(text: &str) -> Result<Vec<usize>> {
    let bad = |msg: String| Err(Error::Invalid(format!("--gates `{text}`: {msg}")));
    if text.trim().is_empty() {
        return bad("expected a comma-separated list of layer counts, e.g. 7,15,22".into());
    }
    let mut gates = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        match part.parse::<usize>() {
            Ok(e) => gates.push(e),
            Err(_) if part.is_empty() => return bad("empty entry".into()),
            Err(_) => return bad(format!("`{part}` is not a layer count")),
        }
    }
    Ok(gates)
}

impl M2r2Config {
    /// The defaults for `model` (docs/m2r2/streams.md): J = 3 near-equal intervals, rank 16,
    /// alpha 32, all seven targets (the four attention projections on MoE models), ARLA latent 64
    /// and threshold 0.5, draft gate 1, draft length 4, no seed.
    pub fn default_for(model: &ModelConfig) -> Self {
        let targets = Target::ALL
            .into_iter()
            .filter(|t| model.moe.is_none() || !t.is_mlp())
            .collect();
        M2r2Config {
            num_layers: model.num_hidden_layers,
            gates: default_gates(model.num_hidden_layers, DEFAULT_NUM_GATES),
            draft_gate: DEFAULT_DRAFT_GATE,
            draft_len: DEFAULT_DRAFT_LEN,
            rank: DEFAULT_RANK,
            alpha: DEFAULT_ALPHA,
            targets,
            arla: ArlaConfig {
                latent: DEFAULT_ARLA_LATENT,
                threshold: DEFAULT_THRESHOLD,
            },
            early_exit: None,
            dynamic_draft: None,
            draft_tree: None,
            prompt_lookup: None,
            bridge: None,
            onnx_drafting: None,
            seed: None,
        }
    }

    /// Refuse settings that cannot describe M2R2 on `model`. `file` names the source in messages.
    pub fn validate(&self, model: &ModelConfig, file: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::config(file, msg));
        let n = model.num_hidden_layers;
        if self.num_layers != n {
            return bad(format!(
                "made for a model with {} layers (`num_layers`), but the model has {n}",
                self.num_layers
            ));
        }
        if self.gates.is_empty() {
            return bad(format!(
                "`gates` is empty: M2R2 needs at least one exit gate after a layer in 1..={}",
                n.saturating_sub(1)
            ));
        }
        for (i, &e) in self.gates.iter().enumerate() {
            if e == 0 || e >= n {
                return bad(format!(
                    "gate after layer {e} is out of range: gates must lie in 1..={} \
                     (the model has {n} layers)",
                    n.saturating_sub(1)
                ));
            }
            if i > 0 && e <= self.gates[i - 1] {
                return bad(format!(
                    "`gates` must be strictly increasing, got {:?}",
                    self.gates
                ));
            }
        }
        // A gate number the config names itself (`draft_gate`, `bridge.gate`).
        let numbered = |field: &str, g: usize| {
            if self.has_gate(g) {
                return Ok(());
            }
            bad(format!(
                "`{field}` = {g} is out of range: gates are numbered 1..={}",
                self.num_gates()
            ))
        };
        numbered("draft_gate", self.draft_gate)?;
        if self.draft_len == 0 {
            return bad("`draft_len` must be at least 1".into());
        }
        // Decoding sizes its KV cache by prompt + new tokens + draft_len + 1 positions, at most
        // the context: a longer draft can never run, and is refused before anything sums it.
        if self.draft_len > model.max_position_embeddings {
            return bad(format!(
                "`draft_len` = {} is longer than the model's context of {} positions",
                self.draft_len, model.max_position_embeddings
            ));
        }
        if self.rank == 0 {
            return bad("`rank` must be positive".into());
        }
        if !self.alpha.is_finite() {
            return bad(format!(
                "`alpha` must be a finite number, got {}",
                self.alpha
            ));
        }
        if self.targets.is_empty() {
            return bad(format!(
                "`targets` is empty: list at least one of {}",
                Target::all_modules()
            ));
        }
        for (i, t) in self.targets.iter().enumerate() {
            if self.targets[..i].contains(t) {
                return bad(format!("target `{t}` is listed twice"));
            }
            if t.is_mlp() && model.moe.is_some() {
                return bad(format!(
                    "target `{t}` is an MLP projection, but the model's feed-forward is a sparse \
                     MoE block: on MoE models only q_proj, k_proj, v_proj, o_proj carry adapters"
                ));
            }
        }
        if self.arla.latent == 0 || self.arla.latent > MAX_ARLA_LATENT {
            return bad(format!(
                "`arla.latent` must be in 1..={MAX_ARLA_LATENT}, got {}",
                self.arla.latent
            ));
        }
        if !self.arla.threshold.is_finite() {
            return bad(format!(
                "`arla.threshold` must be a finite number, got {}",
                self.arla.threshold
            ));
        }
        if let Some(e) = &self.early_exit {
            ExitThreshold::PerGate(e.thresholds.clone())
                .check(self.num_gates(), "`early_exit.thresholds`")
                .map_err(|e| Error::config(file, e.to_string()))?;
        }
        if let Some(d) = &self.dynamic_draft
            && !d.threshold.is_finite()
        {
            return bad(format!(
                "`dynamic_draft.threshold` must be a finite number, got {}",
                d.threshold
            ));
        }
        if let Some(n) = self.prompt_lookup
            && !(1..MAX_TREE_NODES).contains(&n)
        {
            return bad(format!(
                "`prompt_lookup` = {n} is out of range: a branch has 1..={} tokens (a round \
                 verifies at most {MAX_TREE_NODES} nodes)",
                MAX_TREE_NODES - 1
            ));
        }
        if let Some(t) = &self.draft_tree {
            numbered("draft_tree.draft_gate", t.draft_gate)?;
            let tree = TokenTree::from_widths(&t.widths)
                .map_err(|e| Error::config(file, format!("`draft_tree.widths`: {e}")))?;
            if t.widths.is_empty() {
                return bad(
                    "`draft_tree.widths` is empty: a tree drafts at least one depth (e.g. \
                     [2, 1, 1])"
                        .into(),
                );
            }
            if let Some(d) = &t.dynamic
                && !d.threshold.is_finite()
            {
                return bad(format!(
                    "`draft_tree.dynamic.threshold` must be a finite number, got {}",
                    d.threshold
                ));
            }
            // a round needs one cache row per node beyond the prompt and the tokens
            if tree.nodes() > model.max_position_embeddings {
                return bad(format!(
                    "`draft_tree` has {} nodes, more than the model's context of {} positions",
                    tree.nodes(),
                    model.max_position_embeddings
                ));
            }
        }
        if let Some(b) = &self.bridge {
            b.validate(model.hidden_size).or_else(bad)?;
            numbered("bridge.gate", b.gate)?;
        }
        if self.onnx_drafting.is_some() {
            // the same checks on the settings ONNX Runtime drafts, named as its section
            self.for_onnx().validate(model, file).map_err(|e| match e {
                Error::Config { file, msg } => {
                    Error::config(file, format!("`onnx_drafting`: {msg}"))
                }
                other => other,
            })?;
        }
        Ok(())
    }

    /// The drafting the reference's defaults hold, as an [`EngineDrafting`].
    pub fn drafting(&self) -> EngineDrafting {
        EngineDrafting {
            draft_gate: self.draft_gate,
            draft_len: self.draft_len,
            dynamic_draft: self.dynamic_draft.clone(),
            draft_tree: self.draft_tree.clone(),
            prompt_lookup: self.prompt_lookup,
        }
    }

    /// These settings with `drafting` as the drafting defaults (and no `onnx_drafting`).
    pub fn with_drafting(&self, drafting: &EngineDrafting) -> M2r2Config {
        M2r2Config {
            draft_gate: drafting.draft_gate,
            draft_len: drafting.draft_len,
            dynamic_draft: drafting.dynamic_draft.clone(),
            draft_tree: drafting.draft_tree.clone(),
            prompt_lookup: drafting.prompt_lookup,
            onnx_drafting: None,
            ..self.clone()
        }
    }

    /// The settings ONNX Runtime drafts by default: `onnx_drafting` in place of the top-level
    /// drafting fields when the config has it, else these settings as they are.
    pub fn for_onnx(&self) -> Cow<'_, M2r2Config> {
        match &self.onnx_drafting {
            Some(d) => Cow::Owned(self.with_drafting(d)),
            None => Cow::Borrowed(self),
        }
    }

    /// Read `dir/m2r2_config.json` and validate it against `model`.
    pub fn load(dir: &Path, model: &ModelConfig) -> Result<Self> {
        let path = dir.join(M2R2_CONFIG_FILE);
        let label = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let config: M2r2Config =
            serde_json::from_str(&text).map_err(|e| Error::config(&label, e.to_string()))?;
        config.validate(model, &label)?;
        Ok(config)
    }

    /// Write `dir/m2r2_config.json` (pretty JSON). `dir` must exist.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(M2R2_CONFIG_FILE);
        let text = serde_json::to_string_pretty(self).expect("M2r2Config serialises");
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
    }

    /// J: the number of exit gates.
    pub fn num_gates(&self) -> usize {
        self.gates.len()
    }

    /// Whether gate `g` (1-based) exists: the gates are `1..=J`.
    pub fn has_gate(&self, g: usize) -> bool {
        (1..=self.num_gates()).contains(&g)
    }

    /// Check that gate `g` (1-based) exists, for a gate a user or caller names (a loaded config's
    /// own `draft_gate` and `bridge.gate` are checked by [`M2r2Config::validate`]). `what` is how
    /// the message names it, as the caller got it: `"--draft-gate"`, `"--draft-gates: gate"`,
    /// `"draft gate"`, `"gate"` ("--draft-gate 9 does not exist: the gates are 1..=3 (after layers
    /// [7, 15, 22])").
    pub fn check_gate(&self, g: usize, what: &str) -> Result<()> {
        if self.has_gate(g) {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{what} {g} does not exist: the gates are 1..={} (after layers {:?})",
            self.num_gates(),
            self.gates
        )))
    }

    /// J + 1: the number of intervals.
    pub fn num_intervals(&self) -> usize {
        self.gates.len() + 1
    }

    /// `e_j` for `j = 0..=J+1` (`e_0 = 0`, `e_{J+1} = N`).
    ///
    /// # Panics
    /// If `j > J + 1`.
    pub fn boundary(&self, j: usize) -> usize {
        let last = self.gates.len() + 1;
        match j {
            0 => 0,
            _ if j == last => self.num_layers,
            _ if j < last => self.gates[j - 1],
            _ => panic!("boundary {j} out of range 0..={last}"),
        }
    }

    /// `e_g`: gate `g` (1-based) sits after this many layers.
    ///
    /// # Panics
    /// If `g` is not in `1..=J`.
    pub fn gate_layer(&self, g: usize) -> usize {
        assert!(
            g >= 1 && g <= self.gates.len(),
            "gate {g} out of range 1..={}",
            self.gates.len()
        );
        self.gates[g - 1]
    }

    /// Code layer indices of interval `j` (`j = 0..=J`): `e_j .. e_{j+1}`.
    ///
    /// # Panics
    /// If `j > J`.
    pub fn interval_layers(&self, j: usize) -> Range<usize> {
        assert!(
            j <= self.gates.len(),
            "interval {j} out of range 0..={}",
            self.gates.len()
        );
        self.boundary(j)..self.boundary(j + 1)
    }

    /// The interval (`0..=J`) holding code layer `l`.
    ///
    /// # Panics
    /// If `l >= N`.
    pub fn interval_of_layer(&self, l: usize) -> usize {
        assert!(
            l < self.num_layers,
            "layer {l} out of range 0..{}",
            self.num_layers
        );
        // Gates at or below l: the intervals that end at or before layer l.
        self.gates.iter().filter(|&&e| e <= l).count()
    }

    /// `k_j = e_{j+1} - e_j`: layers in interval `j`.
    ///
    /// # Panics
    /// If `j > J`.
    pub fn interval_len(&self, j: usize) -> usize {
        self.interval_layers(j).len()
    }

    /// `d_j(i) = e_j + round(i * (N - e_j) / k_j)` (docs/m2r2/streams.md): the slow depth the fast
    /// state estimates after its `i`-th layer in interval `j` (`i = 0..=k_j`; `d_j(0) = e_j`,
    /// `d_j(k_j) = N`). Rounds half away from zero, in exact integer arithmetic (N = 30, gates
    /// `[7, 15, 22]`: `d_1(4) = 7 + round(11.5) = 19`).
    ///
    /// # Panics
    /// If `j > J` or `i > k_j`.
    pub fn aligned_depth(&self, j: usize, i: usize) -> usize {
        let e = self.boundary(j);
        let k = self.interval_len(j);
        assert!(i <= k, "step {i} out of range 0..={k} in interval {j}");
        let num = i * (self.num_layers - e);
        // round(num / k) for num, k >= 0, halves away from zero: floor((2 num + k) / 2k).
        e + (2 * num + k) / (2 * k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weight_names::{AttnProj, MlpProj};
    use crate::io::builtin::{tiny_config, tiny_moe_config};

    /// Save `c` into `dir` and read the file back as text.
    fn saved(c: &M2r2Config, dir: &Path) -> String {
        c.save(dir).unwrap();
        std::fs::read_to_string(dir.join(M2R2_CONFIG_FILE)).unwrap()
    }

    fn with_layers(n: usize) -> ModelConfig {
        ModelConfig {
            num_hidden_layers: n,
            ..tiny_config()
        }
    }

    #[test]
    fn default_gates_hand_values() {
        assert_eq!(default_gates(30, 3), vec![7, 15, 22]); // SmolLM2-135M
        assert_eq!(default_gates(8, 3), vec![2, 4, 6]); // tiny
        assert_eq!(default_gates(3, 3), vec![1, 2]); // floor(3/4) = 0 dropped
        assert_eq!(default_gates(2, 3), vec![1]);
        assert_eq!(default_gates(1, 3), Vec::<usize>::new());
        let tiny = M2r2Config::default_for(&tiny_config());
        assert_eq!(tiny.gates, vec![2, 4, 6]);
        tiny.validate(&tiny_config(), "t").unwrap();
        assert_eq!(tiny.targets.len(), 7);
        let moe = M2r2Config::default_for(&tiny_moe_config());
        assert_eq!(moe.targets.len(), 4);
        moe.validate(&tiny_moe_config(), "t").unwrap();
    }

    #[test]
    fn intervals_and_gates() {
        let c = M2r2Config::default_for(&with_layers(30));
        assert_eq!(c.num_gates(), 3);
        assert_eq!(c.interval_layers(0), 0..7);
        assert_eq!(c.interval_layers(1), 7..15);
        assert_eq!(c.interval_layers(3), 22..30);
        assert_eq!(c.gate_layer(1), 7);
        assert_eq!(c.gate_layer(3), 22);
        assert_eq!(c.interval_of_layer(0), 0);
        assert_eq!(c.interval_of_layer(6), 0);
        assert_eq!(c.interval_of_layer(7), 1);
        assert_eq!(c.interval_of_layer(29), 3);
        for j in 0..c.num_intervals() {
            for l in c.interval_layers(j) {
                assert_eq!(c.interval_of_layer(l), j);
            }
        }
    }

    #[test]
    fn aligned_depth_hand_values() {
        let c = M2r2Config::default_for(&with_layers(30));
        // Interval 0: e = 0, k = 7, N - e = 30: 30/7 = 4.29 -> 4, 60/7 = 8.57 -> 9.
        assert_eq!(c.aligned_depth(0, 0), 0);
        assert_eq!(c.aligned_depth(0, 1), 4);
        assert_eq!(c.aligned_depth(0, 2), 9);
        assert_eq!(c.aligned_depth(0, 7), 30);
        // Interval 1: e = 7, k = 8, N - e = 23: 23/8 = 2.875 -> 3; 92/8 = 11.5 -> 12 (half up).
        assert_eq!(c.aligned_depth(1, 1), 10);
        assert_eq!(c.aligned_depth(1, 4), 19);
        assert_eq!(c.aligned_depth(1, 8), 30);
        // Interval 3 (after the last gate): rate 1, d = e + i.
        assert_eq!(c.aligned_depth(3, 5), 27);
        // tiny: gates [2, 4, 6]; interval 0 runs at rate 4, interval 1 at rate 3.
        let t = M2r2Config::default_for(&tiny_config());
        assert_eq!(t.aligned_depth(0, 1), 4);
        assert_eq!(t.aligned_depth(1, 1), 5);
        assert_eq!(t.aligned_depth(2, 1), 6);
    }

    #[test]
    fn parse_gates_cases() {
        assert_eq!(parse_gates("7,15,22").unwrap(), vec![7, 15, 22]);
        assert_eq!(parse_gates(" 3 , 5 ").unwrap(), vec![3, 5]);
        for (text, want) in [
            ("", "expected a comma-separated list"),
            ("7,,9", "empty entry"),
            ("7,x", "`x` is not a layer count"),
            ("-1", "`-1` is not a layer count"),
        ] {
            let err = parse_gates(text).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
    }

    #[test]
    fn validation_rejects_with_clear_messages() {
        let model = tiny_config();
        let ok = M2r2Config::default_for(&model);
        type Edit = Box<dyn Fn(&mut M2r2Config)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|c| c.gates = vec![]), "`gates` is empty"),
            (Box::new(|c| c.gates = vec![0, 4]), "out of range"),
            (
                Box::new(|c| c.gates = vec![2, 8]),
                "gate after layer 8 is out of range",
            ),
            (Box::new(|c| c.gates = vec![4, 2]), "strictly increasing"),
            (Box::new(|c| c.gates = vec![2, 2]), "strictly increasing"),
            (Box::new(|c| c.draft_gate = 0), "`draft_gate` = 0"),
            (Box::new(|c| c.draft_gate = 4), "numbered 1..=3"),
            (Box::new(|c| c.draft_len = 0), "`draft_len`"),
            (
                Box::new(|c| c.draft_len = 513),
                "`draft_len` = 513 is longer than the model's context of 512",
            ),
            (Box::new(|c| c.rank = 0), "`rank` must be positive"),
            (Box::new(|c| c.alpha = f32::NAN), "`alpha`"),
            (Box::new(|c| c.targets.clear()), "`targets` is empty"),
            (
                Box::new(|c| c.targets.push(Target::Attn(AttnProj::Q))),
                "`q_proj` is listed twice",
            ),
            (
                Box::new(|c| c.num_layers = 30),
                "made for a model with 30 layers",
            ),
            (Box::new(|c| c.arla.latent = 0), "`arla.latent`"),
            (
                Box::new(|c| c.arla.latent = 1 << 17),
                "`arla.latent` must be in 1..=65536",
            ),
        ];
        for (edit, want) in cases {
            let mut c = ok.clone();
            edit(&mut c);
            let err = c
                .validate(&model, "dir/m2r2_config.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(err.starts_with("dir/m2r2_config.json: "), "{err}");
        }
        // MLP targets on a MoE model.
        let moe = tiny_moe_config();
        let mut c = M2r2Config::default_for(&moe);
        c.targets.push(Target::Mlp(MlpProj::Up));
        let err = c.validate(&moe, "m").unwrap_err().to_string();
        assert!(
            err.contains("`up_proj` is an MLP projection") && err.contains("MoE"),
            "{err}"
        );
    }

    #[test]
    fn json_round_trip_and_strictness() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_config();
        let mut c = M2r2Config::default_for(&model);
        c.seed = Some(7);
        let text = saved(&c, dir.path());
        assert!(
            text.contains("\"q_proj\"") && text.contains("\"down_proj\""),
            "{text}"
        );
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);

        // each edited text is refused naming the file and what is wrong
        let refused = |cases: &[(String, &str)]| {
            for (bad, want) in cases {
                std::fs::write(dir.path().join(M2R2_CONFIG_FILE), bad).unwrap();
                let err = M2r2Config::load(dir.path(), &model)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(want), "{err:?} should contain {want:?}");
                assert!(err.contains(M2R2_CONFIG_FILE), "{err}");
            }
        };
        let cases = [
            (
                text.replace("\"draft_len\"", "\"draft_length\""),
                "unknown field `draft_length`",
            ),
            (
                text.replace("\"q_proj\"", "\"qkv_proj\""),
                "unknown target module `qkv_proj`",
            ),
            (
                text.replace("\"latent\"", "\"latnet\""),
                "unknown field `latnet`",
            ),
            (
                text.replace("\"draft_len\": 4", "\"draft_len\": 18446744073709551615"),
                "`draft_len` = 18446744073709551615 is longer than the model's context",
            ),
        ];
        refused(&cases);

        // dynamic_draft: absent by default (not written), round-trips, checked strictly
        assert!(!text.contains("dynamic_draft"), "{text}");
        c.dynamic_draft = Some(DynamicDraftConfig {
            gate: GateKind::Confidence,
            threshold: 0.5,
        });
        let text = saved(&c, dir.path());
        assert!(text.contains("\"gate\": \"confidence\""), "{text}");
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
        let cases = [
            (
                text.replace("\"confidence\"", "\"certainty\""),
                "unknown gate `certainty`",
            ),
            (
                text.replace("\"threshold\": 0.5", "\"treshold\": 0.5"),
                "unknown field `treshold`",
            ),
            (
                text.replace("\"threshold\": 0.5", "\"threshold\": 1e999"),
                "",
            ),
        ];
        refused(&cases);
        c.dynamic_draft = Some(DynamicDraftConfig {
            gate: GateKind::Entropy,
            threshold: f32::NAN,
        });
        let err = c.validate(&model, "m").unwrap_err().to_string();
        assert!(err.contains("`dynamic_draft.threshold`"), "{err}");
    }

    /// `early_exit`: absent by default (and from older files), round-trips, and its thresholds are
    /// one finite number per gate, else an error naming the field and the file.
    #[test]
    fn early_exit_round_trips_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_config();
        let mut c = M2r2Config::default_for(&model);
        assert!(c.early_exit.is_none());
        let old = saved(&c, dir.path());
        assert!(!old.contains("early_exit"), "{old}");
        let j = c.num_gates();
        c.early_exit = Some(EarlyExitConfig {
            gate: GateKind::Entropy,
            thresholds: vec![0.75; j],
        });
        let text = saved(&c, dir.path());
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["early_exit"],
            serde_json::json!({"gate": "entropy", "thresholds": vec![0.75; j]})
        );
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
        for (thresholds, want) in [
            (vec![0.75; j + 1], format!("has {} thresholds", j + 1)),
            (vec![], format!("has 0 thresholds () for {j} exit gates")),
            (
                vec![f32::NAN; j],
                "must be finite numbers, got NaN".to_string(),
            ),
        ] {
            let mut bad = c.clone();
            bad.early_exit.as_mut().unwrap().thresholds = thresholds;
            let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
            assert!(
                err.contains("cfg.json")
                    && err.contains("`early_exit.thresholds`")
                    && err.contains(&want),
                "{err}"
            );
        }
        std::fs::write(
            dir.path().join(M2R2_CONFIG_FILE),
            text.replace("\"thresholds\"", "\"threshold\""),
        )
        .unwrap();
        let err = M2r2Config::load(dir.path(), &model)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `threshold`"), "{err}");
    }

    /// `prompt_lookup`: absent by default (and from older files), round-trips, and is refused
    /// outside 1..=63 naming the field and the file.
    #[test]
    fn prompt_lookup_round_trips_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_config();
        let mut c = M2r2Config::default_for(&model);
        assert!(c.prompt_lookup.is_none());
        let old = saved(&c, dir.path());
        assert!(!old.contains("prompt_lookup"), "{old}");
        c.prompt_lookup = Some(4);
        let text = saved(&c, dir.path());
        assert!(text.contains("\"prompt_lookup\": 4"), "{text}");
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
        for n in [0, MAX_TREE_NODES] {
            let mut bad = c.clone();
            bad.prompt_lookup = Some(n);
            let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
            assert!(
                err.contains("cfg.json") && err.contains(&format!("`prompt_lookup` = {n}")),
                "{err}"
            );
        }
    }

    /// `onnx_drafting`: absent by default (and from older files); `for_onnx` swaps in its fields
    /// and nothing else; it round-trips, and its fields are checked as the top level's are, the
    /// message naming the section.
    #[test]
    fn onnx_drafting_replaces_the_drafting_defaults_for_onnx_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_config();
        let mut c = M2r2Config::default_for(&model);
        assert!(c.onnx_drafting.is_none());
        assert!(!saved(&c, dir.path()).contains("onnx_drafting"));
        assert!(matches!(c.for_onnx(), Cow::Borrowed(b) if *b == c));
        c.prompt_lookup = Some(4);
        let onnx = EngineDrafting {
            draft_gate: 2,
            draft_len: 2,
            dynamic_draft: Some(DynamicDraftConfig {
                gate: GateKind::Entropy,
                threshold: 0.5,
            }),
            draft_tree: Some(DraftTreeConfig {
                draft_gate: 2,
                widths: vec![2, 1],
                dynamic: None,
            }),
            prompt_lookup: None,
        };
        c.onnx_drafting = Some(onnx.clone());
        let text = saved(&c, dir.path());
        assert!(text.contains("\"onnx_drafting\""), "{text}");
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);

        let for_onnx = c.for_onnx().into_owned();
        assert_eq!(for_onnx.drafting(), onnx);
        assert!(for_onnx.onnx_drafting.is_none());
        // everything but the drafting is the config's own
        assert_eq!(
            for_onnx.with_drafting(&c.drafting()),
            M2r2Config {
                onnx_drafting: None,
                ..c.clone()
            }
        );
        // the reference's defaults are the top level's
        assert_eq!(c.drafting().draft_gate, 1);
        assert_eq!(c.drafting().prompt_lookup, Some(4));

        type Spoil = fn(&mut EngineDrafting);
        let cases: [(Spoil, &str); 4] = [
            (|d| d.draft_len = 0, "`draft_len` must be at least 1"),
            (|d| d.draft_gate = 9, "`draft_gate` = 9 is out of range"),
            (|d| d.prompt_lookup = Some(0), "`prompt_lookup` = 0"),
            (
                |d| d.draft_tree.as_mut().unwrap().widths = vec![],
                "`draft_tree.widths`",
            ),
        ];
        for (spoil, said) in cases {
            let mut bad = c.clone();
            spoil(bad.onnx_drafting.as_mut().unwrap());
            let err = bad.validate(&model, "cfg.json").unwrap_err().to_string();
            assert!(
                err.contains("cfg.json") && err.contains("`onnx_drafting`: ") && err.contains(said),
                "{err}"
            );
        }
        // an unknown field inside the section is refused by name
        let text = text.replace("\"draft_len\": 2", "\"draft_len\": 2, \"depth\": 3");
        std::fs::write(dir.path().join(M2R2_CONFIG_FILE), text).unwrap();
        let err = M2r2Config::load(dir.path(), &model)
            .unwrap_err()
            .to_string();
        assert!(err.contains("depth"), "{err}");
    }

    #[test]
    fn draft_tree_round_trips_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_config();
        let mut c = M2r2Config::default_for(&model);
        // absent by default, and a file without it (written before trees) loads
        assert!(c.draft_tree.is_none());
        let old = saved(&c, dir.path());
        assert!(!old.contains("draft_tree"), "{old}");
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
        c.draft_tree = Some(DraftTreeConfig {
            draft_gate: 2,
            widths: vec![2, 1, 1],
            dynamic: None,
        });
        let text = saved(&c, dir.path());
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["draft_tree"],
            serde_json::json!({"draft_gate": 2, "widths": [2, 1, 1]})
        );
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), c);
        // grown per branch
        let mut grown = c.clone();
        grown.draft_tree.as_mut().unwrap().dynamic = Some(DynamicDraftConfig {
            gate: GateKind::Confidence,
            threshold: 0.25,
        });
        grown.save(dir.path()).unwrap();
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(M2R2_CONFIG_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            json["draft_tree"]["dynamic"],
            serde_json::json!({"gate": "confidence", "threshold": 0.25})
        );
        assert_eq!(M2r2Config::load(dir.path(), &model).unwrap(), grown);
        let mut bad = grown.clone();
        bad.draft_tree
            .as_mut()
            .unwrap()
            .dynamic
            .as_mut()
            .unwrap()
            .threshold = f32::NAN;
        let err = bad.validate(&model, "m").unwrap_err().to_string();
        assert!(
            err.contains("`draft_tree.dynamic.threshold` must be a finite number"),
            "{err}"
        );
        c.save(dir.path()).unwrap();
        // unknown fields inside it are refused like everywhere else
        std::fs::write(
            dir.path().join(M2R2_CONFIG_FILE),
            text.replace("\"widths\"", "\"width\""),
        )
        .unwrap();
        let err = M2r2Config::load(dir.path(), &model)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `width`"), "{err}");
        // gate, widths and size checked against the model (tiny: 3 gates, 512 positions)
        for (draft_gate, widths, want) in [
            (4, vec![2, 1], "`draft_tree.draft_gate` = 4 is out of range"),
            (0, vec![2, 1], "`draft_tree.draft_gate` = 0"),
            (1, vec![], "`draft_tree.widths` is empty"),
            (
                1,
                vec![2, 0],
                "`draft_tree.widths`: token tree 2,0: the width at depth 2 is 0",
            ),
            (1, vec![9, 9], "at most 64"),
        ] {
            let mut bad = c.clone();
            bad.draft_tree = Some(DraftTreeConfig {
                draft_gate,
                widths,
                dynamic: None,
            });
            let err = bad.validate(&model, "m").unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
        }
        let short = ModelConfig {
            max_position_embeddings: 6,
            ..tiny_config()
        };
        let mut bad = M2r2Config::default_for(&short);
        bad.draft_len = 2;
        bad.draft_tree = Some(DraftTreeConfig {
            draft_gate: 1,
            widths: vec![3, 1],
            dynamic: None,
        });
        let err = bad.validate(&short, "m").unwrap_err().to_string();
        assert!(
            err.contains("`draft_tree` has 7 nodes, more than the model's context of 6"),
            "{err}"
        );
    }

    #[test]
    fn targets_order_and_names() {
        for (i, t) in Target::ALL.into_iter().enumerate() {
            assert_eq!(Target::from_module(t.module()), Some(t));
            assert_eq!(t.index(), i);
        }
        assert_eq!(Target::from_module("w1"), None);
        assert!(Target::Attn(AttnProj::O) < Target::Mlp(MlpProj::Gate));
        let model = tiny_config();
        assert_eq!(Target::Attn(AttnProj::K).shape(&model), (32, 64));
        assert_eq!(Target::Mlp(MlpProj::Down).shape(&model), (64, 128));
    }

    #[test]
    fn gates_are_one_based_up_to_the_number_of_gates() {
        let config = M2r2Config::default_for(&tiny_config());
        let j = config.num_gates();
        for g in 1..=j {
            assert!(config.has_gate(g));
            config.check_gate(g, "--draft-gate").unwrap();
        }
        for g in [0, j + 1] {
            assert!(!config.has_gate(g));
            let err = config
                .check_gate(g, "--draft-gate")
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!(
                    "--draft-gate {g} does not exist: the gates are 1..={j} (after layers {:?})",
                    config.gates
                )
            );
        }
        let err = config
            .check_gate(0, "--draft-gates: gate")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--draft-gates: gate 0 does not exist"),
            "{err}"
        );
    }
}
