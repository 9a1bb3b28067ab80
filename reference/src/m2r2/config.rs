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
pub use crate::io::folder_kind::M2R2_CONFIG_FILE;

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
    /// The defaults for `model` (docs/m2r2/streams.md): J = 3 gates (4 near-equal intervals),
    /// rank 16, alpha 32, all seven targets (the four attention projections on MoE models), ARLA
    /// latent 64 and threshold 0.5, draft gate 1, draft length 4, no seed.
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
        if self.gates.is_empty() && n < 2 {
            return bad(format!(
                "the model has {n} layer{}: M2R2 needs an exit gate after a layer below the last, \
                 so at least 2 layers (greedy decoding of the base model needs none)",
                if n == 1 { "" } else { "s" }
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
mod tests;
