//! Base-model weights as f32 ndarrays, loaded by name from any [`TensorSource`] and checked against the
//! config once, at load. Layer math after this point is infallible.

use crate::base::config::ModelConfig;
use crate::base::weight_names::{AttnProj, MlpProj, WeightId};
use crate::error::{Error, Result};
use ndarray::{Array1, Array2};
use std::collections::HashMap;

/// A dense tensor read from a checkpoint, converted to f32 (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Anything that can hand out checkpoint tensors by their HF name (safetensors folders, GGUF files,
/// the built-in generators, tests).
pub trait TensorSource {
    /// The file a tensor lives in (or would live in), for error messages.
    fn file_of(&self, name: &str) -> String;
    /// The tensor called `name` (HF naming) as f32, or `None` if the checkpoint has no such tensor.
    fn read(&self, name: &str) -> Result<Option<RawTensor>>;
}

/// Tensors held in memory, keyed by HF name.
#[derive(Default)]
pub struct MemorySource {
    pub label: String,
    pub tensors: HashMap<String, RawTensor>,
}

impl TensorSource for MemorySource {
    fn file_of(&self, _name: &str) -> String {
        self.label.clone()
    }
    fn read(&self, name: &str) -> Result<Option<RawTensor>> {
        Ok(self.tensors.get(name).cloned())
    }
}

/// `y = x W^T + b` with PyTorch's `nn.Linear` layout.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`
    pub w: Array2<f32>,
    /// `[out]`
    pub b: Option<Array1<f32>>,
}

#[derive(Clone, Debug)]
pub struct Attention {
    /// `[H*Dh, D]`
    pub q: Linear,
    /// `[Hkv*Dh, D]`
    pub k: Linear,
    /// `[Hkv*Dh, D]`
    pub v: Linear,
    /// `[D, H*Dh]`
    pub o: Linear,
}

/// SwiGLU MLP: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[I, D]`
    pub gate: Linear,
    /// `[I, D]`
    pub up: Linear,
    /// `[D, I]`
    pub down: Linear,
}

/// Mixtral sparse MoE block.
#[derive(Clone, Debug)]
pub struct Moe {
    /// `[E, D]`
    pub router: Array2<f32>,
    /// E SwiGLU experts
    pub experts: Vec<Mlp>,
    /// k
    pub top_k: usize,
}

#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer: boxing buys nothing
pub enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Clone, Debug)]
pub struct Layer {
    /// `[D]`
    pub attn_norm: Array1<f32>,
    pub attn: Attention,
    /// `[D]`
    pub mlp_norm: Array1<f32>,
    pub ffn: FeedForward,
}

#[derive(Clone, Debug)]
pub struct Weights {
    /// `[V, D]`
    pub embed: Array2<f32>,
    pub layers: Vec<Layer>,
    /// `[D]`
    pub final_norm: Array1<f32>,
    /// `[V, D]`; `None` when tied to `embed`.
    pub lm_head: Option<Array2<f32>>,
}

impl Weights {
    /// `[V, D]` the output projection (the embedding when tied).
    pub fn lm_head(&self) -> &Array2<f32> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Read every tensor the config calls for from `src`, checking presence and shape.
    pub fn load(config: &ModelConfig, src: &dyn TensorSource) -> Result<Self> {
        let mut loader = Loader { config, src };
        // Grown layer by layer, not preallocated: the layer count comes from the file, and a
        // count its tensors do not back fails at the first missing tensor, before anything is
        // allocated for it.
        let mut layers = Vec::new();
        for l in 0..config.num_hidden_layers {
            let attn = Attention {
                q: loader.attn(l, AttnProj::Q, config.qkv_bias)?,
                k: loader.attn(l, AttnProj::K, config.qkv_bias)?,
                v: loader.attn(l, AttnProj::V, config.qkv_bias)?,
                o: loader.attn(l, AttnProj::O, config.o_bias)?,
            };
            let ffn = match &config.moe {
                None => FeedForward::Dense(Mlp {
                    gate: loader.mlp(l, MlpProj::Gate)?,
                    up: loader.mlp(l, MlpProj::Up)?,
                    down: loader.mlp(l, MlpProj::Down)?,
                }),
                Some(moe) => {
                    let expert = |e: usize, p: MlpProj, ld: &mut Loader| -> Result<Linear> {
                        Ok(Linear {
                            w: ld.matrix(WeightId::Expert(l, e, p))?,
                            b: None,
                        })
                    };
                    let mut experts = Vec::new();
                    for e in 0..moe.num_local_experts {
                        experts.push(Mlp {
                            gate: expert(e, MlpProj::Gate, &mut loader)?,
                            up: expert(e, MlpProj::Up, &mut loader)?,
                            down: expert(e, MlpProj::Down, &mut loader)?,
                        });
                    }
                    FeedForward::Moe(Moe {
                        router: loader.matrix(WeightId::Router(l))?,
                        experts,
                        top_k: moe.num_experts_per_tok,
                    })
                }
            };
            layers.push(Layer {
                attn_norm: loader.vector(WeightId::AttnNorm(l))?,
                attn,
                mlp_norm: loader.vector(WeightId::MlpNorm(l))?,
                ffn,
            });
        }
        Ok(Weights {
            embed: loader.matrix(WeightId::Embed)?,
            layers,
            final_norm: loader.vector(WeightId::FinalNorm)?,
            lm_head: if config.tie_word_embeddings {
                None
            } else {
                Some(loader.matrix(WeightId::LmHead)?)
            },
        })
    }

    /// Every tensor under its HF name, in checkpoint order (for saving and for the export table).
    pub fn named_tensors(
        &self,
        config: &ModelConfig,
    ) -> Vec<(WeightId, ndarray::ArrayViewD<'_, f32>)> {
        WeightId::all(config)
            .into_iter()
            .map(|id| {
                (
                    id,
                    self.get(id)
                        .expect("WeightId::all only lists present tensors"),
                )
            })
            .collect()
    }

    /// The tensor `id`, or `None` if this model has no such tensor.
    pub fn get(&self, id: WeightId) -> Option<ndarray::ArrayViewD<'_, f32>> {
        let attn_lin = |l: usize, p: AttnProj| {
            let a = &self.layers[l].attn;
            match p {
                AttnProj::Q => &a.q,
                AttnProj::K => &a.k,
                AttnProj::V => &a.v,
                AttnProj::O => &a.o,
            }
        };
        let layer = |l: usize| self.layers.get(l);
        Some(match id {
            WeightId::Embed => self.embed.view().into_dyn(),
            WeightId::FinalNorm => self.final_norm.view().into_dyn(),
            WeightId::LmHead => self.lm_head.as_ref()?.view().into_dyn(),
            WeightId::AttnNorm(l) => layer(l)?.attn_norm.view().into_dyn(),
            WeightId::MlpNorm(l) => layer(l)?.mlp_norm.view().into_dyn(),
            WeightId::Attn(l, p) => {
                layer(l)?;
                attn_lin(l, p).w.view().into_dyn()
            }
            WeightId::AttnBias(l, p) => {
                layer(l)?;
                attn_lin(l, p).b.as_ref()?.view().into_dyn()
            }
            WeightId::Mlp(l, p) => match &layer(l)?.ffn {
                FeedForward::Dense(m) => mlp_lin(m, p).w.view().into_dyn(),
                FeedForward::Moe(_) => return None,
            },
            WeightId::MlpBias(l, p) => match &layer(l)?.ffn {
                FeedForward::Dense(m) => mlp_lin(m, p).b.as_ref()?.view().into_dyn(),
                FeedForward::Moe(_) => return None,
            },
            WeightId::Router(l) => match &layer(l)?.ffn {
                FeedForward::Moe(m) => m.router.view().into_dyn(),
                FeedForward::Dense(_) => return None,
            },
            WeightId::Expert(l, e, p) => match &layer(l)?.ffn {
                FeedForward::Moe(m) => mlp_lin(m.experts.get(e)?, p).w.view().into_dyn(),
                FeedForward::Dense(_) => return None,
            },
        })
    }
}

fn mlp_lin(m: &Mlp, p: MlpProj) -> &Linear {
    match p {
        MlpProj::Gate => &m.gate,
        MlpProj::Up => &m.up,
        MlpProj::Down => &m.down,
    }
}

struct Loader<'a> {
    config: &'a ModelConfig,
    src: &'a dyn TensorSource,
}

impl Loader<'_> {
    fn raw(&mut self, id: WeightId) -> Result<RawTensor> {
        let name = id.hf_name();
        let expected = id.shape(self.config);
        let t = self.src.read(&name)?.ok_or_else(|| Error::MissingTensor {
            file: self.src.file_of(&name),
            tensor: name.clone(),
        })?;
        if t.shape != expected {
            return Err(Error::ShapeMismatch {
                file: self.src.file_of(&name),
                tensor: name,
                expected,
                actual: t.shape,
            });
        }
        // a NaN or infinity would turn every logit NaN, silently
        if let Some(v) = t.data.iter().find(|v| !v.is_finite()) {
            return Err(Error::format(
                self.src.file_of(&name),
                format!("tensor `{name}` holds a non-finite value ({v})"),
            ));
        }
        Ok(t)
    }

    fn matrix(&mut self, id: WeightId) -> Result<Array2<f32>> {
        let t = self.raw(id)?;
        // Cache-line aligned for the matmul kernels' 16-lane loads (checked shape: rows * cols).
        Ok(crate::base::matmul::cache_aligned(
            t.shape[0], t.shape[1], t.data,
        ))
    }

    fn vector(&mut self, id: WeightId) -> Result<Array1<f32>> {
        Ok(Array1::from_vec(self.raw(id)?.data))
    }

    fn attn(&mut self, l: usize, p: AttnProj, bias: bool) -> Result<Linear> {
        Ok(Linear {
            w: self.matrix(WeightId::Attn(l, p))?,
            b: if bias {
                Some(self.vector(WeightId::AttnBias(l, p))?)
            } else {
                None
            },
        })
    }

    fn mlp(&mut self, l: usize, p: MlpProj) -> Result<Linear> {
        Ok(Linear {
            w: self.matrix(WeightId::Mlp(l, p))?,
            b: if self.config.mlp_bias {
                Some(self.vector(WeightId::MlpBias(l, p))?)
            } else {
                None
            },
        })
    }
}
