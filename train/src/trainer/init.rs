//! The weights training starts from: fresh adapters with `A` random and `B = 0`, so the fast stream
//! starts at the plain early exit.

use crate::error::Result;
use reference::Model;
use reference::m2r2::accelerator::Accelerator;
use reference::m2r2::config::M2r2Config;
use reference::m2r2::weights::M2r2Weights;

/// Starting weights: the settings `config`, `A ~ N(0, 1/in)` from `seed` and `B = 0` (PEFT's
/// initialisation up to the distribution of `A`), so training starts at the early exit (fast =
/// slow). No ARLA.
pub fn initial_weights(model: &Model, config: M2r2Config, seed: u64) -> Result<M2r2Weights> {
    let ranks = vec![config.rank; config.num_gates()];
    initial_weights_ranked(model, config, &ranks, seed)
}

/// [`initial_weights`] with rank `ranks[j]` on interval `j` (one per gate) and one scale,
/// `config.alpha / config.rank` ([`M2r2Weights::random_ranked`]).
pub fn initial_weights_ranked(
    model: &Model,
    config: M2r2Config,
    ranks: &[usize],
    seed: u64,
) -> Result<M2r2Weights> {
    let mut weights = M2r2Weights::random_ranked(&model.config, config, ranks, seed)?;
    weights.arla = None;
    zero_b(&mut weights.accelerator);
    Ok(weights)
}

fn zero_b(acc: &mut Accelerator) {
    for lora in acc
        .layers
        .iter_mut()
        .flatten()
        .flat_map(|l| l.loras.values_mut())
    {
        let zeros = ndarray::Array2::zeros(lora.b().dim());
        lora.set(lora.a().clone(), zeros);
    }
}
