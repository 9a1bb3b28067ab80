//! One step shape of a static graph bound once: every input and output of a run of `T` rows
//! (draft.onnx's one row, feed.onnx's one row, verifier.onnx's `m` rows) lives in a tensor
//! allocated once where the session computes, bound once with IoBinding together with the layers'
//! KV buffers (past input and present output: written in place). Each step writes its values
//! into the bound inputs (through host staging tensors when they live on the GPU), runs the
//! binding and reads the outputs back. The addresses never change, which is what a CUDA graph
//! needs: with a `gpu_graph_id` ONNX Runtime captures the step on its first runs and replays it
//! from then on (one graph per step shape; `static_kv.rs` says how ONNX Runtime counts), and
//! without one the same binding saves the per-step allocations on any provider.
//!
//! # Shapes
//! - inputs: the shapes of the first step's host inputs, the same every step (a different shape
//!   is an error: it is a different step shape, with a binding of its own);
//! - outputs: the graph's, with `batch` = 1 and every other named dimension = `T`.

use crate::error::{Error, Result};
use crate::session::{Input, OnnxSession, Outputs};
use crate::tensor_info::Dim;
use ort::memory::Allocator;
use ort::session::{IoBinding, RunOptions};
use ort::value::{DynTensor, Tensor};

/// A bound tensor and, when it lives on the GPU, its host staging twin.
enum Bound {
    F32(Tensor<f32>, Option<Tensor<f32>>),
    I64(Tensor<i64>, Option<Tensor<i64>>),
}

/// Layers' KV buffers to bind in place: past input names, present output names, the buffers.
pub type InPlaceKv<'a> = (
    &'a [(String, String)],
    &'a [(String, String)],
    &'a mut [(DynTensor, DynTensor)],
);

/// Bind each layer's buffers as both its past input and its present output, so the graph writes
/// the step's rows into the buffer it reads.
pub fn bind_in_place(
    binding: &mut IoBinding,
    (past, present, buffers): InPlaceKv<'_>,
) -> ort::Result<()> {
    for (((pk, pv), (ok, ov)), (k, v)) in past.iter().zip(present).zip(buffers.iter_mut()) {
        binding.bind_input(pk.as_str(), &*k)?;
        binding.bind_input(pv.as_str(), &*v)?;
        binding.bind_output(ok.as_str(), k)?;
        binding.bind_output(ov.as_str(), v)?;
    }
    Ok(())
}

pub struct StepBinding {
    file: String,
    rows: usize,
    inputs: Vec<(String, Vec<usize>, Bound)>,
    /// (name, bound output, host staging when the output is on the GPU)
    outputs: Vec<(String, Tensor<f32>, Option<Tensor<f32>>)>,
    binding: IoBinding,
    /// `gpu_graph_id` of this shape, for a session with CUDA graphs
    options: Option<RunOptions>,
    /// Runs so far.
    pub runs: usize,
}

/// Where `rows` rows of the graph's output `dims` go: `batch` = 1, any other name = `rows`.
fn output_shape(dims: &[Dim], rows: usize) -> Vec<usize> {
    dims.iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            Dim::Symbolic(name) if name == "batch" => 1,
            Dim::Symbolic(_) => rows,
        })
        .collect()
}

impl StepBinding {
    /// Bind a step of `rows` rows of `session` with inputs shaped as `host`, each of `buffers`
    /// as the input named in `past` and the output named in `present`; `graph_id`: capture and
    /// replay it as that CUDA graph (the session must have been built with them).
    pub fn new(
        session: &OnnxSession,
        host: &[(&str, Input<'_>)],
        rows: usize,
        (past, present, buffers): InPlaceKv<'_>,
        graph_id: Option<&str>,
    ) -> Result<Self> {
        let file = session.file().to_string();
        let err = |e: ort::Error| Error::ort(&file, format!("cannot bind the step's tensors: {e}"));
        session.check_host_inputs(host)?;
        let gpu = session.ep_used().is_gpu();
        let device = session.allocator().map_err(err)?;
        let cpu = Allocator::default();
        let staging = |gpu: bool| gpu.then_some(&cpu);
        let mut binding = session.session.create_binding().map_err(err)?;
        let mut inputs = Vec::with_capacity(host.len());
        for (name, input) in host {
            let shape = input_shape(input);
            let bound = match input {
                Input::F32(_) => Bound::F32(
                    Tensor::new(&device, shape.clone()).map_err(err)?,
                    staging(gpu)
                        .map(|a| Tensor::new(a, shape.clone()))
                        .transpose()
                        .map_err(err)?,
                ),
                Input::I64(_) => Bound::I64(
                    Tensor::new(&device, shape.clone()).map_err(err)?,
                    staging(gpu)
                        .map(|a| Tensor::new(a, shape.clone()))
                        .transpose()
                        .map_err(err)?,
                ),
            };
            match &bound {
                Bound::F32(t, _) => binding.bind_input(*name, t),
                Bound::I64(t, _) => binding.bind_input(*name, t),
            }
            .map_err(err)?;
            inputs.push((name.to_string(), shape, bound));
        }
        bind_in_place(&mut binding, (past, present, buffers)).map_err(err)?;
        let is_present = |name: &str| present.iter().any(|(k, v)| k == name || v == name);
        let mut outputs = Vec::new();
        for info in session.outputs().iter().filter(|o| !is_present(&o.name)) {
            let shape = output_shape(&info.dims, rows);
            let mut out = Tensor::<f32>::new(&device, shape.clone()).map_err(err)?;
            binding
                .bind_output(info.name.as_str(), &mut out)
                .map_err(err)?;
            let host_copy = staging(gpu)
                .map(|a| Tensor::new(a, shape))
                .transpose()
                .map_err(err)?;
            outputs.push((info.name.clone(), out, host_copy));
        }
        let options = match graph_id {
            Some(id) => {
                let mut options = RunOptions::new().map_err(err)?;
                options.set("gpu_graph_id", id).map_err(err)?;
                Some(options)
            }
            None => None,
        };
        Ok(StepBinding {
            file,
            rows,
            inputs,
            outputs,
            binding,
            options,
            runs: 0,
        })
    }

    /// Rows per run.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Write `host` into the bound inputs, run, and return the outputs on the host.
    pub fn run(
        &mut self,
        session: &mut OnnxSession,
        host: &[(&str, Input<'_>)],
    ) -> Result<Outputs> {
        let file = self.file.clone();
        let graph = self.options.is_some();
        let err = |what: &'static str| {
            let file = file.clone();
            move |e: ort::Error| match graph {
                true => Error::CudaGraph {
                    file,
                    reason: format!("{what}: {e}"),
                },
                false => Error::ort(&file, format!("{what}: {e}")),
            }
        };
        for (name, input) in host {
            let Some((_, shape, bound)) = self.inputs.iter_mut().find(|(n, ..)| n == name) else {
                return Err(Error::ort(
                    &file,
                    format!("`{name}` is not an input of this bound step"),
                ));
            };
            if input_shape(input) != *shape {
                return Err(Error::ort(
                    &file,
                    format!(
                        "`{name}` is {:?}, the bound step's is {shape:?} (a different step \
                         shape needs its own binding)",
                        input_shape(input)
                    ),
                ));
            }
            let write = "cannot write the step's inputs";
            match (bound, input) {
                (Bound::F32(t, staging), Input::F32(a)) => {
                    let dst = staging.as_mut().unwrap_or(t);
                    let values = dst.try_extract_tensor_mut().map_err(err(write))?.1;
                    values.iter_mut().zip(a.iter()).for_each(|(d, s)| *d = *s);
                    if let Some(s) = staging {
                        s.copy_into(t).map_err(err(write))?;
                    }
                }
                (Bound::I64(t, staging), Input::I64(a)) => {
                    let dst = staging.as_mut().unwrap_or(t);
                    let values = dst.try_extract_tensor_mut().map_err(err(write))?.1;
                    values.iter_mut().zip(a.iter()).for_each(|(d, s)| *d = *s);
                    if let Some(s) = staging {
                        s.copy_into(t).map_err(err(write))?;
                    }
                }
                _ => {
                    return Err(Error::ort(
                        &file,
                        format!("`{name}` changed its element type"),
                    ));
                }
            }
        }
        let run = "ONNX Runtime failed the bound step";
        let outputs = match &self.options {
            Some(options) => session
                .session
                .run_binding_with_options(&self.binding, options),
            None => session.session.run_binding(&self.binding),
        }
        .map_err(err(run))?;
        drop(outputs);
        self.binding.synchronize_outputs().map_err(err(run))?;
        self.runs += 1;
        let read = "cannot read the step's outputs";
        let mut tensors = Vec::with_capacity(self.outputs.len());
        for (name, out, staging) in &mut self.outputs {
            let array = match staging {
                Some(s) => {
                    out.copy_into(&mut *s).map_err(err(read))?;
                    s.try_extract_array().map_err(err(read))?.to_owned()
                }
                None => out.try_extract_array().map_err(err(read))?.to_owned(),
            };
            tensors.push((name.clone(), array));
        }
        Ok(Outputs { file, tensors })
    }
}

fn input_shape(input: &Input<'_>) -> Vec<usize> {
    match input {
        Input::F32(a) => a.shape().to_vec(),
        Input::I64(a) => a.shape().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_shapes_put_one_batch_row_and_t_rows() {
        let dims = [
            Dim::Symbolic("batch".into()),
            Dim::Symbolic("sequence_length".into()),
            Dim::Fixed(7),
        ];
        assert_eq!(output_shape(&dims, 3), [1, 3, 7]);
        assert_eq!(output_shape(&dims[..2], 1), [1, 1]);
    }
}
