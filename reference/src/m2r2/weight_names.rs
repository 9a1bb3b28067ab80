//! Names of the M2R2 tensors next to the base model's ([`crate::base::weight_names`]): the halves of
//! the accelerator LoRA pairs (PEFT names) and the ARLA tensors, and the initializer names of the
//! exported ONNX graphs, which carry every tensor's safetensors name unchanged:
//!
//! | what                  | safetensors / reference                         | ONNX initializer |
//! |-----------------------|-------------------------------------------------|------------------|
//! | base weight           | [`WeightId::hf_name`] (`model.layers.3.self_attn.q_proj.weight`) | [`WeightId::onnx_name`], the same |
//! | accelerator LoRA half | [`peft_tensor_name`] (`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`) | the same |
//! | ARLA tensor           | [`ARLA_TENSORS`] (`arla.proj.weight`)  | the same |

use crate::base::weight_names::{Target, WeightId};
use crate::io::peft::{LoraPart, peft_tensor_name};
use crate::m2r2::arla::ARLA_TENSORS;

/// One initializer of the exported ONNX graphs: a base weight, half of an accelerator LoRA pair, or
/// an ARLA tensor (see the table in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnnxInitializer {
    Base(WeightId),
    Lora {
        layer: usize,
        target: Target,
        part: LoraPart,
    },
    /// Index into [`ARLA_TENSORS`].
    Arla(usize),
}

impl OnnxInitializer {
    /// The initializer name: always the name the tensor has in its safetensors file.
    pub fn name(self) -> String {
        match self {
            OnnxInitializer::Base(id) => id.onnx_name(),
            OnnxInitializer::Lora {
                layer,
                target,
                part,
            } => peft_tensor_name(layer, target, part),
            OnnxInitializer::Arla(i) => ARLA_TENSORS[i].to_string(),
        }
    }
}
