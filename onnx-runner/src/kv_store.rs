//! The runner's KV cache: one store per layer, fed to a graph as `past_key_values.{i}.*` and
//! replaced by its `present.{i}.*` outputs; rollback truncates along the sequence axis.
//!
//! # Shapes
//! - keys, values of layer `i`: `[1, Hkv, S, Dh]`, `S` positions (keys after RoPE).

use crate::error::{Error, Result};
use crate::session::{Input, Outputs};
use ndarray::{Array4, ArrayD, Axis, Ix4, s};
use std::ops::Range;

/// `past_key_values.{i}.key` / `.value`: the graph input names of layer `i`.
pub fn past_names(i: usize) -> (String, String) {
    (
        format!("past_key_values.{i}.key"),
        format!("past_key_values.{i}.value"),
    )
}

/// `present.{i}.key` / `.value`: the graph output names of layer `i`.
pub fn present_names(i: usize) -> (String, String) {
    (format!("present.{i}.key"), format!("present.{i}.value"))
}

/// Keys and values of a contiguous range of layers (global layer indices).
#[derive(Clone, Debug)]
pub struct KvStore {
    layers: Range<usize>,
    past: Vec<(String, String)>,
    present: Vec<(String, String)>,
    /// `[1, Hkv, S, Dh]` per layer of `layers`
    keys: Vec<Array4<f32>>,
    values: Vec<Array4<f32>>,
}

impl KvStore {
    /// An empty store (`S = 0`) for `layers`.
    pub fn new(layers: Range<usize>, kv_heads: usize, head_dim: usize) -> Self {
        let empty = Array4::zeros((1, kv_heads, 0, head_dim));
        KvStore {
            past: layers.clone().map(past_names).collect(),
            present: layers.clone().map(present_names).collect(),
            keys: vec![empty.clone(); layers.len()],
            values: vec![empty; layers.len()],
            layers,
        }
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Positions stored (the same in every layer).
    pub fn len(&self) -> usize {
        self.keys.first().map_or(0, |k| k.len_of(Axis(2)))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys and values of global layer `layer`, `[1, Hkv, S, Dh]` each.
    pub fn layer(&self, layer: usize) -> (&Array4<f32>, &Array4<f32>) {
        let i = layer - self.layers.start;
        (&self.keys[i], &self.values[i])
    }

    /// The `past_key_values.*` inputs of every layer.
    pub fn inputs(&self) -> Vec<(&str, Input<'_>)> {
        let mut inputs = Vec::with_capacity(2 * self.keys.len());
        for (i, (k, v)) in self.past.iter().enumerate() {
            inputs.push((k.as_str(), Input::F32(self.keys[i].view().into_dyn())));
            inputs.push((v.as_str(), Input::F32(self.values[i].view().into_dyn())));
        }
        inputs
    }

    /// Take the `present.*` outputs as the new store: they must hold the stored positions plus
    /// `added`, with the stored shape otherwise.
    pub fn update(&mut self, outputs: &mut Outputs, added: usize, file: &str) -> Result<()> {
        let expected_len = self.len() + added;
        for i in 0..self.keys.len() {
            let (kn, vn) = &self.present[i];
            let template = self.keys[i].dim();
            let expected = [template.0, template.1, expected_len, template.3];
            self.keys[i] = take4(outputs, kn, expected, file)?;
            self.values[i] = take4(outputs, vn, expected, file)?;
        }
        Ok(())
    }

    /// Replace every layer's keys and values (same layers, same positions in each).
    pub fn replace(&mut self, layers: Vec<(Array4<f32>, Array4<f32>)>) {
        assert_eq!(layers.len(), self.keys.len(), "one (key, value) per layer");
        for (i, (k, v)) in layers.into_iter().enumerate() {
            self.keys[i] = k;
            self.values[i] = v;
        }
    }

    /// Keep the first `len` positions (no-op if already shorter).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.slice(s![.., .., ..len, ..]).to_owned();
        }
    }
}

fn take4(
    outputs: &mut Outputs,
    name: &str,
    expected: [usize; 4],
    file: &str,
) -> Result<Array4<f32>> {
    let t: ArrayD<f32> = outputs.take(name)?;
    if t.shape() != expected {
        return Err(Error::WrongShape {
            file: file.into(),
            tensor: name.into(),
            expected: format!("{expected:?}"),
            actual: t.shape().to_vec(),
        });
    }
    Ok(t.into_dimensionality::<Ix4>().expect("rank checked"))
}

/// The KV cache of one graph: kept as ONNX Runtime values between runs (IoBinding, see
/// [`DeviceKv`](crate::device_kv::DeviceKv): on the GPU for CUDA / TensorRT, in ONNX Runtime's CPU
/// buffers for the CPU provider), or as host arrays fed as plain inputs and replaced by copies of
/// the outputs ([`EpConfig::host_kv`](crate::ep::EpConfig::host_kv), for comparisons).
pub enum Kv {
    Host(KvStore),
    Device {
        kv: crate::device_kv::DeviceKv,
        kv_heads: usize,
        head_dim: usize,
    },
}

/// The graph of `session` must take the past keys and values of exactly `layers`: the layer range
/// comes from `m2r2_export.json`, and a cache sized by it is allocated per layer, so a manifest
/// claiming more layers than its graph has is refused here, naming both (issue 16).
pub fn check_layers(session: &crate::session::OnnxSession, layers: &Range<usize>) -> Result<()> {
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
pub fn check_width(
    session: &crate::session::OnnxSession,
    name: &str,
    expected: usize,
    field: &str,
) -> Result<()> {
    let Some(out) = session.outputs().iter().find(|o| o.name == name) else {
        return Ok(()); // a missing output is reported by name when the graph runs
    };
    match out.dims.last() {
        Some(crate::session::Dim::Fixed(d)) if *d != expected => Err(Error::Export {
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
                kv: crate::device_kv::DeviceKv::new(layers, kv_heads, head_dim)?,
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
        session: &mut crate::session::OnnxSession,
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
