//! The KV cache: preallocated per layer, written at the current position, so rolling back (after a
//! rejected speculative draft) is just moving `len` (llama2.c's `[layer, seq, kv_dim]` layout).

use crate::base::config::ModelConfig;
use ndarray::{Array2, ArrayView2, s};

/// Keys and values of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerKv {
    /// `[S_max, Hkv*Dh]`, keys after RoPE
    pub k: Array2<f32>,
    /// `[S_max, Hkv*Dh]`
    pub v: Array2<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    /// Positions `0..len` are valid in every layer.
    len: usize,
}

impl KvCache {
    /// An empty cache for `capacity` positions (at most the model's context).
    pub fn new(config: &ModelConfig, capacity: usize) -> Self {
        let zeros = || Array2::zeros((capacity, config.kv_dim()));
        KvCache {
            layers: (0..config.num_hidden_layers)
                .map(|_| LayerKv {
                    k: zeros(),
                    v: zeros(),
                })
                .collect(),
            len: 0,
        }
    }

    /// Valid positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, |l| l.k.nrows())
    }

    /// Roll back to `len` positions (no-op if already shorter). Entries past `len` are garbage from
    /// then on and are overwritten by the next write.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Mark positions `0..len` valid after the layers wrote them.
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "cache length {len} beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// Store keys and values of `T` positions starting at `pos0` in layer `layer`.
    ///
    /// # Shapes
    /// - `k`, `v`: `[T, Hkv*Dh]`
    ///
    /// # Panics
    /// If `pos0 + T` exceeds the capacity (callers check the context first).
    pub fn write(&mut self, layer: usize, pos0: usize, k: ArrayView2<f32>, v: ArrayView2<f32>) {
        let end = pos0 + k.nrows();
        let l = &mut self.layers[layer];
        l.k.slice_mut(s![pos0..end, ..]).assign(&k);
        l.v.slice_mut(s![pos0..end, ..]).assign(&v);
    }

    /// Keep scratch rows as the next positions, in every layer: row `len + offsets[i]` moves to
    /// position `len + i`, and `len` grows by `offsets.len()`. Keeps the accepted path of a token
    /// tree (`offsets` = its nodes, root first, `base/tree.rs`): each row was rotated for the
    /// position it moves to, so the copy is exact; the other nodes' rows become garbage.
    ///
    /// # Panics
    /// If `offsets` is not increasing with `offsets[i] >= i` (a path is: each node after its
    /// parent), or reaches past the capacity.
    pub fn compact(&mut self, offsets: &[usize]) {
        let len = self.len;
        for (i, &off) in offsets.iter().enumerate() {
            assert!(
                off >= i && (i == 0 || off > offsets[i - 1]),
                "scratch rows {offsets:?} are not a path (increasing, each at or after its target)"
            );
            if off == i {
                continue;
            }
            // in order: a source is never an earlier target (j < i <= off) and a target never a
            // later source (offsets[j] > off >= i)
            for l in &mut self.layers {
                for m in [&mut l.k, &mut l.v] {
                    let (mut to, from) = m.multi_slice_mut((s![len + i, ..], s![len + off, ..]));
                    to.assign(&from);
                }
            }
        }
        self.set_len(len + offsets.len());
    }

    /// Keys and values of positions `0..end` of a layer.
    ///
    /// # Shapes
    /// -> (`[end, Hkv*Dh]`, `[end, Hkv*Dh]`)
    pub fn layer(&self, layer: usize, end: usize) -> (ArrayView2<'_, f32>, ArrayView2<'_, f32>) {
        let l = &self.layers[layer];
        (l.k.slice(s![..end, ..]), l.v.slice(s![..end, ..]))
    }

    /// Whether the first `len` positions of every layer equal `other`'s bit for bit.
    pub fn prefix_equals(&self, other: &KvCache, len: usize) -> bool {
        self.layers.len() == other.layers.len()
            && self.layers.iter().zip(&other.layers).all(|(a, b)| {
                a.k.slice(s![..len, ..]) == b.k.slice(s![..len, ..])
                    && a.v.slice(s![..len, ..]) == b.v.slice(s![..len, ..])
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use ndarray::Array2;

    #[test]
    fn write_truncate_rewrite() {
        let config = builtin::tiny_config();
        let mut cache = KvCache::new(&config, 8);
        let kv = config.kv_dim();
        let ones = Array2::from_elem((3, kv), 1.0f32);
        cache.write(0, 0, ones.view(), ones.view());
        cache.set_len(3);
        cache.truncate(1);
        assert_eq!(cache.len(), 1);
        let twos = Array2::from_elem((1, kv), 2.0f32);
        cache.write(0, 1, twos.view(), twos.view());
        cache.set_len(2);
        let (k, _) = cache.layer(0, 2);
        assert_eq!(k.row(0)[0], 1.0);
        assert_eq!(k.row(1)[0], 2.0);
    }

    /// Scratch rows 2 + [0, 2, 5] (a path of a token tree) become positions 2, 3, 4 in every
    /// layer; the rows before `len` stay.
    #[test]
    fn compact_keeps_a_path() {
        let config = builtin::tiny_config();
        let mut cache = KvCache::new(&config, 8);
        let kv = config.kv_dim();
        let rows = Array2::from_shape_fn((8, kv), |(t, _)| t as f32); // row t holds t
        for l in 0..config.num_hidden_layers {
            cache.write(l, 0, rows.view(), (-&rows).view());
        }
        cache.set_len(2);
        cache.compact(&[0, 2, 5]);
        assert_eq!(cache.len(), 5);
        for l in 0..config.num_hidden_layers {
            let (k, v) = cache.layer(l, 5);
            let firsts: Vec<f32> = k.rows().into_iter().map(|r| r[0]).collect();
            assert_eq!(firsts, [0.0, 1.0, 2.0, 4.0, 7.0], "layer {l}");
            assert_eq!(v.row(4)[kv - 1], -7.0);
        }
    }

    #[test]
    #[should_panic(expected = "are not a path")]
    fn compact_refuses_rows_out_of_order() {
        let config = builtin::tiny_config();
        let mut cache = KvCache::new(&config, 8);
        cache.compact(&[0, 3, 2]);
    }
}
