//! Tests of the PEFT tensor names: written, parsed back, and names that are not LoRA tensors.

use super::*;
use crate::base::weight_names::{AttnProj, MlpProj};

#[test]
fn tensor_names() {
    let q = Target::Attn(AttnProj::Q);
    let down = Target::Mlp(MlpProj::Down);
    assert_eq!(
        peft_tensor_name(3, q, LoraPart::A),
        "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
    );
    assert_eq!(
        peft_tensor_name(0, down, LoraPart::B),
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
    );
    for (l, t, p) in [(3, q, LoraPart::A), (12, down, LoraPart::B)] {
        assert_eq!(
            parse_tensor_name(&peft_tensor_name(l, t, p)),
            Some((l, t, p))
        );
    }
    assert_eq!(
        parse_tensor_name("model.layers.2.self_attn.v_proj.lora_B.weight"),
        Some((2, Target::Attn(AttnProj::V), LoraPart::B))
    );
    for bad in [
        "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.model.layers.x.self_attn.q_proj.lora_A.weight",
    ] {
        assert_eq!(parse_tensor_name(bad), None, "{bad}");
    }
}
