//! The KV cache of one graph, wherever it lives: ONNX Runtime values kept between runs
//! ([`DeviceKv`], IoBinding) or host arrays ([`KvStore`]), and the checks that a graph takes the
//! cache the manifest sizes.

use crate::device_kv::DeviceKv;
use crate::error::{Error, Result};
use crate::kv_store::{KvStore, past_names};
use crate::session::{Input, OnnxSession, Outputs};
use crate::tensor_info::Dim;
use std::ops::Range;

/// The KV cache of one graph: kept as ONNX Runtime values between runs (IoBinding, see
/// [`DeviceKv`]: on the GPU for CUDA / TensorRT, in ONNX Runtime's CPU
/// buffers for the CPU provider), or as host arrays fed as plain inputs and replaced by copies of
/// the outputs ([`EpConfig::host_kv`](crate::ep::EpConfig::host_kv), for comparisons).
pub enum Kv {
    Host(KvStore),
    Device {
        kv: DeviceKv,
        kv_heads: usize,
        head_dim: usize,
    },
}

/// The graph of `session` must take the past keys and values of exactly `layers`: the layer range
/// comes from `m2r2_export.json`, and a cache sized by it is allocated per layer, so a manifest
/// claiming more layers than its graph has is refused here, naming both.
pub fn check_layers(session: &OnnxSession, layers: &Range<usize>) -> Result<()> {
    let inputs = session.inputs();
    let past = inputs
        .iter()
        .filter(|i| i.name.starts_with("past_key_values."))
        .count();
    let expected = layers.len().checked_mul(2);
    let names_match = || {
        layers.clone().all(|l| {
            let (k, v) = past_names(l);
            inputs.iter().any(|i| i.name == k) && inputs.iter().any(|i| i.name == v)
        })
    };
    if expected != Some(past) || !names_match() {
        return Err(Error::Export {
            file: session.file().to_string(),
            msg: format!(
                "m2r2_export.json puts layers {}..{} in this graph, but it takes {past} past \
                 key / value inputs (the manifest and the graph disagree: export the folder again)",
                layers.start, layers.end
            ),
        });
    }
    Ok(())
}

/// The last dimension of the graph's output `name`, when fixed, must be `expected` (the
/// manifest's `field`): the runner sizes buffers by the manifest (a pruned draft head scatters
/// into `[V]` rows), so a manifest claiming another width than its graph is refused at load.
pub fn check_width(session: &OnnxSession, name: &str, expected: usize, field: &str) -> Result<()> {
    let Some(out) = session.outputs().iter().find(|o| o.name == name) else {
        return Ok(()); // a missing output is reported by name when the graph runs
    };
    match out.dims.last() {
        Some(Dim::Fixed(d)) if *d != expected => Err(Error::Export {
            file: session.file().to_string(),
            msg: format!(
                "m2r2_export.json says {field} = {expected}, but the graph's `{name}` has {d} \
                 columns (the manifest and the graph disagree: export the folder again)"
            ),
        }),
        _ => Ok(()),
    }
}

impl Kv {
    /// An empty cache for `layers`: ONNX Runtime values when `bound`, else host arrays.
    pub fn new(
        layers: Range<usize>,
        kv_heads: usize,
        head_dim: usize,
        bound: bool,
    ) -> Result<Self> {
        Ok(if bound {
            Kv::Device {
                kv: DeviceKv::new(layers, kv_heads, head_dim)?,
                kv_heads,
                head_dim,
            }
        } else {
            Kv::Host(KvStore::new(layers, kv_heads, head_dim))
        })
    }

    pub fn len(&self) -> usize {
        match self {
            Kv::Host(store) => store.len(),
            Kv::Device { kv, .. } => kv.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Run `session` on `inputs` plus this cache's `past_key_values.*`; the cache takes the
    /// `present.*` outputs (`added` more positions). Returns the other outputs.
    pub fn run(
        &mut self,
        session: &mut OnnxSession,
        inputs: &[(&str, Input<'_>)],
        added: usize,
    ) -> Result<Outputs> {
        match self {
            Kv::Host(store) => {
                let mut all: Vec<(&str, Input<'_>)> =
                    inputs.iter().map(|(n, i)| (*n, i.reborrow())).collect();
                all.extend(store.inputs());
                let mut out = session.run(&all)?;
                drop(all);
                store.update(&mut out, added, session.file())?;
                Ok(out)
            }
            Kv::Device { kv, .. } => kv.run(session, inputs, added),
        }
    }

    /// Keep a token tree's accepted `path` (root at `root`): positions `0..root`, then the
    /// node rows `root + path[i]` at `root + i`; the rest of the round is dropped.
    pub fn compact(&mut self, root: usize, path: &[usize]) -> Result<()> {
        let keep: Vec<usize> = (0..root).chain(path.iter().map(|&a| root + a)).collect();
        match self {
            Kv::Host(store) => {
                store.select(&keep);
                Ok(())
            }
            Kv::Device { kv, .. } => kv.select(&keep),
        }
    }

    /// Keep the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        match self {
            Kv::Host(store) => store.truncate(len),
            Kv::Device { kv, .. } => kv.truncate(len),
        }
    }

    /// The cache on the host (a copy for a device cache).
    pub fn to_host(&mut self) -> Result<KvStore> {
        match self {
            Kv::Host(store) => Ok(store.clone()),
            Kv::Device {
                kv,
                kv_heads,
                head_dim,
            } => kv.to_host(*kv_heads, *head_dim),
        }
    }
}
