//! The reference with every weight rounded to f16 ([`rounded_to_f16`]), what the f16 graphs are
//! checked against.

use half::f16;
use ndarray::{Array, Dimension};
use reference::base::model::Model;
use reference::base::weights::FeedForward;
use reference::m2r2::weights::M2r2Weights;

fn round_f16<D: Dimension>(a: &mut Array<f32, D>) {
    a.mapv_inplace(|v| f16::from_f32(v).to_f32());
}

/// The model and M2R2 weights with every weight rounded to f16 (round to nearest even): what the
/// f16 graphs compute after their casts, so the f16 flavour is checked against this reference.
pub fn rounded_to_f16(model: &Model, m2r2: &M2r2Weights) -> (Model, M2r2Weights) {
    let mut w = model.weights.clone();
    round_f16(&mut w.embed);
    round_f16(&mut w.final_norm);
    if let Some(h) = &mut w.lm_head {
        round_f16(h);
    }
    let lin = |l: &mut reference::base::weights::Linear| {
        round_f16(&mut l.w);
        if let Some(b) = &mut l.b {
            round_f16(b);
        }
    };
    for layer in &mut w.layers {
        round_f16(&mut layer.attn_norm);
        round_f16(&mut layer.mlp_norm);
        let a = &mut layer.attn;
        for l in [&mut a.q, &mut a.k, &mut a.v, &mut a.o] {
            lin(l);
        }
        let mlps = match &mut layer.ffn {
            FeedForward::Dense(m) => vec![m],
            FeedForward::Moe(moe) => {
                round_f16(&mut moe.router);
                moe.experts.iter_mut().collect()
            }
        };
        for m in mlps {
            for l in [&mut m.gate, &mut m.up, &mut m.down] {
                lin(l);
            }
        }
    }
    let mut m = m2r2.clone();
    for la in m.accelerator.layers.iter_mut().flatten() {
        for lora in la.loras.values_mut() {
            let (mut a, mut b) = (lora.a().clone(), lora.b().clone());
            round_f16(&mut a);
            round_f16(&mut b);
            lora.set(a, b);
        }
    }
    if let Some(bridge) = &mut m.bridge {
        for lora in bridge.maps.values_mut() {
            let (mut a, mut b) = (lora.a().clone(), lora.b().clone());
            round_f16(&mut a);
            round_f16(&mut b);
            lora.set(a, b);
        }
    }
    if let Some(arla) = &mut m.arla {
        for x in [
            &mut arla.proj,
            &mut arla.gate_embed,
            &mut arla.wq,
            &mut arla.wk,
            &mut arla.wv,
        ] {
            round_f16(x);
        }
        round_f16(&mut arla.norm);
        round_f16(&mut arla.wo);
        arla.bo = f16::from_f32(arla.bo).to_f32();
    }
    (Model::new(model.config.clone(), w), m)
}
