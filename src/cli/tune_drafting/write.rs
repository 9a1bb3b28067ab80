//! `tune-drafting --write DIR`: the folder that receives the chosen defaults, checked before any
//! tracing (it must hold the weights that were tuned), and the defaults written into its
//! `m2r2_config.json`.

use super::Args;
use super::defaults::{Defaults, applied};
use crate::cli::args::m2r2::M2r2Args;
use crate::cli::common;
use anyhow::{Context, Result, bail};
use reference::golden::weights_hash_without_defaults;
use reference::io::load::LoadedModel;
use reference::m2r2::config::{M2R2_CONFIG_FILE, M2r2Config};
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// The `--write` folder's config, checked before any work. The policy is chosen for the `--m2r2`
/// weights, so the folder must be the `--m2r2` folder itself or hold the same weights: equal
/// [`weights_hash_without_defaults`] (adapters, ARLA, bridge, draft head and every setting but
/// the decoding defaults that `--write` replaces), both as stored.
///
/// # Errors
/// A folder that does not load as M2R2 weights of the model, or holds other weights (both named).
pub(super) fn check_target(dir: &Path, args: &Args, loaded: &LoadedModel) -> Result<M2r2Config> {
    let model = &loaded.model.config;
    let shown = dir.display();
    let target = M2r2Weights::load_dir(dir, model).with_context(|| {
        format!(
            "--write {shown}: not an M2R2 weights folder of {}",
            loaded.name
        )
    })?;
    let tuned = M2r2Args::weights_only(args.m2r2.clone());
    let itself = match tuned.m2r2.as_deref() {
        None | Some("none") => false,
        Some(m2r2) => common::same_folder(Path::new(m2r2), dir),
    };
    if !itself {
        let source = tuned.weights(loaded)?;
        let (want, got) = (
            weights_hash_without_defaults(&source),
            weights_hash_without_defaults(&target),
        );
        if want != got {
            bail!(
                "--write {shown} holds other M2R2 weights (weights hash {got}) than the ones \
                 tuned, --m2r2 {} (weights hash {want}): the policy is chosen for --m2r2's \
                 weights; write into that folder or a copy of it",
                tuned.source(loaded)
            );
        }
    }
    Ok(target.config)
}

/// Write the reference's defaults at the top level of `folder` (the `--write` folder's config,
/// from [`check_target`]) and, where given, ONNX Runtime's in `onnx_drafting` where they differ
/// (without them the folder's `onnx_drafting` is kept); a branch length is written only when
/// branches were priced (`priced_lookup`).
pub(super) fn write(
    dir: &Path,
    folder: &M2r2Config,
    (reference, onnx): (&Defaults, Option<&Defaults>),
    priced_lookup: bool,
    loaded: &LoadedModel,
) -> Result<()> {
    let top = applied(reference, folder.drafting(), priced_lookup);
    // ONNX Runtime's own only where it differs; without --onnx the folder's is kept
    let onnx_drafting = match onnx {
        Some(d) => Some(applied(d, folder.for_onnx().drafting(), priced_lookup)),
        None => folder.onnx_drafting.clone(),
    }
    .filter(|o| *o != top);
    let mut written = folder.with_drafting(&top);
    written.onnx_drafting = onnx_drafting;
    let file = dir.join(M2R2_CONFIG_FILE);
    written
        .validate(&loaded.model.config, &file.display().to_string())
        .with_context(|| format!("--write {}", dir.display()))?;
    written.save(dir)?;
    Ok(())
}
