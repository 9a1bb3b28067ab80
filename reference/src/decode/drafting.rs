//! The default drafting policy: how the drafting a caller asks for (gate, threshold, draft length,
//! each optional) resolves against an M2R2 config, and the check that a draft gate exists.
//! `m2r2 generate`, `golden write` and `run` (on an export's manifest) resolve their flags here,
//! as library users do, so the reference and an export of the same weights draft alike; `export`
//! and `tune-drafting` check draft gates with [`check_draft_gate`].
//!
//! Error messages name the command line's flags (`--gate`, `--threshold`, `--draft-len`): they are
//! what a user of `m2r2` reads.

use crate::decode::speculative::DraftLength;
use crate::m2r2::config::M2r2Config;
use crate::m2r2::exit_gate::GateKind;
use crate::{Error, Result};

/// The drafting a caller asks for (`None` / `false`: not given, the config decides).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftingRequest {
    /// Speculative decoding (the config's `dynamic_draft` applies only to it), else early exit.
    pub speculative: bool,
    /// `--gate`: the exit gate score.
    pub gate: Option<GateKind>,
    /// `--threshold`: exit, or keep drafting, while the gate score is `>=` it.
    pub threshold: Option<f32>,
    /// `--draft-len N`: fixed drafting of `N` tokens per verification.
    pub draft_len: Option<usize>,
    /// `--dynamic-draft`: draft until the gate score falls below the threshold.
    pub dynamic_draft: bool,
}

/// The gate, threshold and draft length a decode uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Drafting {
    pub gate: GateKind,
    pub threshold: f32,
    /// Early exit: the config's per-gate thresholds (`early_exit`), replacing `threshold`, when
    /// neither `--threshold` nor another `--gate` is asked for.
    pub gate_thresholds: Option<Vec<f32>>,
    pub draft_length: DraftLength,
}

/// Resolve a drafting request against an M2R2 config, the same way for the reference and for an
/// export. Speculative decoding without `--draft-len` follows the config's `dynamic_draft` when it
/// has one (its gate and threshold, unless `--gate` / `--threshold` are given); early exit follows
/// its `early_exit` (gate and per-gate thresholds) likewise; otherwise gate `arla` when ARLA
/// weights exist (else `confidence`), threshold `arla.threshold`, and `draft_len` drafts per
/// verification. `lacks_arla` says why `arla` is unavailable ("... have none (...)").
///
/// Errors ([`Error::Invalid`]): `arla` asked for, or the config's default, without ARLA weights; a
/// threshold that is not finite; `--draft-len 0`.
pub fn resolve_drafting(
    config: &M2r2Config,
    request: DraftingRequest,
    has_arla: bool,
    lacks_arla: &str,
) -> Result<Drafting> {
    let invalid = |msg: String| Err(Error::Invalid(msg));
    let default_dynamic = config
        .dynamic_draft
        .as_ref()
        .filter(|_| request.speculative && request.draft_len.is_none());
    let default_exit = config.early_exit.as_ref().filter(|_| !request.speculative);
    if let Some(e) = default_exit
        && request.gate.is_none()
        && e.gate == GateKind::Arla
        && !has_arla
    {
        return invalid(format!(
            "the M2R2 config exits early with the arla gate (`early_exit.gate`), and {lacks_arla}: \
             give --gate confidence or --gate entropy"
        ));
    }
    let gate = match (request.gate, default_dynamic) {
        (Some(GateKind::Arla), _) if !has_arla => {
            return invalid(format!(
                "--gate arla needs ARLA weights, and {lacks_arla}: use --gate confidence or --gate \
                 entropy"
            ));
        }
        (Some(g), _) => g,
        (None, Some(d)) if d.gate == GateKind::Arla && !has_arla => {
            return invalid(format!(
                "the M2R2 config drafts dynamically with the arla gate (`dynamic_draft.gate`), and \
                 {lacks_arla}: give --gate confidence, --gate entropy or --draft-len N"
            ));
        }
        (None, Some(d)) => d.gate,
        (None, None) => match default_exit {
            Some(e) => e.gate,
            None if has_arla => GateKind::Arla,
            None => GateKind::Confidence,
        },
    };
    let threshold = request
        .threshold
        .or(default_dynamic.map(|d| d.threshold))
        .unwrap_or(config.arla.threshold);
    if !threshold.is_finite() {
        return invalid(format!(
            "--threshold must be a finite number, got {threshold}"
        ));
    }
    if request.draft_len == Some(0) {
        return invalid("--draft-len must be at least 1".into());
    }
    let draft_length = if request.dynamic_draft || default_dynamic.is_some() {
        DraftLength::Dynamic {
            max: config.draft_len.max(1),
            gate,
            threshold,
        }
    } else {
        DraftLength::Fixed(request.draft_len.unwrap_or(config.draft_len).max(1))
    };
    let gate_thresholds = default_exit
        .filter(|e| e.gate == gate && request.threshold.is_none())
        .map(|e| e.thresholds.clone());
    Ok(Drafting {
        gate,
        threshold,
        gate_thresholds,
        draft_length,
    })
}

/// Check that draft gate `draft_gate` (1-based) exists, named in the message as `named` (as the
/// caller got it: `"--draft-gate"`, `"--draft-gates: gate"`, `"draft gate"`): the rule and its
/// words are [`M2r2Config::check_gate`]'s, which the trainer's gates use too.
pub fn check_draft_gate(config: &M2r2Config, draft_gate: usize, named: &str) -> Result<()> {
    config.check_gate(draft_gate, named)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin::tiny_config;
    use crate::m2r2::config::{DynamicDraftConfig, EarlyExitConfig};

    fn request(speculative: bool) -> DraftingRequest {
        DraftingRequest {
            speculative,
            ..DraftingRequest::default()
        }
    }

    fn resolve(config: &M2r2Config, request: DraftingRequest, has_arla: bool) -> Result<Drafting> {
        resolve_drafting(config, request, has_arla, "none here (test)")
    }

    fn error(result: Result<Drafting>) -> String {
        result.expect_err("an error").to_string()
    }

    #[test]
    fn drafting_follows_the_config_and_the_flags() {
        let mut config = M2r2Config::default_for(&tiny_config());
        config.arla.threshold = 0.9;
        // no dynamic_draft: fixed draft_len, ARLA when present
        let d = resolve(&config, request(true), true).unwrap();
        assert_eq!(d.draft_length, DraftLength::Fixed(config.draft_len));
        assert_eq!((d.gate, d.threshold), (GateKind::Arla, 0.9));
        let d = resolve(&config, request(true), false).unwrap();
        assert_eq!(d.gate, GateKind::Confidence);

        config.dynamic_draft = Some(DynamicDraftConfig {
            gate: GateKind::Confidence,
            threshold: 0.4,
        });
        let dynamic = |gate, threshold| DraftLength::Dynamic {
            max: config.draft_len,
            gate,
            threshold,
        };
        // speculative without flags: the config's dynamic drafting
        let d = resolve(&config, request(true), true).unwrap();
        assert_eq!(d.draft_length, dynamic(GateKind::Confidence, 0.4));
        // --threshold and --gate override it, --dynamic-draft changes nothing
        let d = resolve(
            &config,
            DraftingRequest {
                threshold: Some(0.6),
                gate: Some(GateKind::Entropy),
                dynamic_draft: true,
                ..request(true)
            },
            true,
        )
        .unwrap();
        assert_eq!(d.draft_length, dynamic(GateKind::Entropy, 0.6));
        // --draft-len asks for fixed drafting, with the usual gate and threshold
        let d = resolve(
            &config,
            DraftingRequest {
                draft_len: Some(2),
                ..request(true)
            },
            true,
        )
        .unwrap();
        assert_eq!(d.draft_length, DraftLength::Fixed(2));
        assert_eq!((d.gate, d.threshold), (GateKind::Arla, 0.9));
        // early exit ignores dynamic_draft
        let d = resolve(&config, request(false), true).unwrap();
        assert_eq!((d.gate, d.threshold), (GateKind::Arla, 0.9));
        assert_eq!(d.draft_length, DraftLength::Fixed(config.draft_len));

        // a default that needs ARLA where there is none: a clear error, not a fallback
        config.dynamic_draft = Some(DynamicDraftConfig {
            gate: GateKind::Arla,
            threshold: 0.4,
        });
        let err = error(resolve(&config, request(true), false));
        assert!(
            err.contains("dynamic_draft.gate") && err.contains("none here (test)"),
            "{err}"
        );
        let err = error(resolve(
            &config,
            DraftingRequest {
                draft_len: Some(0),
                ..request(true)
            },
            true,
        ));
        assert_eq!(err, "--draft-len must be at least 1");
    }

    /// The config's `early_exit` is early exit's default gate and per-gate thresholds; `--gate`
    /// another kind or `--threshold` replaces the thresholds; speculative decoding ignores it; a
    /// default on the arla gate without ARLA weights is an error naming the field.
    #[test]
    fn early_exit_follows_the_config_and_the_flags() {
        let mut config = M2r2Config::default_for(&tiny_config());
        let j = config.num_gates();
        let thresholds: Vec<f32> = (0..j).map(|g| 1.01 - 0.1 * g as f32).collect();
        config.early_exit = Some(EarlyExitConfig {
            gate: GateKind::Confidence,
            thresholds: thresholds.clone(),
        });
        let d = resolve(&config, request(false), true).unwrap();
        assert_eq!(d.gate, GateKind::Confidence);
        assert_eq!(d.gate_thresholds, Some(thresholds.clone()));
        // the same gate asked for by name keeps them
        let gate = |g| DraftingRequest {
            gate: Some(g),
            ..request(false)
        };
        let d = resolve(&config, gate(GateKind::Confidence), true).unwrap();
        assert_eq!(d.gate_thresholds, Some(thresholds.clone()));
        // another gate, or a threshold, does not
        let d = resolve(&config, gate(GateKind::Entropy), true).unwrap();
        assert_eq!((d.gate, d.gate_thresholds), (GateKind::Entropy, None));
        let d = resolve(
            &config,
            DraftingRequest {
                threshold: Some(0.7),
                ..request(false)
            },
            true,
        )
        .unwrap();
        assert_eq!(
            (d.gate, d.threshold, d.gate_thresholds),
            (GateKind::Confidence, 0.7, None)
        );
        // speculative decoding: the drafting defaults
        let d = resolve(&config, request(true), true).unwrap();
        assert_eq!((d.gate, d.gate_thresholds), (GateKind::Arla, None));
        // arla as the default without ARLA weights
        config.early_exit.as_mut().unwrap().gate = GateKind::Arla;
        let err = error(resolve(&config, request(false), false));
        assert!(
            err.contains("`early_exit.gate`") && err.contains("none here (test)"),
            "{err}"
        );
        resolve(&config, gate(GateKind::Entropy), false).unwrap();
    }

    #[test]
    fn dynamic_draft_without_a_config_default_drafts_at_most_draft_len() {
        let config = M2r2Config::default_for(&tiny_config());
        assert!(config.dynamic_draft.is_none());
        let d = resolve(
            &config,
            DraftingRequest {
                dynamic_draft: true,
                threshold: Some(0.3),
                ..request(true)
            },
            false,
        )
        .unwrap();
        assert_eq!(
            d.draft_length,
            DraftLength::Dynamic {
                max: config.draft_len,
                gate: GateKind::Confidence,
                threshold: 0.3,
            }
        );
    }

    #[test]
    fn asking_for_arla_without_it_and_bad_thresholds_are_errors() {
        let config = M2r2Config::default_for(&tiny_config());
        let err = error(resolve(
            &config,
            DraftingRequest {
                gate: Some(GateKind::Arla),
                ..request(false)
            },
            false,
        ));
        assert_eq!(
            err,
            "--gate arla needs ARLA weights, and none here (test): use --gate confidence or \
             --gate entropy"
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let err = error(resolve(
                &config,
                DraftingRequest {
                    threshold: Some(bad),
                    ..request(true)
                },
                true,
            ));
            assert_eq!(
                err,
                format!("--threshold must be a finite number, got {bad}")
            );
        }
    }
}
