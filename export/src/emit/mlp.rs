//! The dense SwiGLU MLP (reference `mlp.rs`): `down(silu(gate x) * up x)`.

use crate::builder::GraphBuilder;
use crate::emit::ops::swiglu;
use reference::base::weight_names::MlpProj;

/// `project(b, p, x)` emits the projection `p` (base weight, plus the adapter term on fast rows).
///
/// # Shapes
/// - `h`: `[..., D]` (already RMS-normed) -> `[..., D]`
pub fn mlp(
    b: &mut GraphBuilder,
    h: &str,
    project: &mut dyn FnMut(&mut GraphBuilder, MlpProj, &str) -> String,
) -> String {
    b.scoped("mlp", |b| {
        let gate = project(b, MlpProj::Gate, h); // [..., I]
        let up = project(b, MlpProj::Up, h);
        let act = swiglu(b, &gate, &up);
        project(b, MlpProj::Down, &act)
    })
}
