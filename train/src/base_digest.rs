//! Fingerprints of the frozen base model's weights: what the slow stream cache's key covers
//! ([`hash_slow_weights`]), and a checkpoint's record of the base model it was trained on
//! ([`base_weights_sha256`]), so that a `--resume` on a model of the same config but other weights
//! (another fine-tune, another quantisation) is refused instead of training on a mixture.

use reference::Model;
use reference::base::weights::{FeedForward, Linear, Mlp};
use sha2::{Digest, Sha256};

/// SHA-256 (hex) of every base weight: those of [`hash_slow_weights`], then the final norm and the
/// LM head (the embedding again when tied). About a second per GB of weights.
pub fn base_weights_sha256(model: &Model) -> String {
    let mut h = Sha256::new();
    hash_slow_weights(&mut h, model);
    let w = &model.weights;
    let mut hasher = WeightHasher {
        h: &mut h,
        bytes: Vec::with_capacity(1 << 16),
    };
    hasher.values(w.final_norm.iter());
    hasher.values(w.lm_head().iter());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every base weight the slow stream reads, in a fixed order: the slow stream cache's key
/// ([`crate::slow_cache`]; changing what is fed here orphans every cached file).
pub fn hash_slow_weights(h: &mut Sha256, model: &Model) {
    let w = &model.weights;
    let mut hasher = WeightHasher {
        h,
        bytes: Vec::with_capacity(1 << 16),
    };
    hasher.values(w.embed.iter());
    for layer in &w.layers {
        hasher.values(layer.attn_norm.iter());
        for l in [&layer.attn.q, &layer.attn.k, &layer.attn.v, &layer.attn.o] {
            hasher.linear(l);
        }
        hasher.values(layer.mlp_norm.iter());
        match &layer.ffn {
            FeedForward::Dense(m) => hasher.mlp(m),
            FeedForward::Moe(moe) => {
                hasher.values(moe.router.iter());
                moe.experts.iter().for_each(|e| hasher.mlp(e));
            }
        }
    }
}

/// Feeds f32 values to SHA-256 as little-endian bytes, 64 KiB at a time.
struct WeightHasher<'h> {
    h: &'h mut Sha256,
    bytes: Vec<u8>,
}

impl WeightHasher<'_> {
    fn values<'v>(&mut self, values: impl Iterator<Item = &'v f32>) {
        for v in values {
            self.bytes.extend_from_slice(&v.to_le_bytes());
            if self.bytes.len() >= 1 << 16 {
                self.h.update(&self.bytes);
                self.bytes.clear();
            }
        }
        self.h.update(&self.bytes);
        self.bytes.clear();
    }

    fn linear(&mut self, l: &Linear) {
        self.values(l.w.iter());
        if let Some(b) = &l.b {
            self.values(b.iter());
        }
    }

    fn mlp(&mut self, m: &Mlp) {
        for l in [&m.gate, &m.up, &m.down] {
            self.linear(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reference::io::builtin::{random_model, tiny_config};

    /// Equal for equal weights, different when one value of any part changes (a layer, the final
    /// norm, the head), and 64 hex digits.
    #[test]
    fn every_weight_counts() {
        let model = random_model(tiny_config(), 3).unwrap();
        let digest = base_weights_sha256(&model);
        assert_eq!(digest.len(), 64);
        assert_eq!(
            digest,
            base_weights_sha256(&random_model(tiny_config(), 3).unwrap())
        );
        let edits: [fn(&mut Model); 3] = [
            |m| m.weights.layers[1].attn.v.w[[0, 0]] += 1.0,
            |m| m.weights.final_norm[0] += 1.0,
            |m| m.weights.embed[[5, 1]] += 1.0,
        ];
        for edit in edits {
            let mut other = model.clone();
            edit(&mut other);
            assert_ne!(base_weights_sha256(&other), digest);
        }
    }
}
