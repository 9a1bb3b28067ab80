//! The KV cache kept on the GPU between runs (CUDA / TensorRT), through IoBinding: the `present.*`
//! outputs of one run stay in device memory and are bound as the `past_key_values.*` inputs of the
//! next, so decoding a token moves no KV between host and device. Only the step's small host
//! inputs (ids, positions, mask, the verifier's hidden rows) go in and its logits come out.
//!
//! Rollback (at most once per speculative round, when a draft was rejected) copies the layers to
//! the host, truncates them along the sequence axis and binds the truncated host tensors on the
//! next run (ONNX Runtime copies them back to the device).
//!
//! # Shapes
//! - keys, values of layer `i`: `[1, Hkv, S, Dh]`

use crate::error::{Error, Result};
use crate::kv_store::{KvStore, past_names, present_names};
use crate::session::{Input, OnnxSession, Outputs};
use ndarray::{Array4, Ix4, s};
use ort::memory::AllocationDevice;
use ort::value::{DynTensor, Tensor};
use std::ops::Range;

pub struct DeviceKv {
    layers: Range<usize>,
    past: Vec<(String, String)>,
    present: Vec<(String, String)>,
    /// (key, value) per layer: on the device after a run, on the host after a rollback or at start.
    values: Vec<(DynTensor, DynTensor)>,
    len: usize,
    /// Set by a rollback: the tensors still hold more than `len` positions (cut before the next
    /// use, which can fail and report it).
    stale: bool,
}

impl DeviceKv {
    /// An empty cache (`S = 0`) for `layers`.
    pub fn new(layers: Range<usize>, kv_heads: usize, head_dim: usize) -> Result<Self> {
        let empty = || -> Result<DynTensor> {
            let a = Array4::<f32>::zeros((1, kv_heads, 0, head_dim));
            Ok(Tensor::from_array(a)
                .map_err(|e| Error::Runtime(format!("cannot make an empty KV tensor: {e}")))?
                .upcast())
        };
        let values = layers
            .clone()
            .map(|_| Ok((empty()?, empty()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceKv {
            past: layers.clone().map(past_names).collect(),
            present: layers.clone().map(present_names).collect(),
            values,
            layers,
            len: 0,
            stale: false,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Run `session` with `host` inputs plus this cache, which then holds `added` more positions;
    /// returns the outputs that came back to the host.
    pub fn run(
        &mut self,
        session: &mut OnnxSession,
        host: &[(&str, Input<'_>)],
        added: usize,
    ) -> Result<Outputs> {
        self.cut()?;
        let mut device: Vec<(&str, &DynTensor)> = Vec::with_capacity(2 * self.values.len());
        for ((kn, vn), (k, v)) in self.past.iter().zip(&self.values) {
            device.push((kn.as_str(), k));
            device.push((vn.as_str(), v));
        }
        let keep: Vec<&str> = self
            .present
            .iter()
            .flat_map(|(k, v)| [k.as_str(), v.as_str()])
            .collect();
        let (outputs, kept) = session.run_bound(host, &device, &keep)?;
        let mut kept = kept.into_iter().map(|(_, t)| t);
        for pair in &mut self.values {
            let (Some(k), Some(v)) = (kept.next(), kept.next()) else {
                unreachable!("run_bound returns one tensor per kept name");
            };
            *pair = (k, v);
        }
        self.len += added;
        Ok(outputs)
    }

    /// Keep the first `len` positions (no-op if already shorter). The copy happens before the next
    /// run, so a rollback cannot fail.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.stale = true;
        }
    }

    fn cut(&mut self) -> Result<()> {
        if self.stale {
            for pair in &mut self.values {
                pair.0 = truncated(&pair.0, self.len)?;
                pair.1 = truncated(&pair.1, self.len)?;
            }
            self.stale = false;
        }
        Ok(())
    }

    /// A host copy (for checks and reports).
    pub fn to_host(&mut self, kv_heads: usize, head_dim: usize) -> Result<KvStore> {
        self.cut()?;
        let mut store = KvStore::new(self.layers.clone(), kv_heads, head_dim);
        let layers: Vec<(Array4<f32>, Array4<f32>)> = self
            .values
            .iter()
            .map(|(k, v)| Ok((host_array(k)?, host_array(v)?)))
            .collect::<Result<_>>()?;
        store.replace(layers);
        Ok(store)
    }
}

/// `[1, Hkv, S, Dh]` on the host.
fn host_array(t: &DynTensor) -> Result<Array4<f32>> {
    let err = |e: ort::Error| Error::Runtime(format!("cannot copy the KV cache to the host: {e}"));
    let host = t.to(AllocationDevice::CPU, 0).map_err(err)?;
    let array = host.try_extract_array::<f32>().map_err(err)?;
    array
        .to_owned()
        .into_dimensionality::<Ix4>()
        .map_err(|e| Error::Runtime(format!("KV tensor of unexpected rank: {e}")))
}

/// The first `len` positions of a KV tensor, as a host tensor.
fn truncated(t: &DynTensor, len: usize) -> Result<DynTensor> {
    let a = host_array(t)?;
    let kept = a.slice(s![.., .., ..len, ..]).to_owned();
    Ok(Tensor::from_array(kept)
        .map_err(|e| Error::Runtime(format!("cannot rebuild the KV cache: {e}")))?
        .upcast())
}
