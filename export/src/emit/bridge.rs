//! The bridge (reference `m2r2/bridge.rs`): `x̂ = RMSNorm_final(h)` of the state before each draft
//! row (the graph input `bridge_states`) and each site's term `c (x̂ A^T) B^T`.

use crate::builder::GraphBuilder;
use crate::emit::model::final_norm;
use crate::emit::ops::linear;
use reference::base::model::Model;
use reference::m2r2::bridge::{Bridge, BridgeSite};

/// `x̂ = RMSNorm_final(h)` (the final norm's own weight, shared with the LM head's).
///
/// # Shapes
/// - `h`: `[B, T, D]` -> `[B, T, D]`
pub fn input(b: &mut GraphBuilder, model: &Model, h: &str) -> String {
    b.scoped("bridge", |b| final_norm(b, model, h))
}

/// The term of `site`, or `None` where the bridge has no map there.
///
/// # Shapes
/// - `xhat`: `[B, T, D]` -> `[B, T, D]`
pub fn term(b: &mut GraphBuilder, bridge: &Bridge, site: BridgeSite, xhat: &str) -> Option<String> {
    let lora = bridge.maps.get(&site)?;
    Some(b.scoped("bridge", |b| {
        b.scoped(site.name(), |b| {
            let [a_name, b_name] = site.tensor_names();
            let a = b.weight(&a_name, lora.a().view().into_dyn());
            let bw = b.weight(&b_name, lora.b().view().into_dyn());
            let h = linear(b, xhat, &a, None); // [B, T, r]
            let y = linear(b, &h, &bw, None); // [B, T, D]
            let c = b.scalar_f32(lora.scale(false));
            b.binary("Mul", &c, &y)
        })
    }))
}
