//! Execution providers: which one runs a graph, and how it is registered.
//!
//! Registration is fail-fast: the provider is registered with `error_on_failure`, so a provider
//! that ONNX Runtime cannot set up (not compiled into the library, CUDA libraries missing, no
//! device) is an [`Error::ExecutionProvider`] carrying the
//! provider's own reason. Only with [`EpConfig::fallback`] (`--ep-fallback`) does the session fall
//! back to the CPU, and then [`OnnxSession::ep_used`](crate::session::OnnxSession::ep_used) says so.
//!
//! TensorRT builds one engine per optimisation profile; the profile comes from the model config
//! (rows fed per step `1..=draft_len + 1`, cached positions `0..=max context`), see
//! [`DimRanges`] and [`ShapeProfile`].

use crate::error::{Error, Result};
use crate::tensor_info::{Dim, TensorInfo};
use ort::ep::{self, ExecutionProvider, ExecutionProviderDispatch};
use std::path::PathBuf;

/// An execution provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ep {
    Cpu,
    Cuda,
    TensorRt,
}

impl Ep {
    pub const ALL: [Ep; 3] = [Ep::Cpu, Ep::Cuda, Ep::TensorRt];

    /// The name used on the command line and in reports: `cpu`, `cuda`, `tensorrt`.
    pub fn name(self) -> &'static str {
        match self {
            Ep::Cpu => "cpu",
            Ep::Cuda => "cuda",
            Ep::TensorRt => "tensorrt",
        }
    }

    /// Whether the provider runs on a GPU.
    pub fn is_gpu(self) -> bool {
        self != Ep::Cpu
    }
}

impl std::fmt::Display for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Ep {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ep::ALL
            .into_iter()
            .find(|ep| ep.name() == s)
            .ok_or_else(|| format!("unknown execution provider `{s}`: use cpu, cuda or tensorrt"))
    }
}

/// Inclusive ranges `(min, opt, max)` of the dynamic dimensions, for TensorRT's profiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimRanges {
    /// `sequence_length`: rows fed in one run.
    pub sequence: (usize, usize, usize),
    /// `past_sequence_length`: positions already in the cache.
    pub past: (usize, usize, usize),
    /// A static export's `L` (`--static-cache`): its draft.onnx's fast rows attend over the
    /// buffer and their own keys, `buffer_plus_sequence_length = L + sequence_length`.
    pub buffer: Option<usize>,
}

impl DimRanges {
    /// Rows `1..=draft_len + 1` (a prefill longer than that is split into chunks by the runner),
    /// cached positions `0..=max_context`.
    pub fn from_model(draft_len: usize, max_context: usize) -> Self {
        let rows = draft_len + 1;
        DimRanges {
            sequence: (1, 1, rows),
            past: (0, max_context / 2, max_context.saturating_sub(rows)),
            buffer: None,
        }
    }

    /// These ranges for a static export of `l_max` positions.
    pub fn with_buffer(self, l_max: usize) -> Self {
        DimRanges {
            buffer: Some(l_max),
            ..self
        }
    }

    /// `(min, opt, max)` of a symbolic dimension, or `None` for a name we do not know.
    fn of(&self, symbol: &str) -> Option<(usize, usize, usize)> {
        let (s, p) = (self.sequence, self.past);
        match symbol {
            "batch" | "batch_size" => Some((1, 1, 1)),
            "sequence_length" => Some(s),
            "past_sequence_length" => Some(p),
            "total_sequence_length" => Some((s.0 + p.0, s.1 + p.1, s.2 + p.2)),
            "buffer_plus_sequence_length" => self.buffer.map(|l| (l + s.0, l + s.1, l + s.2)),
            _ => None,
        }
    }
}

/// A TensorRT optimisation profile: min / opt / max shape of every dynamic input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeProfile {
    pub min: Vec<(String, Vec<usize>)>,
    pub opt: Vec<(String, Vec<usize>)>,
    pub max: Vec<(String, Vec<usize>)>,
}

impl ShapeProfile {
    /// The profile of a graph's inputs: fixed dimensions as they are, symbolic ones from `ranges`.
    pub fn for_inputs(file: &str, inputs: &[TensorInfo], ranges: &DimRanges) -> Result<Self> {
        let mut profile = ShapeProfile::default();
        for input in inputs {
            if input.dims.iter().all(|d| matches!(d, Dim::Fixed(_))) {
                continue;
            }
            let mut shapes = [Vec::new(), Vec::new(), Vec::new()];
            for dim in &input.dims {
                let (lo, opt, hi) = match dim {
                    Dim::Fixed(n) => (*n, *n, *n),
                    Dim::Symbolic(name) => ranges.of(name).ok_or_else(|| Error::Export {
                        file: file.into(),
                        msg: format!(
                            "input `{}` has dynamic dimension `{name}`, which no TensorRT \
                             profile range covers",
                            input.name
                        ),
                    })?,
                };
                shapes[0].push(lo);
                shapes[1].push(opt);
                shapes[2].push(hi);
            }
            let [lo, opt, hi] = shapes;
            profile.min.push((input.name.clone(), lo));
            profile.opt.push((input.name.clone(), opt));
            profile.max.push((input.name.clone(), hi));
        }
        Ok(profile)
    }

    /// TensorRT's option syntax: `name:1x4x0x64,other:1x1`.
    pub fn format(shapes: &[(String, Vec<usize>)]) -> String {
        shapes
            .iter()
            .map(|(name, dims)| {
                let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
                format!("{name}:{}", dims.join("x"))
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// TensorRT settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TensorRtOptions {
    pub fp16: bool,
    /// Engine and timing cache folder (built engines are reused across runs).
    pub cache_dir: Option<PathBuf>,
    /// Shape ranges the profiles are derived from (per graph, from its inputs).
    pub ranges: Option<DimRanges>,
}

/// Which provider runs the graphs, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct EpConfig {
    pub ep: Ep,
    /// CUDA / TensorRT device ordinal.
    pub device_id: i32,
    /// Fall back to the CPU when the provider cannot be registered (`--ep-fallback`).
    pub fallback: bool,
    pub tensorrt: TensorRtOptions,
    /// Give the session its own intra-op thread pool instead of the process's shared one
    /// ([`runtime`](crate::runtime)); implied by `intra_threads` and `intra_spinning`.
    pub own_thread_pool: bool,
    /// ONNX Runtime's intra-op threads of an own pool (`None`: its default, one per core).
    pub intra_threads: Option<usize>,
    /// Whether idle intra-op threads of an own pool spin before blocking
    /// (`session.intra_op.allow_spinning`; `None`: ONNX Runtime's default, spinning; the shared
    /// pool always spins).
    pub intra_spinning: Option<bool>,
    /// Graph optimisation level (`None`: ONNX Runtime's default, all).
    pub optimization: Option<GraphOptimization>,
    /// Keep the KV cache in host arrays, fed as plain inputs and replaced by copies of the
    /// `present.*` outputs after every run, instead of as ONNX Runtime values through IoBinding.
    /// CPU only (GPU providers always bind); slower, kept to compare the two.
    pub host_kv: bool,
    /// Write ONNX Runtime's profile (per-node times, JSON) to files starting with this prefix;
    /// written when the session is dropped.
    pub profile: Option<PathBuf>,
    /// Save the graph as ONNX Runtime optimised it (its fusions, e.g. the exported RMSNorm as one
    /// `SimplifiedLayerNormalization`) to this file when the session is built.
    pub optimized_model: Option<PathBuf>,
    /// Run a static export's one-row decode step as a CUDA graph (`--cuda-graph`): `Some(true)`
    /// asks for it (refused where it cannot apply), `Some(false)` never, `None` where it applies
    /// (a static export on the CUDA provider). See [`EpConfig::resolve_cuda_graph`].
    pub cuda_graph: Option<bool>,
}

/// ONNX Runtime's graph optimisation levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphOptimization {
    Disable,
    Basic,
    Extended,
    All,
}

impl GraphOptimization {
    pub const ALL: [GraphOptimization; 4] = [
        GraphOptimization::Disable,
        GraphOptimization::Basic,
        GraphOptimization::Extended,
        GraphOptimization::All,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GraphOptimization::Disable => "disable",
            GraphOptimization::Basic => "basic",
            GraphOptimization::Extended => "extended",
            GraphOptimization::All => "all",
        }
    }

    pub(crate) fn level(self) -> ort::session::builder::GraphOptimizationLevel {
        use ort::session::builder::GraphOptimizationLevel as L;
        match self {
            GraphOptimization::Disable => L::Disable,
            GraphOptimization::Basic => L::Level1,
            GraphOptimization::Extended => L::Level2,
            GraphOptimization::All => L::All,
        }
    }
}

impl std::str::FromStr for GraphOptimization {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        GraphOptimization::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown graph optimisation level `{s}`: use disable, basic, extended or all"
                )
            })
    }
}

impl EpConfig {
    /// Rows per run the TensorRT profile allows (its sequence range's maximum), when the
    /// provider is TensorRT; `None` elsewhere (no limit: a CPU or CUDA run takes any chunk).
    pub fn trt_max_rows(&self) -> Option<usize> {
        match self.ep {
            Ep::TensorRt => self.tensorrt.ranges.as_ref().map(|r| r.sequence.2),
            _ => None,
        }
    }

    pub fn new(ep: Ep) -> Self {
        EpConfig {
            ep,
            device_id: 0,
            fallback: false,
            tensorrt: TensorRtOptions::default(),
            own_thread_pool: false,
            intra_threads: None,
            intra_spinning: None,
            optimization: None,
            host_kv: false,
            profile: None,
            optimized_model: None,
            cuda_graph: None,
        }
    }

    pub fn cpu() -> Self {
        EpConfig::new(Ep::Cpu)
    }

    /// Whether a session that runs on `ep_used` keeps its KV cache as ONNX Runtime values
    /// (IoBinding): always on a GPU, on the CPU unless [`host_kv`](Self::host_kv).
    pub fn binds_kv(&self, ep_used: Ep) -> bool {
        ep_used.is_gpu() || !self.host_kv
    }

    /// Whether model.onnx of an export (`static_export`: made with `--static-cache`) runs its
    /// decode step as a CUDA graph: [`cuda_graph`](Self::cuda_graph) resolved, on by default for a
    /// static export on the CUDA provider. Asking for it elsewhere is [`Error::CudaGraph`] naming
    /// why: the graph needs fixed shapes (a dynamic export's cache grows every step) and the CUDA
    /// provider's `enable_cuda_graph` (TensorRT has its own, not wired here; the CPU has none).
    pub fn resolve_cuda_graph(&self, file: &str, static_export: bool) -> Result<bool> {
        let refuse = |reason: String| {
            Err(Error::CudaGraph {
                file: file.into(),
                reason,
            })
        };
        match self.cuda_graph {
            Some(false) => Ok(false),
            None => Ok(self.ep == Ep::Cuda && static_export),
            Some(true) if self.ep != Ep::Cuda => refuse(format!(
                "CUDA graphs need the CUDA execution provider (--ep cuda), not {}",
                self.ep
            )),
            Some(true) if !static_export => refuse(
                "CUDA graphs need fixed shapes and addresses, and this is a dynamic export (its cache grows every step): export with `m2r2 export --static-cache L`"
                    .into(),
            ),
            Some(true) => Ok(true),
        }
    }

    /// The providers to register for a graph with these inputs, most preferred first, each failing
    /// loudly (empty for the CPU, which ONNX Runtime always has). `cuda_graph`: the CUDA
    /// provider's `enable_cuda_graph` (every run must then say its `gpu_graph_id`).
    pub(crate) fn dispatches(
        &self,
        file: &str,
        inputs: &[TensorInfo],
        cuda_graph: bool,
    ) -> Result<Vec<ExecutionProviderDispatch>> {
        let cuda = || {
            // f32 stays f32 (TF32 matmuls would move logits by ~1e-3, past the equivalence tolerance).
            let cuda = ep::CUDA::default()
                .with_device_id(self.device_id)
                .with_tf32(false);
            let cuda = if cuda_graph {
                cuda.with_cuda_graph(true)
            } else {
                cuda
            };
            cuda.build().error_on_failure()
        };
        Ok(match self.ep {
            Ep::Cpu => Vec::new(),
            Ep::Cuda => vec![cuda()],
            Ep::TensorRt => {
                let options = &self.tensorrt;
                let mut trt = ep::TensorRT::default()
                    .with_device_id(self.device_id)
                    .with_fp16(options.fp16);
                if let Some(dir) = &options.cache_dir {
                    let dir = dir.display().to_string();
                    trt = trt
                        .with_engine_cache(true)
                        .with_engine_cache_path(&dir)
                        .with_timing_cache(true)
                        .with_timing_cache_path(&dir);
                }
                if let Some(ranges) = &options.ranges {
                    let profile = ShapeProfile::for_inputs(file, inputs, ranges)?;
                    if !profile.min.is_empty() {
                        trt = trt
                            .with_profile_min_shapes(ShapeProfile::format(&profile.min))
                            .with_profile_opt_shapes(ShapeProfile::format(&profile.opt))
                            .with_profile_max_shapes(ShapeProfile::format(&profile.max));
                    }
                }
                // Nodes TensorRT does not take run on CUDA (never silently on the CPU).
                vec![trt.build().error_on_failure(), cuda()]
            }
        })
    }
}

impl Default for EpConfig {
    fn default() -> Self {
        EpConfig::cpu()
    }
}

/// Whether the loaded ONNX Runtime was built with this provider (it may still fail to register,
/// e.g. when the CUDA libraries are missing).
pub fn compiled_in(ep: Ep) -> Result<bool> {
    crate::runtime::init()?;
    let available = match ep {
        Ep::Cpu => return Ok(true),
        Ep::Cuda => ep::CUDA::is_available(),
        Ep::TensorRt => ep::TensorRT::is_available(),
    };
    available.map_err(|e| Error::Runtime(format!("cannot ask about the {ep} provider: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dims: &[Dim]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: crate::tensor_info::DType::F32,
            dims: dims.to_vec(),
        }
    }

    #[test]
    fn names_round_trip() {
        for ep in Ep::ALL {
            assert_eq!(ep.name().parse::<Ep>().unwrap(), ep);
        }
        assert!(
            "gpu"
                .parse::<Ep>()
                .unwrap_err()
                .contains("cpu, cuda or tensorrt")
        );
    }

    #[test]
    fn cuda_graph_is_on_by_default_only_for_static_exports_on_cuda() {
        let with = |ep: Ep, choice: Option<bool>| EpConfig {
            cuda_graph: choice,
            ..EpConfig::new(ep)
        };
        for ep in Ep::ALL {
            assert_eq!(
                with(ep, None).resolve_cuda_graph("m.onnx", true).unwrap(),
                ep == Ep::Cuda
            );
            assert!(!with(ep, None).resolve_cuda_graph("m.onnx", false).unwrap());
            assert!(
                !with(ep, Some(false))
                    .resolve_cuda_graph("m.onnx", true)
                    .unwrap()
            );
        }
        assert!(
            with(Ep::Cuda, Some(true))
                .resolve_cuda_graph("m.onnx", true)
                .unwrap()
        );
        let err = with(Ep::Cpu, Some(true))
            .resolve_cuda_graph("m.onnx", true)
            .unwrap_err();
        assert!(err.to_string().contains("--ep cuda), not cpu"), "{err}");
        let err = with(Ep::Cuda, Some(true))
            .resolve_cuda_graph("m.onnx", false)
            .unwrap_err();
        assert!(err.to_string().contains("--static-cache"), "{err}");
    }

    #[test]
    fn profile_follows_the_model_config() {
        // draft_len 3 -> rows 1..=4; context 64 -> past 0..=60
        let ranges = DimRanges::from_model(3, 64);
        let sym = |s: &str| Dim::Symbolic(s.into());
        let inputs = [
            info("input_ids", &[sym("batch"), sym("sequence_length")]),
            info(
                "past_key_values.0.key",
                &[
                    sym("batch"),
                    Dim::Fixed(2),
                    sym("past_sequence_length"),
                    Dim::Fixed(8),
                ],
            ),
            info(
                "attention_mask",
                &[sym("batch"), sym("total_sequence_length")],
            ),
            info("fixed", &[Dim::Fixed(3)]),
        ];
        let p = ShapeProfile::for_inputs("m.onnx", &inputs, &ranges).unwrap();
        assert_eq!(
            ShapeProfile::format(&p.min),
            "input_ids:1x1,past_key_values.0.key:1x2x0x8,attention_mask:1x1"
        );
        assert_eq!(
            ShapeProfile::format(&p.max),
            "input_ids:1x4,past_key_values.0.key:1x2x60x8,attention_mask:1x64"
        );
        let bad = [info("x", &[sym("width")])];
        let err = ShapeProfile::for_inputs("m.onnx", &bad, &ranges).unwrap_err();
        assert!(err.to_string().contains("`width`"), "{err}");
        // a static draft's fast mask spans the buffer of L = 24 and the rows
        let mask = [info(
            "fast_attn_mask",
            &[
                Dim::Fixed(1),
                Dim::Fixed(1),
                sym("sequence_length"),
                sym("buffer_plus_sequence_length"),
            ],
        )];
        let err = ShapeProfile::for_inputs("d.onnx", &mask, &ranges).unwrap_err();
        assert!(
            err.to_string().contains("buffer_plus_sequence_length"),
            "{err}"
        );
        let p = ShapeProfile::for_inputs("d.onnx", &mask, &ranges.with_buffer(24)).unwrap();
        assert_eq!(ShapeProfile::format(&p.min), "fast_attn_mask:1x1x1x25");
        assert_eq!(ShapeProfile::format(&p.max), "fast_attn_mask:1x1x4x28");
    }
}
