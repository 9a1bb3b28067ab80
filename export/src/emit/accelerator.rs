//! Accelerator adapters (reference `accelerator.rs`): the LoRA term `scale * (x A^T) B^T` that fast
//! rows add to a base projection.

use crate::builder::GraphBuilder;
use crate::emit::ops::linear;
use reference::base::weight_names::Target;
use reference::io::peft::LoraPart;
use reference::m2r2::accelerator::Accelerator;
use reference::m2r2::weight_names::OnnxInitializer;

/// The adapter term of `target` in layer `layer`, or `None` where the layer has no adapter there
/// or it is exactly zero (`A = 0` or `B = 0`: adding it would add exact zeros).
///
/// # Shapes
/// - `x`: `[..., in]` -> `[..., out]`
pub fn delta(
    b: &mut GraphBuilder,
    accelerator: &Accelerator,
    layer: usize,
    target: Target,
    x: &str,
) -> Option<String> {
    let lora = accelerator.lora(layer, target)?;
    if lora.is_zero() {
        return None;
    }
    Some(b.scoped("lora", |b| {
        let name = |part| {
            OnnxInitializer::Lora {
                layer,
                target,
                part,
            }
            .name()
        };
        let a = b.weight(&name(LoraPart::A), lora.a().view().into_dyn());
        let bw = b.weight(&name(LoraPart::B), lora.b().view().into_dyn());
        let h = linear(b, x, &a, None); // [..., r]
        let y = linear(b, &h, &bw, None); // [..., out]
        let scale = b.scalar_f32(accelerator.scale(lora));
        b.binary("Mul", &scale, &y)
    }))
}
