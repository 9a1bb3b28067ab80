//! What `m2r2 train` may do with its `--out` folder. A folder that holds a checkpoint or M2R2
//! weights is written only when this run continues that checkpoint (`--resume` of the same
//! folder) or replaces it (`--force`: its M2R2 and trainer files and `best/` go before training
//! starts, as `init-m2r2 --force` and `train-arla --force` clear theirs), as `distill-data` and
//! `init-m2r2` refuse a non-empty `--out`.

use crate::cli::common;
use anyhow::{Context, Result, bail};
use std::path::Path;
use train::checkpoint::{OPTIMIZER_FILE, STATE_FILE};
use train::checkpoint_files::{BEST_DIR, WEIGHT_FILES};

/// Refuse an `--out` holding a checkpoint, M2R2 weights or best weights that this run would
/// overwrite without being asked to, saying how to proceed.
pub fn check(out: &Path, resume: Option<&Path>, force: bool) -> Result<()> {
    let shown = out.display();
    let continued = resume.is_some_and(|r| common::same_folder(r, out));
    if continued {
        if force {
            bail!(
                "--force with --resume {shown}: --force replaces the checkpoint in --out, which \
                 --resume continues; leave out --force"
            );
        }
        return Ok(());
    }
    if force {
        return Ok(());
    }
    let how = format!(
        "choose another --out, or pass --force to replace it (its M2R2 and trainer files, and \
         {shown}/{BEST_DIR})"
    );
    if out.join(STATE_FILE).exists() {
        let done = match train::checkpoint::progress(out) {
            Ok((step, steps)) => format!(" (step {step} of {steps})"),
            Err(_) => String::new(),
        };
        bail!(
            "--out {shown} holds a training checkpoint{done}: continue it with --resume {shown} \
             --out {shown}, {how}"
        );
    }
    if let Some(file) = WEIGHT_FILES
        .iter()
        .chain([&OPTIMIZER_FILE])
        .find(|f| out.join(f).exists())
    {
        bail!("--out {shown} holds M2R2 weights ({file}): {how}");
    }
    if out.join(BEST_DIR).exists() {
        bail!("--out {shown} holds the best weights of an earlier run ({BEST_DIR}/): {how}");
    }
    Ok(())
}

/// Make `--out` ready for training, once the run is set up: with `force`, remove the M2R2 and
/// trainer files and `best/` an earlier run left there (so nothing of it is taken for this run's); when
/// resuming another folder into a new `--out`, copy that checkpoint's `best/` (its early-stopping
/// record names those weights).
pub fn prepare(out: &Path, resume: Option<&Path>, force: bool) -> Result<()> {
    if force {
        common::report_cleared(out)?;
    }
    if let Some(from) = resume
        && !common::same_folder(from, out)
        && from.join(BEST_DIR).is_dir()
    {
        let (src, dst) = (from.join(BEST_DIR), out.join(BEST_DIR));
        std::fs::create_dir_all(&dst)
            .with_context(|| format!("cannot create {}", dst.display()))?;
        for entry in std::fs::read_dir(&src).with_context(|| format!("{}", src.display()))? {
            let path = entry.with_context(|| format!("{}", src.display()))?.path();
            if path.is_file() {
                let to = dst.join(path.file_name().expect("a file name"));
                std::fs::copy(&path, &to).with_context(|| {
                    format!("cannot copy {} to {}", path.display(), to.display())
                })?;
            }
        }
    }
    Ok(())
}
