//! The bridge `m2r2 train --bridge-rank` adds to the starting weights (docs/m2r2/bridge.md):
//! fresh maps at the given rank and sites, each site's term scaled to the state it joins.

use anyhow::{Context, Result, bail};
use reference::Model;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::weights::M2r2Weights;

/// `weights` with a fresh bridge (`A` random from `seed`, `B = 0`) of `rank` at `sites`; refused
/// when they carry a bridge of other settings already (`--init` of a bridged folder keeps its own).
pub fn add_bridge(
    model: &Model,
    weights: M2r2Weights,
    rank: usize,
    sites: &[String],
    seed: u64,
    sample: Option<&[u32]>,
) -> Result<M2r2Weights> {
    let sites = sites
        .iter()
        .map(|s| BridgeSite::parse(s.trim()))
        .collect::<reference::Result<Vec<_>>>()
        .context("--bridge-sites")?;
    if let Some(have) = &weights.config.bridge {
        if have.rank != rank || have.sites != sites {
            bail!(
                "--bridge-rank {rank} --bridge-sites {sites:?}: the --init folder has a bridge of \
                 rank {} at {:?} already; leave out --bridge-rank to keep training it",
                have.rank,
                have.sites
            );
        }
        return Ok(weights);
    }
    let mut config = BridgeConfig::new(weights.config.draft_gate, rank, sites);
    // each site's term starts at the size of the state it joins (docs/m2r2/bridge.md)
    let rms = |x: &[f32]| (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt();
    let w = &model.weights;
    let first = weights.config.boundary(weights.config.draft_gate - 1);
    // the draft gate's interval starts at the embeddings for gate 1: their mean row RMS
    let entry_rms = (first == 0).then(|| {
        let rows = w.embed.rows().into_iter();
        rows.map(|r| rms(&r.to_vec())).sum::<f32>() / w.embed.nrows() as f32
    });
    // the gate joins the exit state, an estimate of s_N: its RMS on the first data sample
    let final_rms = match sample {
        Some(tokens) => {
            let zeros = M2r2Weights::zeros(&model.config);
            let (_, last) = reference::m2r2::fast_stream::M2r2::new(model, &zeros)
                .all_exit_states_and_final(tokens)
                .context("the bridge's scale: the slow stream of the first sample")?;
            let rows = last.rows().into_iter();
            Some(rows.map(|r| rms(&r.to_vec())).sum::<f32>() / last.nrows() as f32)
        }
        None => None,
    };
    config.matched_scales(rms(&w.final_norm.to_vec()), entry_rms, final_rms);
    weights
        .with_bridge(&model.config, config, seed.wrapping_add(0xb41d6e), 0.0)
        .context("--bridge-rank")
}
