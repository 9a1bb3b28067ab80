//! The KV cache kept as ONNX Runtime values between runs, through IoBinding: the `present.*`
//! outputs of one run stay where the provider put them (GPU memory for CUDA / TensorRT, ONNX
//! Runtime's own CPU buffers for the CPU provider) and are bound as the `past_key_values.*` inputs
//! of the next, so decoding a token moves or copies no KV outside the graph. Only the step's small
//! host inputs (ids, positions, mask, the verifier's hidden rows) go in and its logits come out.
//!
//! Rollback (at most once per speculative round, when a draft was rejected) copies the kept
//! positions of every layer into new host tensors, bound on the next run (ONNX Runtime copies them
//! to the device for a GPU provider).
//!
//! # Shapes
//! - keys, values of layer `i`: `[1, Hkv, S, Dh]`
//!
//! [`OnnxSession::run_bound`] (the IoBinding run itself) lives here too.

use crate::error::{Error, Result};
use crate::kv_store::{KvStore, past_names, present_names};
use crate::session::{DType, Input, OnnxSession, Outputs, host_outputs, names};
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

    /// Keep the positions `keep` (increasing), in that order: a token tree's accepted path
    /// (`Kv::compact`). The rows go through the host.
    pub fn select(&mut self, keep: &[usize]) -> Result<()> {
        self.cut()?;
        let err = |e: ort::Error| Error::Runtime(format!("cannot rebuild the KV cache: {e}"));
        for pair in &mut self.values {
            for t in [&mut pair.0, &mut pair.1] {
                let kept = host_array(t, None)?.select(ndarray::Axis(2), keep);
                *t = Tensor::from_array(kept).map_err(err)?.upcast();
            }
        }
        self.len = keep.len();
        Ok(())
    }

    /// A host copy (for checks and reports).
    pub fn to_host(&mut self, kv_heads: usize, head_dim: usize) -> Result<KvStore> {
        self.cut()?;
        let mut store = KvStore::new(self.layers.clone(), kv_heads, head_dim);
        let layers: Vec<(Array4<f32>, Array4<f32>)> = self
            .values
            .iter()
            .map(|(k, v)| Ok((host_array(k, None)?, host_array(v, None)?)))
            .collect::<Result<_>>()?;
        store.replace(layers);
        Ok(store)
    }
}

/// The first `len` positions (all when `None`) of a KV tensor `[1, Hkv, S, Dh]`, copied to the
/// host: one copy from CPU memory, a device copy first from GPU memory.
pub(crate) fn host_array(t: &DynTensor, len: Option<usize>) -> Result<Array4<f32>> {
    let err = |e: ort::Error| Error::Runtime(format!("cannot copy the KV cache to the host: {e}"));
    let on_device;
    let host = if t.memory_info().is_cpu_accessible() {
        t
    } else {
        on_device = t.to(AllocationDevice::CPU, 0).map_err(err)?;
        &on_device
    };
    let array = host
        .try_extract_array::<f32>()
        .map_err(err)?
        .into_dimensionality::<Ix4>()
        .map_err(|e| Error::Runtime(format!("KV tensor of unexpected rank: {e}")))?;
    let len = len.unwrap_or(array.shape()[2]).min(array.shape()[2]);
    Ok(array.slice(s![.., .., ..len, ..]).to_owned())
}

/// The first `len` positions of a KV tensor, as a host tensor.
fn truncated(t: &DynTensor, len: usize) -> Result<DynTensor> {
    let kept = host_array(t, Some(len))?;
    Ok(Tensor::from_array(kept)
        .map_err(|e| Error::Runtime(format!("cannot rebuild the KV cache: {e}")))?
        .upcast())
}

impl OnnxSession {
    /// Run with IoBinding: `host` inputs are checked and copied in by ONNX Runtime, `device`
    /// tensors (earlier outputs kept as ONNX Runtime values) are bound as they are, the outputs
    /// named in `keep` are bound to the provider's memory (the GPU's, or ONNX Runtime's CPU
    /// buffers) and returned without a copy, and every other f32 output is copied to the host.
    pub fn run_bound(
        &mut self,
        host: &[(&str, Input<'_>)],
        device: &[(&str, &DynTensor)],
        keep: &[&str],
    ) -> Result<(Outputs, Vec<(String, DynTensor)>)> {
        let file = self.file.clone();
        let err = |e: ort::Error| Error::ort(&file, e);
        for (name, _) in device {
            if !self.inputs.iter().any(|i| i.name == *name) {
                return Err(Error::UnknownInput {
                    file: file.clone(),
                    name: name.to_string(),
                    known: names(&self.inputs),
                });
            }
        }
        let given: Vec<&str> = host
            .iter()
            .map(|(n, _)| *n)
            .chain(device.iter().map(|(n, _)| *n))
            .collect();
        if let Some(missing) = self
            .inputs
            .iter()
            .find(|i| !given.contains(&i.name.as_str()))
        {
            return Err(Error::MissingInput {
                file,
                name: missing.name.clone(),
            });
        }
        self.check_host_inputs(host)?;

        let device_memory = self.device_memory().map_err(err)?;
        let host_memory = OnnxSession::host_output_memory().map_err(err)?;
        let mut binding = self.session.create_binding().map_err(err)?;
        for (name, input) in host {
            binding
                .bind_input(*name, &input.to_tensor().map_err(err)?)
                .map_err(err)?;
        }
        for (name, tensor) in device {
            binding.bind_input(*name, *tensor).map_err(err)?;
        }
        for info in &self.outputs {
            let memory = if keep.contains(&info.name.as_str()) {
                &device_memory
            } else {
                &host_memory
            };
            binding
                .bind_output_to_device(info.name.as_str(), memory)
                .map_err(err)?;
        }
        let mut outputs = self.session.run_binding(&binding).map_err(err)?;
        let mut kept = Vec::with_capacity(keep.len());
        for name in keep {
            let value = outputs.remove(*name).ok_or_else(|| Error::MissingOutput {
                file: file.clone(),
                name: name.to_string(),
                known: format!("the graph's outputs: {}", names(&self.outputs)),
            })?;
            let tensor: DynTensor = value.downcast().map_err(err)?;
            kept.push((name.to_string(), tensor));
        }
        let tensors = host_outputs(&file, &self.outputs, &outputs, |o| {
            o.dtype == DType::F32 && !keep.contains(&o.name.as_str())
        })?;
        Ok((Outputs { file, tensors }, kept))
    }
}
