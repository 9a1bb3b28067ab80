//! A golden's M2R2 settings (`m2r2_config`) against the hashes that cover them.
//!
//! `m2r2_hash` and `m2r2_weights_hash` are taken over the settings and every adapter tensor, and a
//! golden holds the settings but not the tensors, so its reader cannot recompute them: a check
//! compares the hashes with the engine's and would take a `m2r2_config` edited under them (other
//! gates, another rank) as the one recorded. Where the tensors are at hand (the reference's
//! weights, which matched the hashes), the golden's own settings are hashed with them, by the
//! functions that hashed them when it was recorded ([`M2r2Golden::check_settings`]); where only
//! other settings under the same hash are (another golden, an export's manifest), the two must
//! agree on what the hash covers ([`M2r2Golden::settings_differ`],
//! [`M2r2Golden::check_settings_against`]).

use super::weights_id::{
    settings_without_defaults, weights_hash_with_settings, weights_hash_without_defaults_with,
};
use super::{M2r2Golden, WeightsId};
use crate::error::{Error, Result};
use crate::m2r2::config::M2r2Config;
use crate::m2r2::weights::M2r2Weights;
use serde_json::Value;

impl M2r2Golden {
    /// The recorded settings, parsed (the reader parsed them already).
    fn settings(&self) -> Result<M2r2Config> {
        serde_json::from_str(&self.config_json)
            .map_err(|e| Error::Invalid(format!("metadata `m2r2_config`: {e}")))
    }

    /// Refuse recorded settings that are not the ones the recorded hashes cover: with `weights`'
    /// tensors (the weights this golden's hashes named: call it once they matched), the golden's
    /// `m2r2_config` must hash to its `m2r2_hash`, and without the decoding defaults to its
    /// `m2r2_weights_hash` where it has one. The message names the settings that differ from
    /// `weights`' own.
    pub fn check_settings(&self, weights: &M2r2Weights) -> Result<()> {
        let got = WeightsId {
            hash: weights_hash_with_settings(&self.config_json, weights),
            without_defaults: Some(weights_hash_without_defaults_with(
                &self.settings()?,
                weights,
            )),
        };
        let recorded = &self.weights;
        let (key, want, have) = match &recorded.without_defaults {
            Some(w) if Some(w) != got.without_defaults.as_ref() => (
                "m2r2_weights_hash",
                w,
                got.without_defaults.expect("computed above"),
            ),
            _ if got.hash != recorded.hash => ("m2r2_hash", &recorded.hash, got.hash),
            _ => return Ok(()),
        };
        let stripped = key == "m2r2_weights_hash";
        let differ = differences(&self.settings()?, &weights.config, stripped);
        let differ = match differ.is_empty() {
            true => String::new(),
            false => format!(" (it differs from those weights' settings in {differ})"),
        };
        Err(Error::Invalid(format!(
            "metadata `m2r2_config` is not the settings its `{key}` = `{}` covers: with the \
             tensors of the weights that hash names, it hashes to `{have}`{differ}; the settings \
             were edited after recording, or the hash was",
            crate::golden::shown(want)
        )))
    }

    /// Where `other` (another golden) names the same weights by a hash both record, whether the
    /// two record other settings under it (the whole settings under one `m2r2_hash`, those
    /// without the decoding defaults under one `m2r2_weights_hash`): the differences, in words.
    pub(in crate::golden) fn settings_differ(&self, other: &M2r2Golden) -> Option<String> {
        let (a, b) = (self.settings().ok()?, other.settings().ok()?);
        let (wa, wb) = (&self.weights, &other.weights);
        if wa.without_defaults.is_some() && wa.without_defaults == wb.without_defaults {
            let differ = differences(&a, &b, true);
            if !differ.is_empty() {
                return Some(format!(
                    "the same `m2r2_weights_hash` ({}) over other `m2r2_config` settings: {differ}",
                    wa.without_defaults.as_deref().unwrap_or_default()
                ));
            }
        }
        if wa.hash == wb.hash && self.config_json != other.config_json {
            let differ = match differences(&a, &b, false) {
                d if d.is_empty() => "their text".to_string(),
                d => d,
            };
            return Some(format!(
                "the same `m2r2_hash` ({}) over other `m2r2_config` settings: {differ}",
                wa.hash
            ));
        }
        None
    }

    /// Refuse recorded settings that differ from `config`, the settings of an engine whose
    /// hashes matched this golden's and that has no tensors to hash (`engine`: an export, by its
    /// manifest), outside the decoding defaults (which an engine may choose for itself).
    pub fn check_settings_against(&self, config: &M2r2Config, engine: &str) -> Result<()> {
        let differ = differences(&self.settings()?, config, true);
        if differ.is_empty() {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "metadata `m2r2_config` differs from the M2R2 settings of {engine} in {differ}, \
             though their hashes ({}) match: the golden's settings were edited after recording \
             (or the engine's were)",
            self.weights
        )))
    }
}

/// The top-level settings in which `a` and `b` differ, `a`'s value first (`stripped`: without the
/// decoding defaults, as `m2r2_weights_hash` covers them): `` `gates` ([1,3,5] vs [1,2,3]) ``.
fn differences(a: &M2r2Config, b: &M2r2Config, stripped: bool) -> String {
    let value = |c: &M2r2Config| match stripped {
        true => settings_without_defaults(c),
        false => serde_json::to_value(c).expect("config serialises"),
    };
    let (a, b) = (value(a), value(b));
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return String::new();
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let shown = |v: Option<&Value>| {
        let text = v.map_or("none".to_string(), Value::to_string);
        match text.chars().count() > 40 {
            true => format!("{}...", text.chars().take(37).collect::<String>()),
            false => text,
        }
    };
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("`{k}` ({} vs {})", shown(a.get(k)), shown(b.get(k))))
        .collect::<Vec<_>>()
        .join(", ")
}
