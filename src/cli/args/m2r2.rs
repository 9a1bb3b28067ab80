//! The M2R2 decoding flags shared by `generate` and `golden` (`--mode`, `--m2r2`, `--gate`,
//! `--threshold`, `--kv-policy`, `--draft-gate`, `--draft-len` / `--dynamic-draft`,
//! `--draft-head`) resolved into the library's `M2r2Settings`, and how a run is reported (JSON
//! fields, `--trace` lines). The drafting defaults (gate, threshold, draft length) and the draft
//! gate's check are the library's (`reference::decode::drafting`); the modes themselves run in
//! `reference::decode::mode`.
//!
//! `--draft-head on|off` chooses the pruned draft head (`draft_head.json` in the M2R2 folder,
//! `reference::m2r2::draft_head`) for speculative drafts; the default is `on` when the folder has one.
//! `off` drops it from the loaded weights, so every consumer (decoding, goldens, export) sees the
//! full head.

use anyhow::{Context, Result, bail};
use reference::base::weight_names::Target;
use reference::decode::drafting::{Drafting, DraftingRequest, check_draft_gate, resolve_drafting};
use reference::decode::early_exit::KvPolicy;
use reference::io::load::LoadedModel;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::exit_threshold::ExitThreshold;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

use super::refuse_unread_flags;
use reference::decode::mode::{M2r2Settings, Mode};

/// Which decoding loop runs (`reference::decode::mode::Mode`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// The base model, one token per forward
    Greedy,
    /// Emit a token at the first exit gate whose score reaches --threshold
    EarlyExit,
    /// Lossless self-speculation: draft at --draft-gate, verify with the full model
    Speculative,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Mode {
        match mode {
            ModeArg::Greedy => Mode::Greedy,
            ModeArg::EarlyExit => Mode::EarlyExit,
            ModeArg::Speculative => Mode::Speculative,
        }
    }
}

/// `on` | `off`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

/// The M2R2 flags, flattened into `generate` and `golden`.
#[derive(clap::Args, Clone, Debug)]
pub struct M2r2Args {
    /// Decoding mode
    #[arg(long, value_enum, value_name = "MODE", default_value_t = ModeArg::Greedy)]
    pub mode: ModeArg,
    /// M2R2 weights folder (as written by `m2r2 init-m2r2`), or `none` for zero adapters without
    /// ARLA; default: the model's built-in M2R2 weights (seeded random for tiny/tiny-moe, the
    /// shipped trained weights for smollm2, zeros otherwise)
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Exit gate score: arla | confidence | entropy (default: arla when ARLA weights exist, else
    /// confidence)
    #[arg(long, value_name = "GATE", value_parser = parse_gate)]
    pub gate: Option<GateKind>,
    /// Exit (early-exit) or keep drafting (--dynamic-draft) while the gate score is >= X (default:
    /// the M2R2 config's arla.threshold; > 1 never exits). Early exit also takes one per gate,
    /// X1,X2,... (default: the M2R2 config's early_exit thresholds when it has them)
    #[arg(long, value_name = "X", value_parser = parse_threshold)]
    pub threshold: Option<ExitThreshold>,
    /// K/V of the layers an exited token skipped: exact (computed later, equals the base model) |
    /// fast-kv (filled from the exit state, approximate); default: exact
    #[arg(long, value_name = "POLICY", value_parser = parse_kv_policy)]
    pub kv_policy: Option<KvPolicy>,
    /// Draft gate g_d, 1-based (default: the M2R2 config's draft_gate)
    #[arg(long, value_name = "G")]
    pub draft_gate: Option<usize>,
    /// Tokens drafted per verification, >= 1: fixed drafting (default: the M2R2 config's
    /// `dynamic_draft` when it has one, else `draft_len` tokens)
    #[arg(long, value_name = "N", conflicts_with = "dynamic_draft")]
    pub draft_len: Option<usize>,
    /// Draft until the gate score falls below --threshold (at most the config's draft_len); with
    /// --draft-tree, grow the tree per branch: a node gets children only while its score passes
    #[arg(long)]
    pub dynamic_draft: bool,
    /// Pruned draft head (draft_head.json in the --m2r2 folder): drafts score only its K tokens
    /// (default: on when the folder has one)
    #[arg(long, value_enum, value_name = "on|off")]
    pub draft_head: Option<OnOff>,
}

fn parse_gate(text: &str) -> Result<GateKind, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

fn parse_threshold(text: &str) -> Result<ExitThreshold, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

fn parse_kv_policy(text: &str) -> Result<KvPolicy, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

impl M2r2Args {
    /// Greedy decoding with the M2R2 weights chosen by `m2r2` (the `--m2r2` value): for commands
    /// that take only `--m2r2` and need [`weights`](Self::weights) / [`source`](Self::source).
    pub fn weights_only(m2r2: Option<String>) -> Self {
        M2r2Args {
            mode: ModeArg::Greedy,
            m2r2,
            gate: None,
            threshold: None,
            kv_policy: None,
            draft_gate: None,
            draft_len: None,
            dynamic_draft: false,
            draft_head: None,
        }
    }

    /// The M2R2 weights chosen by `--m2r2` for `loaded`, with the draft head `--draft-head` asks
    /// for.
    pub fn weights(&self, loaded: &LoadedModel) -> Result<M2r2Weights> {
        let mut weights = self.weights_as_stored(loaded)?;
        apply_draft_head(&mut weights, self.draft_head, &self.source(loaded))?;
        Ok(weights)
    }

    fn weights_as_stored(&self, loaded: &LoadedModel) -> Result<M2r2Weights> {
        let config = &loaded.model.config;
        match self.m2r2.as_deref() {
            None => M2r2Weights::builtin_for(&loaded.name, config).with_context(|| {
                format!("cannot make the built-in M2R2 weights of {}", loaded.name)
            }),
            Some("none") => Ok(M2r2Weights::zeros(config)),
            Some(dir) => M2r2Weights::load_dir(Path::new(dir), config)
                .with_context(|| format!("cannot load the M2R2 weights folder `{dir}` (--m2r2)")),
        }
    }

    /// Where [`weights`](Self::weights) takes them from, in words.
    pub fn source(&self, loaded: &LoadedModel) -> String {
        match self.m2r2.as_deref() {
            None if reference::io::builtin::BUILTIN_NAMES.contains(&loaded.name.as_str()) => {
                "builtin (seeded random)".into()
            }
            None => match reference::m2r2::shipped::shipped_for(&loaded.name) {
                Some(shipped) => format!("shipped (trained, {})", shipped.path),
                None => "builtin (zeros: no trained M2R2 weights for this model)".into(),
            },
            Some("none") => "none (zeros)".into(),
            Some(dir) => dir.into(),
        }
    }

    /// Refuse the flags `--mode` would not read (a `--draft-len` with greedy decoding, ...).
    pub fn check_mode_flags(&self) -> Result<()> {
        refuse_unread_flags(
            "--mode",
            Mode::from(self.mode).name(),
            &[
                ("--m2r2", self.m2r2.is_some(), DRAFTS_OR_EXITS),
                ("--gate", self.gate.is_some(), DRAFTS_OR_EXITS),
                ("--threshold", self.threshold.is_some(), DRAFTS_OR_EXITS),
                ("--kv-policy", self.kv_policy.is_some(), &["early-exit"]),
                ("--draft-gate", self.draft_gate.is_some(), SPECULATIVE),
                ("--draft-len", self.draft_len.is_some(), SPECULATIVE),
                ("--dynamic-draft", self.dynamic_draft, SPECULATIVE),
                ("--draft-head", self.draft_head.is_some(), SPECULATIVE),
            ],
        )
    }

    /// Resolve every default against `weights` and check the flags (clear errors, before decoding).
    pub fn settings(&self, loaded: &LoadedModel, weights: &M2r2Weights) -> Result<M2r2Settings> {
        let config = &weights.config;
        self.check_mode_flags()?;
        let early_exit = self.mode == ModeArg::EarlyExit;
        // `--threshold X` for every use, or `X1,X2,...` per gate for early exit only
        let (threshold, per_gate) = match &self.threshold {
            None => (None, None),
            Some(ExitThreshold::Shared(t)) => (Some(*t), None),
            Some(per_gate) if !early_exit => bail!(
                "--threshold {per_gate}: one threshold per gate is for --mode early-exit; drafting \
                 takes one number"
            ),
            Some(per_gate @ ExitThreshold::PerGate(t)) => {
                per_gate.check(config.num_gates(), "--threshold")?;
                (None, Some(t.clone()))
            }
        };
        let Drafting {
            gate,
            threshold,
            gate_thresholds,
            draft_length,
        } = resolve_drafting(
            config,
            DraftingRequest {
                speculative: self.mode == ModeArg::Speculative,
                gate: self.gate,
                threshold,
                draft_len: self.draft_len,
                dynamic_draft: self.dynamic_draft,
            },
            weights.arla.is_some(),
            &format!(
                "these M2R2 weights ({}) have none (no arla.safetensors)",
                self.source(loaded)
            ),
        )?;
        // greedy decoding reads no gate: a model too shallow for one (a single layer) still runs
        if self.mode != ModeArg::Greedy && config.num_gates() == 0 {
            bail!(
                "--mode {}: the M2R2 modes need an exit gate after a layer in 1..=N-1, and these \
                 weights have none ({} layer(s)); --mode greedy runs",
                Mode::from(self.mode).name(),
                config.num_layers
            );
        }
        let draft_gate = self.draft_gate.unwrap_or(config.draft_gate);
        if self.mode == ModeArg::Speculative {
            check_draft_gate(config, draft_gate, "--draft-gate")?;
        }
        // early exit: `--threshold X1,X2,...`, else the config's (`resolve_drafting`)
        let gate_thresholds = per_gate.or(gate_thresholds);
        Ok(M2r2Settings {
            mode: self.mode.into(),
            source: self.source(loaded),
            gates: config.gates.clone(),
            gate,
            threshold,
            gate_thresholds,
            kv_policy: self.kv_policy.unwrap_or(KvPolicy::Exact),
            draft_gate,
            draft_length,
            draft_head_tokens: weights
                .draft_head
                .as_ref()
                .filter(|_| self.mode == ModeArg::Speculative)
                .map(|h| h.len()),
        })
    }
}

/// The modes that read the speculative flags (`--draft-len`, ...).
pub const SPECULATIVE: &[&str] = &["speculative"];
/// The modes that read a gate's score (`--gate`, `--threshold`).
const DRAFTS_OR_EXITS: &[&str] = &["early-exit", "speculative"];

/// Apply `--draft-head` to loaded weights: `off` drops the pruned head, `on` requires one, no flag
/// keeps what `source` has.
pub fn apply_draft_head(
    weights: &mut M2r2Weights,
    choice: Option<OnOff>,
    source: &str,
) -> Result<()> {
    match choice {
        Some(OnOff::Off) => weights.draft_head = None,
        Some(OnOff::On) if weights.draft_head.is_none() => bail!(
            "--draft-head on needs a pruned draft head, and these M2R2 weights ({source}) have none \
             (no {}): write one with `m2r2 draft-head --write K`",
            reference::m2r2::draft_head::DRAFT_HEAD_FILE
        ),
        _ => {}
    }
    Ok(())
}

/// Parse `--targets q_proj,k_proj`.
pub fn parse_targets(text: &str) -> Result<Vec<Target>> {
    text.split(',')
        .map(|name| {
            let name = name.trim();
            Target::from_module(name).with_context(|| {
                format!(
                    "--targets: unknown module `{name}` (expected one of {})",
                    Target::all_modules()
                )
            })
        })
        .collect()
}
