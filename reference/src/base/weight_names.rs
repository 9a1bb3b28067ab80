//! The one table of weight names: every base-model tensor, its HF safetensors name, its GGUF name and
//! its shape from the config. Loaders, savers and the ONNX exporter all go through it, so a name is
//! spelled in exactly one place.
//!
//! ONNX initializers (`m2r2::weight_names::OnnxInitializer`, which adds the M2R2 tensors) carry the safetensors names unchanged, in the safetensors
//! layout (`[out, in]`; the graphs transpose with a `Transpose` node that runtimes fold at load):
//!
//! | what                  | safetensors / reference                         | ONNX initializer |
//! |-----------------------|-------------------------------------------------|------------------|
//! | base weight           | [`WeightId::hf_name`] (`model.layers.3.self_attn.q_proj.weight`) | [`WeightId::onnx_name`], the same |

use crate::base::config::ModelConfig;
use crate::error::{Error, Result};
use std::cmp::Ordering;

/// One base-model tensor, addressed by its place in the module tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightId {
    /// `[V, D]`
    Embed,
    /// `[D]`
    FinalNorm,
    /// `[V, D]`; absent when embeddings are tied.
    LmHead,
    /// `[D]` input_layernorm of layer l
    AttnNorm(usize),
    /// `[D]` post_attention_layernorm of layer l
    MlpNorm(usize),
    /// Attention projection weight of layer l.
    Attn(usize, AttnProj),
    /// Attention projection bias of layer l.
    AttnBias(usize, AttnProj),
    /// Dense MLP projection weight of layer l.
    Mlp(usize, MlpProj),
    /// Dense MLP projection bias of layer l.
    MlpBias(usize, MlpProj),
    /// `[E, D]` router of MoE layer l.
    Router(usize),
    /// Expert `e` of MoE layer l (Mixtral names: w1 = gate, w3 = up, w2 = down).
    Expert(usize, usize, MlpProj),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnProj {
    Q,
    K,
    V,
    O,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlpProj {
    Gate,
    Up,
    Down,
}

impl AttnProj {
    pub const ALL: [AttnProj; 4] = [AttnProj::Q, AttnProj::K, AttnProj::V, AttnProj::O];

    /// The HF / PEFT module name (`q_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            AttnProj::Q => "q_proj",
            AttnProj::K => "k_proj",
            AttnProj::V => "v_proj",
            AttnProj::O => "o_proj",
        }
    }

    fn gguf(self) -> &'static str {
        match self {
            AttnProj::Q => "attn_q",
            AttnProj::K => "attn_k",
            AttnProj::V => "attn_v",
            AttnProj::O => "attn_output",
        }
    }
}

impl MlpProj {
    pub const ALL: [MlpProj; 3] = [MlpProj::Gate, MlpProj::Up, MlpProj::Down];

    /// The HF / PEFT module name (`gate_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            MlpProj::Gate => "gate_proj",
            MlpProj::Up => "up_proj",
            MlpProj::Down => "down_proj",
        }
    }

    /// Mixtral's expert names.
    fn mixtral(self) -> &'static str {
        match self {
            MlpProj::Gate => "w1",
            MlpProj::Up => "w3",
            MlpProj::Down => "w2",
        }
    }

    fn gguf(self) -> &'static str {
        match self {
            MlpProj::Gate => "ffn_gate",
            MlpProj::Up => "ffn_up",
            MlpProj::Down => "ffn_down",
        }
    }
}

impl WeightId {
    /// Name in HF safetensors checkpoints.
    pub fn hf_name(self) -> String {
        match self {
            WeightId::Embed => "model.embed_tokens.weight".into(),
            WeightId::FinalNorm => "model.norm.weight".into(),
            WeightId::LmHead => "lm_head.weight".into(),
            WeightId::AttnNorm(l) => format!("model.layers.{l}.input_layernorm.weight"),
            WeightId::MlpNorm(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            WeightId::Attn(l, p) => format!("model.layers.{l}.self_attn.{}.weight", p.module()),
            WeightId::AttnBias(l, p) => format!("model.layers.{l}.self_attn.{}.bias", p.module()),
            WeightId::Mlp(l, p) => format!("model.layers.{l}.mlp.{}.weight", p.module()),
            WeightId::MlpBias(l, p) => format!("model.layers.{l}.mlp.{}.bias", p.module()),
            WeightId::Router(l) => format!("model.layers.{l}.{MOE_BLOCK}.gate.weight"),
            WeightId::Expert(l, e, p) => {
                format!(
                    "model.layers.{l}.{MOE_BLOCK}.experts.{e}.{}.weight",
                    p.mixtral()
                )
            }
        }
    }

    /// The layer `name` belongs to when it is a tensor of transformers 4's Mixtral MoE block
    /// (`model.layers.{l}.block_sparse_moe.…`: the router and one tensor per expert matrix).
    pub fn per_expert_layer(name: &str) -> Option<usize> {
        let (l, rest) = layer_of(name)?;
        rest.strip_prefix(MOE_BLOCK)?.starts_with('.').then_some(l)
    }

    /// Name of the initializer holding this tensor in exported ONNX graphs (the safetensors name,
    /// same layout).
    pub fn onnx_name(self) -> String {
        self.hf_name()
    }

    /// Name in llama.cpp GGUF files (dense llama architecture), `None` where GGUF has no such tensor.
    pub fn gguf_name(self) -> Option<String> {
        Some(match self {
            WeightId::Embed => "token_embd.weight".into(),
            WeightId::FinalNorm => "output_norm.weight".into(),
            WeightId::LmHead => "output.weight".into(),
            WeightId::AttnNorm(l) => format!("blk.{l}.attn_norm.weight"),
            WeightId::MlpNorm(l) => format!("blk.{l}.ffn_norm.weight"),
            WeightId::Attn(l, p) => format!("blk.{l}.{}.weight", p.gguf()),
            WeightId::AttnBias(l, p) => format!("blk.{l}.{}.bias", p.gguf()),
            WeightId::Mlp(l, p) => format!("blk.{l}.{}.weight", p.gguf()),
            WeightId::MlpBias(l, p) => format!("blk.{l}.{}.bias", p.gguf()),
            WeightId::Router(_) | WeightId::Expert(..) => return None,
        })
    }

    /// Shape from the config (PyTorch `nn.Linear` layout: `[out, in]`).
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let proj_out = |p: AttnProj| match p {
            AttnProj::Q => c.q_dim(),
            AttnProj::K | AttnProj::V => c.kv_dim(),
            AttnProj::O => d,
        };
        match self {
            WeightId::Embed | WeightId::LmHead => vec![c.vocab_size, d],
            WeightId::FinalNorm | WeightId::AttnNorm(_) | WeightId::MlpNorm(_) => vec![d],
            WeightId::Attn(_, AttnProj::O) => vec![d, c.q_dim()],
            WeightId::Attn(_, p) => vec![proj_out(p), d],
            WeightId::AttnBias(_, p) => vec![proj_out(p)],
            WeightId::Mlp(_, MlpProj::Down) | WeightId::Expert(_, _, MlpProj::Down) => vec![d, i],
            WeightId::Mlp(_, _) | WeightId::Expert(_, _, _) => vec![i, d],
            WeightId::MlpBias(_, MlpProj::Down) => vec![d],
            WeightId::MlpBias(_, _) => vec![i],
            WeightId::Router(_) => vec![c.moe.as_ref().map_or(0, |m| m.num_local_experts), d],
        }
    }

    /// Every tensor the config calls for, in checkpoint order.
    pub fn all(c: &ModelConfig) -> Vec<WeightId> {
        WeightId::iter(c).collect()
    }

    /// [`WeightId::all`] one at a time, nothing listed ahead (a file's config may claim 2^40
    /// layers or experts).
    pub fn iter(c: &ModelConfig) -> impl Iterator<Item = WeightId> + '_ {
        let layer = move |l: usize| {
            let attn = AttnProj::ALL.into_iter().flat_map(move |p| {
                let bias = if p == AttnProj::O {
                    c.o_bias
                } else {
                    c.qkv_bias
                };
                std::iter::once(WeightId::Attn(l, p))
                    .chain(bias.then_some(WeightId::AttnBias(l, p)))
            });
            let dense = c.moe.is_none().then(|| {
                MlpProj::ALL.into_iter().flat_map(move |p| {
                    std::iter::once(WeightId::Mlp(l, p))
                        .chain(c.mlp_bias.then_some(WeightId::MlpBias(l, p)))
                })
            });
            let experts = c.moe.as_ref().map(|moe| {
                std::iter::once(WeightId::Router(l)).chain(
                    (0..moe.num_local_experts)
                        .flat_map(move |e| MlpProj::ALL.map(|p| WeightId::Expert(l, e, p))),
                )
            });
            std::iter::once(WeightId::AttnNorm(l))
                .chain(attn)
                .chain(std::iter::once(WeightId::MlpNorm(l)))
                .chain(dense.into_iter().flatten())
                .chain(experts.into_iter().flatten())
        };
        std::iter::once(WeightId::Embed)
            .chain((0..c.num_hidden_layers).flat_map(layer))
            .chain(std::iter::once(WeightId::FinalNorm))
            .chain((!c.tie_word_embeddings).then_some(WeightId::LmHead))
    }

    /// `WeightId::all(c).len()` without listing them, `None` when it overflows: the loaders
    /// compare it with the tensors a file has before listing anything (a config's counts come
    /// from a file, and a 1 KB file may claim 2^40 layers).
    pub fn count(c: &ModelConfig) -> Option<usize> {
        let bias = |b: bool| usize::from(b);
        let attn = 4 + 3 * bias(c.qkv_bias) + bias(c.o_bias);
        let ffn = match &c.moe {
            None => 3 * (1 + bias(c.mlp_bias)),
            Some(moe) => moe.num_local_experts.checked_mul(3)?.checked_add(1)?,
        };
        let per_layer = attn.checked_add(ffn)?.checked_add(2)?;
        per_layer
            .checked_mul(c.num_hidden_layers)?
            .checked_add(2 + bias(!c.tie_word_embeddings))
    }
}

/// Transformers 4's name of Mixtral's MoE block, under which [`WeightId::Router`] and
/// [`WeightId::Expert`] are named.
const MOE_BLOCK: &str = "block_sparse_moe";

/// `(l, rest)` when `name` is `model.layers.{l}.{rest}`, with `l` spelled as the names above
/// spell it (no sign, no leading zero).
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let (l, rest) = name.strip_prefix("model.layers.")?.split_once('.')?;
    let n: usize = l.parse().ok()?;
    (n.to_string() == l).then_some((n, rest))
}

/// A tensor of a Mixtral MoE layer in transformers 5's fused layout (`MixtralExperts`): the
/// router under another name, and each expert matrix stacked over the experts. They hold exactly
/// the [`WeightId::Router`] and [`WeightId::Expert`] tensors of the layer, and are read as those
/// (`io::fused_experts`). The expert tensors are `nn.Parameter`s, so their names have no `.weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FusedMoe {
    /// `[E, D]` `model.layers.{l}.mlp.gate.weight`, the router.
    Router,
    /// `[E, 2I, D]` `model.layers.{l}.mlp.experts.gate_up_proj`: rows `0..I` of expert `e` are
    /// its gate (w1), rows `I..2I` its up projection (w3).
    GateUp,
    /// `[E, D, I]` `model.layers.{l}.mlp.experts.down_proj`: the down projection (w2) of each
    /// expert.
    Down,
}

impl FusedMoe {
    pub const ALL: [FusedMoe; 3] = [FusedMoe::Router, FusedMoe::GateUp, FusedMoe::Down];

    /// The name's part after `model.layers.{l}.mlp.`.
    fn module(self) -> &'static str {
        match self {
            FusedMoe::Router => "gate.weight",
            FusedMoe::GateUp => "experts.gate_up_proj",
            FusedMoe::Down => "experts.down_proj",
        }
    }

    /// Name in HF safetensors checkpoints.
    pub fn hf_name(self, l: usize) -> String {
        format!("model.layers.{l}.mlp.{}", self.module())
    }

    /// `(l, tensor)` when `name` is the tensor's [`FusedMoe::hf_name`] in layer `l`.
    pub fn parse(name: &str) -> Option<(usize, FusedMoe)> {
        let (l, rest) = layer_of(name)?;
        let rest = rest.strip_prefix("mlp.")?;
        let t = FusedMoe::ALL.into_iter().find(|t| t.module() == rest)?;
        Some((l, t))
    }

    /// Shape from the config (`[E, 2I, D]`, `[E, D, I]`; the router's as [`WeightId::Router`]).
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let experts = c.moe.as_ref().map_or(0, |m| m.num_local_experts);
        let (d, i) = (c.hidden_size, c.intermediate_size);
        match self {
            FusedMoe::Router => WeightId::Router(0).shape(c),
            FusedMoe::GateUp => vec![experts, i.saturating_mul(2), d],
            FusedMoe::Down => vec![experts, d, i],
        }
    }
}

/// A linear map of a decoder layer (the seven projections an adapter may attach to,
/// docs/m2r2/accelerator.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Attn(AttnProj),
    Mlp(MlpProj),
}

impl Target {
    /// The seven targets in canonical order (q, k, v, o, gate, up, down): the order adapters are
    /// drawn, saved and listed in.
    pub const ALL: [Target; 7] = [
        Target::Attn(AttnProj::Q),
        Target::Attn(AttnProj::K),
        Target::Attn(AttnProj::V),
        Target::Attn(AttnProj::O),
        Target::Mlp(MlpProj::Gate),
        Target::Mlp(MlpProj::Up),
        Target::Mlp(MlpProj::Down),
    ];

    /// The HF / PEFT module name (`q_proj`, ..., `down_proj`).
    pub fn module(self) -> &'static str {
        match self {
            Target::Attn(p) => p.module(),
            Target::Mlp(p) => p.module(),
        }
    }

    /// The target called `name` (a PEFT `target_modules` entry), if it is one of the seven.
    pub fn from_module(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.module() == name)
    }

    /// Position in [`Target::ALL`].
    pub fn index(self) -> usize {
        Target::ALL
            .iter()
            .position(|&t| t == self)
            .expect("ALL lists every target")
    }

    /// True for gate/up/down (absent from MoE layers, whose feed-forward is a sparse MoE block).
    pub fn is_mlp(self) -> bool {
        matches!(self, Target::Mlp(_))
    }

    /// The parent module in the HF module tree: `self_attn` or `mlp`.
    pub fn parent(self) -> &'static str {
        match self {
            Target::Attn(_) => "self_attn",
            Target::Mlp(_) => "mlp",
        }
    }

    /// `(out, in)` of the base weight this target adapts (PyTorch `nn.Linear` layout `[out, in]`).
    pub fn shape(self, model: &ModelConfig) -> (usize, usize) {
        // Layer 0 stands for every layer: projection shapes do not depend on the layer.
        let id = match self {
            Target::Attn(p) => WeightId::Attn(0, p),
            Target::Mlp(p) => WeightId::Mlp(0, p),
        };
        let s = id.shape(model);
        (s[0], s[1])
    }

    /// The module names of all seven targets, comma separated (for error messages).
    pub fn all_modules() -> String {
        Target::ALL.map(Target::module).join(", ")
    }
}

impl PartialOrd for Target {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Canonical order (that of [`Target::ALL`]), so maps keyed by target iterate q, k, v, o, gate,
/// up, down.
impl Ord for Target {
    fn cmp(&self, other: &Self) -> Ordering {
        self.index().cmp(&other.index())
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.module())
    }
}

/// Refuse a config whose counts call for more tensors than `file` has (`present`), before
/// anything is sized by them: the layer and expert counts come from the file's config, and are
/// checked against the weights actually there, not trusted. The error names the first tensor the
/// config calls for that `has` does not find (looked up one at a time, so at most `present + 1`
/// lookups), as a missing tensor is the usual reason.
///
/// # Errors
/// [`Error::Config`] naming the file, the counts and the first missing tensor.
pub fn check_tensor_count(
    c: &ModelConfig,
    present: usize,
    file: &str,
    has: &dyn Fn(WeightId) -> Option<String>,
) -> Result<()> {
    let needed = WeightId::count(c);
    if needed.is_some_and(|n| n <= present) {
        return Ok(());
    }
    let experts = c.moe.as_ref().map_or(String::new(), |m| {
        format!(" of {} experts each", m.num_local_experts)
    });
    // `has` gives the name of a missing tensor (`Some`), or `None` when it is there.
    let missing = WeightId::iter(c)
        .take(present.saturating_add(1))
        .find_map(|id| Some((id, has(id)?)));
    if let Some((WeightId::LmHead, name)) = &missing {
        // the head is its own tensor only because the config unties it
        return Err(Error::config(
            file,
            format!(
                "tensor `{name}` is missing: tie_word_embeddings is false, so the output head is \
                 its own tensor (a checkpoint saved without it ties the head to the embedding: \
                 tie_word_embeddings true)"
            ),
        ));
    }
    Err(Error::config(
        file,
        format!(
            "{}num_hidden_layers = {}{experts} calls for {} tensors, and the weights have {present}",
            missing.map_or(String::new(), |(_, m)| format!("tensor `{m}` is missing: ")),
            c.num_hidden_layers,
            needed.map_or("more than 2^64".to_string(), |n| n.to_string()),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;

    #[test]
    fn count_is_the_length_of_all() {
        for name in builtin::BUILTIN_NAMES {
            let mut c = builtin::builtin(name).unwrap().config;
            for (qkv, o, mlp, tied) in [(false, false, false, true), (true, true, true, false)] {
                (c.qkv_bias, c.o_bias, c.mlp_bias, c.tie_word_embeddings) = (qkv, o, mlp, tied);
                assert_eq!(WeightId::count(&c), Some(WeightId::all(&c).len()), "{name}");
            }
        }
    }

    /// Each Mixtral MoE name is told to be of one layout and layer; other names (a `.weight`
    /// after a fused expert tensor, a layer spelled `01`, a dense MLP) are of neither.
    #[test]
    fn moe_names_tell_their_layout_and_layer() {
        for l in [0, 7, 31] {
            for t in FusedMoe::ALL {
                assert_eq!(FusedMoe::parse(&t.hf_name(l)), Some((l, t)));
            }
            for id in [WeightId::Router(l), WeightId::Expert(l, 3, MlpProj::Up)] {
                assert_eq!(WeightId::per_expert_layer(&id.hf_name()), Some(l));
                assert_eq!(FusedMoe::parse(&id.hf_name()), None);
            }
        }
        for other in [
            "model.layers.0.mlp.experts.gate_up_proj.weight",
            "model.layers.01.mlp.experts.down_proj",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.block_sparse_moe_x.gate.weight",
            "lm_head.weight",
        ] {
            assert_eq!(FusedMoe::parse(other), None, "{other}");
            assert_eq!(WeightId::per_expert_layer(other), None, "{other}");
        }
    }

    #[test]
    fn counts_beyond_the_file_are_refused_without_listing() {
        let mut c = builtin::builtin("tiny").unwrap().config;
        let n = WeightId::count(&c).unwrap();
        let all_there = |_: WeightId| None;
        check_tensor_count(&c, n, "m.safetensors", &all_there).unwrap();
        c.num_hidden_layers = 1 << 40;
        // a file with the first two layers: the first tensor of layer 2 is named
        let missing_from_layer_2 = |id: WeightId| {
            let name = id.hf_name();
            let early = ["model.layers.0.", "model.layers.1."];
            let early = early.iter().any(|p| name.starts_with(p));
            (name.starts_with("model.layers.") && !early).then_some(name)
        };
        let err = check_tensor_count(&c, n, "m.safetensors", &missing_from_layer_2)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("m.safetensors")
                && err.contains("tensor `model.layers.2.input_layernorm.weight` is missing")
                && err.contains("num_hidden_layers = 1099511627776"),
            "{err}"
        );
        c.num_hidden_layers = usize::MAX;
        let err = check_tensor_count(&c, n, "m.safetensors", &all_there)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than 2^64"), "{err}");
    }
}
