//! The weights `m2r2 train` starts from: fresh adapters at the ranks `--rank` gives (one for all
//! gates or one per gate), or the `--init` folder's, whose trained gates `--rank` may widen
//! (`Accelerator::widen`: the same adapter terms, new directions to train).

use anyhow::{Context, Result, bail};
use reference::Model;
use reference::m2r2::config::{DEFAULT_RANK, M2r2Config};
use reference::m2r2::weights::M2r2Weights;
use train::trainer::{initial_weights, initial_weights_ranked};

/// `--rank` as one rank per gate (`None`: that gate's rank is left as it is). Empty `rank` is
/// [`DEFAULT_RANK`] for fresh adapters and no change with `--init`; one value is every gate's
/// (with `--init`: every trained gate's); otherwise one value per gate.
pub fn per_gate(
    rank: &[usize],
    gates: usize,
    init: bool,
    train_gates: &[usize],
) -> Result<Vec<Option<usize>>> {
    if rank.contains(&0) {
        bail!("--rank: ranks must be positive");
    }
    Ok(match rank {
        [] if init => vec![None; gates],
        [] => vec![Some(DEFAULT_RANK); gates],
        [r] if init => (1..=gates)
            .map(|g| train_gates.contains(&g).then_some(*r))
            .collect(),
        [r] => vec![Some(*r); gates],
        list if list.len() == gates => list.iter().copied().map(Some).collect(),
        list => bail!(
            "--rank has {} values, but there are {gates} gates: give one rank, or one per gate",
            list.len()
        ),
    })
}

/// The PEFT default rank `r` of fresh adapters at `ranks`: the most common one (the smallest on a
/// tie), so the fewest pairs need a `rank_pattern` entry.
pub fn default_rank(ranks: &[usize]) -> usize {
    let count = |r: usize| ranks.iter().filter(|&&x| x == r).count();
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted
        .into_iter()
        .max_by_key(|&r| (count(r), std::cmp::Reverse(r)))
        .unwrap_or(DEFAULT_RANK)
}

/// Fresh adapters for `config` at `ranks` (`A` random from `seed`, `B = 0`), or `init` with its
/// trained gates that have no adapters filled in fresh and the ranks of `ranks` applied: a trained
/// gate is widened to its rank (seed `seed + g` for gate g's new rows), an untrained gate must
/// already have it.
pub fn starting_weights(
    model: &Model,
    config: M2r2Config,
    init: Option<M2r2Weights>,
    ranks: &[Option<usize>],
    train_gates: &[usize],
    seed: u64,
) -> Result<M2r2Weights> {
    let Some(mut w) = init else {
        let ranks: Vec<usize> = ranks.iter().map(|r| r.unwrap_or(config.rank)).collect();
        return Ok(initial_weights_ranked(model, config, &ranks, seed)?);
    };
    // A trained gate without adapters in --init starts fresh (A random, B = 0).
    let fresh = initial_weights(model, config, seed)?;
    // (gates out of range are refused by Trainer::new, which names them)
    for &g in train_gates.iter().filter(|&&g| w.config.has_gate(g)) {
        for l in w.config.interval_layers(g - 1) {
            if w.accelerator.layers[l].is_none() {
                w.accelerator.layers[l] = fresh.accelerator.layers[l].clone();
            }
        }
    }
    for (g, rank) in (1..).zip(ranks) {
        let Some(rank) = *rank else { continue };
        let layers = w.config.interval_layers(g - 1);
        if train_gates.contains(&g) {
            w.accelerator
                .widen(layers, rank, seed.wrapping_add(g as u64))
                .with_context(|| format!("--rank {rank} for gate {g}"))?;
        } else if let Some(l) = layers
            .clone()
            .find(|&l| w.accelerator.layer_ranks(l).iter().any(|&r| r != rank))
        {
            bail!(
                "--rank {rank} for gate {g}: gate {g} is not trained (see --train-gates), so its \
                 adapters keep their ranks {:?} (layer {l}); give that rank or train the gate",
                w.accelerator.layer_ranks(l)
            );
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists() {
        assert_eq!(per_gate(&[], 3, false, &[1]).unwrap(), vec![Some(16); 3]);
        assert_eq!(per_gate(&[], 3, true, &[1]).unwrap(), vec![None; 3]);
        assert_eq!(per_gate(&[8], 3, false, &[1]).unwrap(), vec![Some(8); 3]);
        assert_eq!(
            per_gate(&[32], 3, true, &[1, 3]).unwrap(),
            vec![Some(32), None, Some(32)]
        );
        assert_eq!(
            per_gate(&[32, 16, 8], 3, true, &[1]).unwrap(),
            vec![Some(32), Some(16), Some(8)]
        );
        let e = per_gate(&[32, 16], 3, false, &[1]).unwrap_err().to_string();
        assert!(
            e.contains("--rank has 2 values, but there are 3 gates"),
            "{e}"
        );
        assert!(per_gate(&[0], 3, false, &[1]).is_err());
        assert_eq!(default_rank(&[32, 16, 16]), 16);
        assert_eq!(default_rank(&[32, 16, 8]), 8);
        assert_eq!(default_rank(&[32, 32, 8]), 32);
    }
}
