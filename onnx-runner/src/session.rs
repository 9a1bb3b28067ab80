//! One ONNX graph in ONNX Runtime: load it on an execution provider, describe its inputs and
//! outputs, and run it with inputs checked by name, dtype and rank (errors name the graph file and
//! the tensor, before ONNX Runtime sees anything).

use crate::ep::{Ep, EpConfig};
use crate::error::{Error, Result};
use crate::runtime;
pub use crate::tensor_info::{DType, Dim, TensorInfo};
use ndarray::{ArrayD, ArrayViewD, CowArray, IxDyn};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{Session, SessionInputValue, SessionOutputs};
use ort::value::{DynTensor, Tensor, TensorRef};
use std::borrow::Cow;
use std::path::Path;

/// A graph input: f32 activations / KV, or int64 ids, positions and masks.
#[derive(Clone, Debug)]
pub enum Input<'a> {
    F32(ArrayViewD<'a, f32>),
    I64(ArrayViewD<'a, i64>),
}

impl Input<'_> {
    /// An owned ONNX Runtime tensor of this input, for IoBinding.
    pub(crate) fn to_tensor(&self) -> ort::Result<DynTensor> {
        Ok(match self {
            Input::F32(a) => Tensor::from_array(a.as_standard_layout().into_owned())?.upcast(),
            Input::I64(a) => Tensor::from_array(a.as_standard_layout().into_owned())?.upcast(),
        })
    }

    /// The same input, borrowed for a shorter time.
    pub fn reborrow(&self) -> Input<'_> {
        match self {
            Input::F32(a) => Input::F32(a.view()),
            Input::I64(a) => Input::I64(a.view()),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Input::F32(_) => DType::F32,
            Input::I64(_) => DType::I64,
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            Input::F32(a) => a.shape(),
            Input::I64(a) => a.shape(),
        }
    }
}

/// The f32 outputs of one run, by name.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub(crate) file: String,
    pub(crate) tensors: Vec<(String, ArrayD<f32>)>,
}

impl Outputs {
    /// The output `name`; an error naming it and the graph file when the graph has none.
    pub fn get(&self, name: &str) -> Result<&ArrayD<f32>> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| self.missing(name))
    }

    /// `name` is not among the outputs this run returned (or any left to take).
    fn missing(&self, name: &str) -> Error {
        let names = self.names();
        Error::MissingOutput {
            file: self.file.clone(),
            name: name.into(),
            known: match names.is_empty() {
                true => "the run returned no other f32 output: is the graph the export's?".into(),
                false => format!("the run returned {}", names.join(", ")),
            },
        }
    }

    /// Take the output `name` out (no copy).
    pub fn take(&mut self, name: &str) -> Result<ArrayD<f32>> {
        match self.tensors.iter().position(|(n, _)| n == name) {
            Some(i) => Ok(self.tensors.swap_remove(i).1),
            None => Err(self.missing(name)),
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.tensors.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// One graph loaded in ONNX Runtime.
pub struct OnnxSession {
    pub(crate) session: Session,
    /// The graph file, for messages.
    pub(crate) file: String,
    pub(crate) inputs: Vec<TensorInfo>,
    pub(crate) outputs: Vec<TensorInfo>,
    ep_used: Ep,
    /// CUDA / TensorRT device (IoBinding's device memory, see `device_kv.rs`).
    pub(crate) device_id: i32,
}

impl std::fmt::Debug for OnnxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxSession")
            .field("file", &self.file)
            .field("ep_used", &self.ep_used)
            .finish_non_exhaustive()
    }
}

/// Why building a session failed: the provider, or anything else.
enum BuildError {
    Provider(String),
    Other(String),
}

impl OnnxSession {
    /// Load `path` on `ep.ep`. A provider that cannot be registered is an
    /// [`Error::ExecutionProvider`] with its own reason, unless `ep.fallback`: then the graph runs
    /// on the CPU and [`ep_used`](Self::ep_used) says so (with a warning on stderr).
    pub fn load(path: &Path, ep: &EpConfig) -> Result<OnnxSession> {
        Self::load_with_cuda_graph(path, ep, false)
    }

    /// [`load`](Self::load), with the CUDA provider's `enable_cuda_graph` when `cuda_graph` (then
    /// every run must set `gpu_graph_id`, see `static_kv.rs`). A session ONNX Runtime refuses to
    /// build that way (e.g. nodes it did not place on CUDA) is [`Error::CudaGraph`] with its
    /// reason, and so is a fallback to the CPU (`ep.fallback`) when the graphs were asked for by
    /// name (`ep.cuda_graph == Some(true)`): the CPU has none, and a run that asked for them must
    /// not quietly run without. The default (`None`, graphs where they apply) falls back with a
    /// warning that says they are off.
    pub fn load_with_cuda_graph(
        path: &Path,
        ep: &EpConfig,
        cuda_graph: bool,
    ) -> Result<OnnxSession> {
        let file = path.display().to_string();
        if !path.is_file() {
            return Err(Error::Ort {
                file,
                msg: "no such graph file".into(),
            });
        }
        runtime::init()?;
        // TensorRT's profiles are derived from the graph's inputs, which only a session can tell.
        let inputs_for_profile = if ep.ep == Ep::TensorRt && ep.tensorrt.ranges.is_some() {
            let cpu = build(
                path,
                &EpConfig {
                    ep: Ep::Cpu,
                    ..ep.clone()
                },
                &[],
            )
            .map_err(|e| build_error(&file, Ep::Cpu, e))?;
            cpu.inputs().iter().map(TensorInfo::from_outlet).collect()
        } else {
            Vec::new()
        };
        let dispatches = ep.dispatches(&file, &inputs_for_profile, cuda_graph)?;
        let (session, ep_used) = match build(path, ep, &dispatches) {
            Ok(session) => (session, ep.ep),
            // CUDA graphs asked for by name are not dropped for the CPU, which has none
            Err(BuildError::Provider(reason))
                if ep.fallback && cuda_graph && ep.cuda_graph == Some(true) =>
            {
                return Err(Error::CudaGraph {
                    file,
                    reason: format!(
                        "CUDA graphs need the CUDA execution provider, which is not available: {} \
                         (--ep-fallback runs on the CPU, which has no CUDA graphs: pass \
                         `--cuda-graph off` with it, or leave --cuda-graph unset)",
                        provider_reason(&reason)
                    ),
                });
            }
            Err(BuildError::Provider(reason)) if ep.fallback => {
                eprintln!(
                    "warning: {file}: the {} execution provider is not available ({reason}); \
                     running on the CPU (--ep-fallback){}",
                    ep.ep,
                    match cuda_graph {
                        true => ", without CUDA graphs",
                        false => "",
                    }
                );
                let session = build(path, ep, &[]).map_err(|e| build_error(&file, Ep::Cpu, e))?;
                (session, Ep::Cpu)
            }
            Err(BuildError::Other(msg)) if cuda_graph => {
                return Err(Error::CudaGraph {
                    file,
                    reason: format!(
                        "ONNX Runtime refused a session with CUDA graphs: {msg} (`--cuda-graph \
                         off` runs without them)"
                    ),
                });
            }
            Err(e) => return Err(build_error(&file, ep.ep, e)),
        };
        Ok(OnnxSession {
            inputs: session
                .inputs()
                .iter()
                .map(TensorInfo::from_outlet)
                .collect(),
            outputs: session
                .outputs()
                .iter()
                .map(TensorInfo::from_outlet)
                .collect(),
            session,
            file,
            ep_used,
            device_id: ep.device_id,
        })
    }

    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    /// The provider that really runs this graph.
    pub fn ep_used(&self) -> Ep {
        self.ep_used
    }

    /// Finish ONNX Runtime's profile (sessions loaded with [`EpConfig::profile`]) and return the
    /// file it was written to.
    pub fn end_profiling(&mut self) -> Result<String> {
        let file = self.file.clone();
        self.session
            .end_profiling()
            .map_err(|e| Error::ort(&file, format!("cannot write the profile: {e}")))
    }

    /// The graph file.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// A metadata property of the graph (`m2r2.graph`, `m2r2.layers`, ...).
    pub fn metadata(&self, key: &str) -> Result<Option<String>> {
        let metadata = self
            .session
            .metadata()
            .map_err(|e| Error::ort(&self.file, e))?;
        Ok(metadata.custom(key))
    }

    /// Run the graph once. Every graph input must be given exactly once with its dtype, rank and
    /// fixed dimensions; returns every f32 output.
    pub fn run(&mut self, inputs: &[(&str, Input<'_>)]) -> Result<Outputs> {
        self.check_inputs(inputs)?;
        // Contiguous copies only where a view is not already in standard layout.
        let f32s: Vec<CowArray<f32, IxDyn>> = inputs
            .iter()
            .filter_map(|(_, i)| match i {
                Input::F32(a) => Some(a.as_standard_layout()),
                Input::I64(_) => None,
            })
            .collect();
        let i64s: Vec<CowArray<i64, IxDyn>> = inputs
            .iter()
            .filter_map(|(_, i)| match i {
                Input::I64(a) => Some(a.as_standard_layout()),
                Input::F32(_) => None,
            })
            .collect();
        let (mut next_f32, mut next_i64) = (f32s.iter(), i64s.iter());
        let mut values: Vec<(Cow<str>, SessionInputValue)> = Vec::with_capacity(inputs.len());
        for (name, input) in inputs {
            let value: SessionInputValue = match input {
                Input::F32(_) => {
                    let array = next_f32.next().expect("one per f32 input");
                    TensorRef::from_array_view(array)
                        .map_err(|e| self.tensor_error(name, e))?
                        .into()
                }
                Input::I64(_) => {
                    let array = next_i64.next().expect("one per i64 input");
                    TensorRef::from_array_view(array)
                        .map_err(|e| self.tensor_error(name, e))?
                        .into()
                }
            };
            values.push((Cow::Borrowed(*name), value));
        }
        let file = self.file.clone();
        let outputs = self.session.run(values).map_err(|e| Error::ort(&file, e))?;
        let mut tensors = Vec::with_capacity(self.outputs.len());
        for info in self.outputs.iter().filter(|o| o.dtype == DType::F32) {
            let value = outputs
                .get(&info.name)
                .ok_or_else(|| Error::MissingOutput {
                    file: file.clone(),
                    name: info.name.clone(),
                    known: "ONNX Runtime returned fewer outputs than the graph declares".into(),
                })?;
            let array = value
                .try_extract_array::<f32>()
                .map_err(|e| Error::ort(&file, format!("output `{}`: {e}", info.name)))?;
            tensors.push((info.name.clone(), array.to_owned()));
        }
        Ok(Outputs { file, tensors })
    }

    /// Where IoBinding has ONNX Runtime put the outputs that come back to the host.
    pub(crate) fn host_output_memory() -> ort::Result<MemoryInfo<'static>> {
        MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::CPUOutput,
        )
    }

    /// The memory this session computes in: the GPU's for CUDA / TensorRT, else the CPU's.
    /// ONNX Runtime's allocator where this session computes: the GPU's memory for CUDA /
    /// TensorRT, else the CPU's (for tensors bound once: KV buffers, step bindings).
    pub(crate) fn allocator(&self) -> ort::Result<ort::memory::Allocator> {
        if self.ep_used().is_gpu() {
            ort::memory::Allocator::new(&self.session, self.device_memory()?)
        } else {
            Ok(ort::memory::Allocator::default())
        }
    }

    pub(crate) fn device_memory(&self) -> ort::Result<MemoryInfo<'static>> {
        if self.ep_used().is_gpu() {
            MemoryInfo::new(
                AllocationDevice::CUDA,
                self.device_id,
                AllocatorType::Device,
                MemoryType::Default,
            )
        } else {
            MemoryInfo::new(
                AllocationDevice::CPU,
                0,
                AllocatorType::Device,
                MemoryType::Default,
            )
        }
    }

    fn tensor_error(&self, name: &str, e: impl std::fmt::Display) -> Error {
        Error::ort(&self.file, format!("input `{name}`: {e}"))
    }

    fn check_inputs(&self, inputs: &[(&str, Input<'_>)]) -> Result<()> {
        self.check_host_inputs(inputs)?;
        if let Some(missing) = self
            .inputs
            .iter()
            .find(|info| !inputs.iter().any(|(n, _)| *n == info.name))
        {
            return Err(Error::MissingInput {
                file: self.file.clone(),
                name: missing.name.clone(),
            });
        }
        Ok(())
    }

    /// Name, dtype and shape of each given input (not that every input is given).
    pub(crate) fn check_host_inputs(&self, inputs: &[(&str, Input<'_>)]) -> Result<()> {
        for (i, (name, input)) in inputs.iter().enumerate() {
            let info = self
                .inputs
                .iter()
                .find(|info| info.name == *name)
                .ok_or_else(|| Error::UnknownInput {
                    file: self.file.clone(),
                    name: name.to_string(),
                    known: names(&self.inputs),
                })?;
            if inputs[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::ort(
                    &self.file,
                    format!("input `{name}` is given twice"),
                ));
            }
            if input.dtype() != info.dtype {
                return Err(Error::WrongDtype {
                    file: self.file.clone(),
                    tensor: name.to_string(),
                    expected: info.describe(),
                    actual: input.dtype().to_string(),
                });
            }
            let shape = input.shape();
            let fits = shape.len() == info.dims.len()
                && shape.iter().zip(&info.dims).all(|(&n, d)| match d {
                    Dim::Fixed(m) => n == *m,
                    Dim::Symbolic(_) => true,
                });
            if !fits {
                return Err(Error::WrongShape {
                    file: self.file.clone(),
                    tensor: name.to_string(),
                    expected: info.describe(),
                    actual: shape.to_vec(),
                });
            }
        }
        Ok(())
    }
}

/// `a, b, c`: the names of a graph's inputs or outputs, for messages.
pub(crate) fn names(list: &[TensorInfo]) -> String {
    list.iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Build a session with `dispatches` registered (none: the CPU).
fn build(
    path: &Path,
    ep: &EpConfig,
    dispatches: &[ort::ep::ExecutionProviderDispatch],
) -> std::result::Result<Session, BuildError> {
    // ort's builder errors are !Send: turn each into a string right here.
    fn other<R>(e: ort::Error<R>) -> BuildError {
        BuildError::Other(e.to_string())
    }
    let environment = runtime::environment().map_err(|e| BuildError::Other(e.to_string()))?;
    let mut builder =
        Session::builder(environment).map_err(|e| BuildError::Other(e.to_string()))?;
    if ep.own_thread_pool || ep.intra_threads.is_some() || ep.intra_spinning.is_some() {
        builder = builder.with_independent_thread_pool().map_err(other)?;
    }
    if let Some(threads) = ep.intra_threads {
        builder = builder.with_intra_threads(threads).map_err(other)?;
    }
    if let Some(spinning) = ep.intra_spinning {
        builder = builder.with_intra_op_spinning(spinning).map_err(other)?;
    }
    if let Some(level) = ep.optimization {
        builder = builder
            .with_optimization_level(level.level())
            .map_err(other)?;
    }
    if let Some(prefix) = &ep.profile {
        builder = builder.with_profiling(prefix).map_err(other)?;
    }
    if let Some(path) = &ep.optimized_model {
        builder = builder.with_optimized_model_path(path).map_err(other)?;
    }
    if !dispatches.is_empty() {
        builder = builder
            .with_execution_providers(dispatches)
            .map_err(|e| BuildError::Provider(e.message().to_string()))?;
    }
    builder.commit_from_file(path).map_err(other)
}

fn build_error(file: &str, ep: Ep, error: BuildError) -> Error {
    match error {
        BuildError::Provider(reason) => Error::ExecutionProvider {
            file: file.into(),
            ep: ep.name(),
            reason: provider_reason(&reason),
        },
        BuildError::Other(msg) => Error::ort(file, msg),
    }
}

/// A provider's own reason for not registering, with what to load instead where the library
/// loaded is a CPU build.
fn provider_reason(reason: &str) -> String {
    if reason.contains("not enabled in this build") {
        let library = crate::runtime::init()
            .map_or_else(|_| "(unknown)".into(), |r| r.path.display().to_string());
        format!(
            "{reason} (the ONNX Runtime library loaded, {library}, is a CPU build: point \
             ORT_DYLIB_PATH at an onnxruntime-gpu build)"
        )
    } else {
        reason.into()
    }
}

/// The f32 values of the outputs of a bound run of graph `file` (its outputs `infos`) that
/// `wanted` picks, copied to the host; an output ONNX Runtime did not return is left out.
pub(crate) fn host_outputs(
    file: &str,
    infos: &[TensorInfo],
    outputs: &SessionOutputs<'_>,
    wanted: impl Fn(&TensorInfo) -> bool,
) -> Result<Vec<(String, ArrayD<f32>)>> {
    let mut tensors = Vec::new();
    for info in infos.iter().filter(|o| wanted(o)) {
        if let Some(value) = outputs.get(&info.name) {
            let array = value
                .try_extract_array::<f32>()
                .map_err(|e| Error::ort(file, format!("output `{}`: {e}", info.name)))?;
            tensors.push((info.name.clone(), array.to_owned()));
        }
    }
    Ok(tensors)
}
