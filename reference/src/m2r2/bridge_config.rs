//! The bridge's settings (`"bridge"` in `m2r2_config.json`) and its sites
//! ([`crate::m2r2::bridge`] has the bridge itself). Apart from the weights so that the M2R2 config
//! can hold them without importing the adapters.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the bridge's term joins the draft's fast stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BridgeSite {
    /// At the start of the draft gate's interval: `f <- s_{e_{gd-1}} + B_e A_e x̂`.
    Entry,
    /// At the draft gate: `u_gd <- f + B_g A_g x̂`.
    Gate,
}

impl BridgeSite {
    pub const ALL: [BridgeSite; 2] = [BridgeSite::Entry, BridgeSite::Gate];

    pub fn name(self) -> &'static str {
        match self {
            BridgeSite::Entry => "entry",
            BridgeSite::Gate => "gate",
        }
    }

    /// Parse `entry` / `gate`.
    pub fn parse(text: &str) -> Result<Self> {
        BridgeSite::ALL
            .into_iter()
            .find(|s| s.name() == text)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown bridge site `{text}`: the sites are entry, gate"
                ))
            })
    }

    /// The safetensors names of this site's `A` and `B`.
    pub fn tensor_names(self) -> [String; 2] {
        [
            format!("bridge.{}.lora_A.weight", self.name()),
            format!("bridge.{}.lora_B.weight", self.name()),
        ]
    }
}

/// The bridge's settings (`"bridge"` in `m2r2_config.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    /// The draft gate (1-based) whose drafts read the bridge, the one it was trained at; drafting
    /// at another gate ignores it.
    pub gate: usize,
    /// r: rank of each site's map.
    pub rank: usize,
    /// Where the term joins (one map per site), each listed once.
    pub sites: Vec<BridgeSite>,
    /// `c` per site (a listed site without an entry: 1).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scales: BTreeMap<BridgeSite, f32>,
}

impl BridgeConfig {
    /// A bridge read at draft gate `gate`, of rank `rank` at `sites`, every scale 1.
    pub fn new(gate: usize, rank: usize, sites: Vec<BridgeSite>) -> Self {
        BridgeConfig {
            gate,
            rank,
            sites,
            scales: BTreeMap::new(),
        }
    }

    /// `c` of `site`.
    pub fn scale(&self, site: BridgeSite) -> f32 {
        self.scales.get(&site).copied().unwrap_or(1.0)
    }

    /// Scales that make each site's term start at the size of the state it joins. `x̂`'s size is
    /// about that of the final norm's weight (`x̂ = w * h / rms(h)`); the entry joins the slow
    /// residual entering the draft gate's interval (RMS `entry_rms`: the embeddings' for the first
    /// gate), the gate joins the exit state, an estimate of `s_N` (RMS `final_rms`, measured on
    /// data). A size not given leaves that site's scale at 1.
    pub fn matched_scales(
        &mut self,
        final_norm_rms: f32,
        entry_rms: Option<f32>,
        final_rms: Option<f32>,
    ) {
        for (site, rms) in [
            (BridgeSite::Entry, entry_rms),
            (BridgeSite::Gate, final_rms),
        ] {
            if let Some(rms) = rms
                && self.sites.contains(&site)
                && final_norm_rms > 0.0
                && rms > 0.0
            {
                self.scales.insert(site, rms / final_norm_rms);
            }
        }
    }

    /// Refuse settings that cannot describe a bridge on a model of width `d`.
    pub fn validate(&self, d: usize) -> std::result::Result<(), String> {
        if self.rank == 0 || self.rank > d {
            return Err(format!(
                "`bridge.rank` must be in 1..={d} (the hidden size), got {}",
                self.rank
            ));
        }
        if self.sites.is_empty() {
            return Err("`bridge.sites` is empty: list entry, gate or both".into());
        }
        for (i, s) in self.sites.iter().enumerate() {
            if self.sites[..i].contains(s) {
                return Err(format!("bridge site `{}` is listed twice", s.name()));
            }
        }
        for (site, &c) in &self.scales {
            if !self.sites.contains(site) {
                return Err(format!(
                    "`bridge.scales` names `{}`, which is not among the sites",
                    site.name()
                ));
            }
            if !(c.is_finite() && c > 0.0) {
                return Err(format!(
                    "`bridge.scales.{}` must be a positive number, got {c}",
                    site.name()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        assert!(
            BridgeConfig::new(1, 1, vec![BridgeSite::Entry])
                .validate(4)
                .is_ok()
        );
        assert!(BridgeConfig::new(1, 1, vec![]).validate(4).is_err());
        assert!(
            BridgeConfig::new(1, 1, vec![BridgeSite::Gate, BridgeSite::Gate])
                .validate(4)
                .is_err()
        );
        let wide = BridgeConfig::new(1, 5, vec![BridgeSite::Entry]);
        assert!(wide.validate(4).unwrap_err().contains("1..=4"));
        let mut scaled = BridgeConfig::new(1, 1, vec![BridgeSite::Entry]);
        scaled.scales.insert(BridgeSite::Gate, 0.5);
        assert!(
            scaled
                .validate(4)
                .unwrap_err()
                .contains("not among the sites")
        );
        scaled.scales = BTreeMap::from([(BridgeSite::Entry, -1.0)]);
        assert!(scaled.validate(4).unwrap_err().contains("positive"));
        scaled.scales = BTreeMap::from([(BridgeSite::Entry, 0.5)]);
        assert!(scaled.validate(4).is_ok());
        let json = serde_json::to_string(&scaled).unwrap();
        assert_eq!(
            json,
            r#"{"gate":1,"rank":1,"sites":["entry"],"scales":{"entry":0.5}}"#
        );
    }
}
