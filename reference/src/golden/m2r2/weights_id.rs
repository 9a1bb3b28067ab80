//! Which M2R2 weights a golden was recorded with: [`WeightsId`] and its two hashes, of the whole
//! settings ([`weights_hash`]) and without the decoding defaults
//! ([`weights_hash_without_defaults`]).

use crate::m2r2::config::M2r2Config;
use crate::m2r2::weights::M2r2Weights;
use sha2::{Digest, Sha256};

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
        // the hashes as read from a file: escaped ([`crate::golden::shown`])
        write!(f, "hash {}", crate::golden::shown(&self.hash))?;
        if let Some(w) = &self.without_defaults {
            write!(f, ", weights hash {}", crate::golden::shown(w))?;
        }
        Ok(())
    }
}

/// SHA-256 (first 8 bytes, hex) of the M2R2 settings, every adapter and ARLA tensor's bytes and
/// the pruned draft head's token ids (when there is one), in a fixed order: a check with other
/// adapters, gates or draft head is refused. `m2r2_hash` of goldens and export manifests.
pub fn weights_hash(weights: &M2r2Weights) -> String {
    let config = serde_json::to_string(&weights.config).expect("config serialises");
    hash_with(&config, weights)
}

/// [`weights_hash`] of `weights`' tensors under the settings `config`, their JSON text as a golden
/// stores it (`m2r2_config`, the text the hash was taken over).
pub(super) fn weights_hash_with_settings(config: &str, weights: &M2r2Weights) -> String {
    hash_with(config, weights)
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
    weights_hash_without_defaults_with(&weights.config, weights)
}

/// [`weights_hash_without_defaults`] of `weights`' tensors under the settings `config`.
pub(super) fn weights_hash_without_defaults_with(
    config: &M2r2Config,
    weights: &M2r2Weights,
) -> String {
    hash_with(
        &format!("weights {}", settings_without_defaults(config)),
        weights,
    )
}

/// `config` as JSON without its decoding defaults: what [`weights_hash_without_defaults`] covers
/// of the settings.
pub(super) fn settings_without_defaults(config: &M2r2Config) -> serde_json::Value {
    let mut config = serde_json::to_value(config).expect("config serialises");
    let object = config.as_object_mut().expect("the config is a JSON object");
    for key in DECODING_DEFAULTS {
        object.remove(key);
    }
    if let Some(arla) = object.get_mut("arla").and_then(|a| a.as_object_mut()) {
        arla.remove("threshold");
    }
    config
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
