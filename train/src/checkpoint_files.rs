//! How a checkpoint folder is written and checked, so that a kill at any moment leaves a folder
//! that `checkpoint::resume` either reads whole or refuses, naming the file:
//!
//! 1. every file of the save is written into the staging folder `DIR/.saving` (same file system);
//! 2. each is synced and renamed into `DIR` (a rename replaces a file whole), the trainer state
//!    last, and the M2R2 files the save did not write (an old ARLA, draft head or bridge) are
//!    removed;
//! 3. the trainer state records the SHA-256 of the tensor files and the adapter config it goes
//!    with ([`DIGESTED`]), which resume compares with the files it finds.
//!
//! A kill before step 2 leaves the previous checkpoint as it was. A kill between two renames of
//! step 2 leaves a mix of old and new files beside the old state, and the rest of the new files,
//! the new state included, in the staging folder: [`finish_interrupted_save`] (run first by
//! `inspect` and `resume`) completes that save when the staged state's digests match the files,
//! and anything else that does not match is refused by [`check_digests`], naming the file.

use crate::error::{Error, Result};
use reference::io::folder_kind::M2R2_CONFIG_FILE;
use reference::io::peft::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE};
use reference::io::wheel::{Silent, sha256_file};
use reference::m2r2::arla::ARLA_FILE;
use reference::m2r2::bridge::BRIDGE_FILE;
use reference::m2r2::draft_head::DRAFT_HEAD_FILE;
use reference::m2r2::weights::M2r2Weights;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The staging folder inside a checkpoint folder (removed after each save).
pub const STAGING_DIR: &str = ".saving";

/// Every file an M2R2 weights folder may hold (`M2r2Weights::save_dir`).
pub const WEIGHT_FILES: [&str; 6] = [
    M2R2_CONFIG_FILE,
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    BRIDGE_FILE,
    ARLA_FILE,
    DRAFT_HEAD_FILE,
];

/// The folder of a `train` run's best validation weights inside its `--out`.
pub const BEST_DIR: &str = "best";

/// The M2R2 weights files ([`WEIGHT_FILES`]) and trainer files `dir` holds: what a command that
/// writes new weights there replaces.
pub fn weights_files_in(dir: &Path) -> Vec<&'static str> {
    WEIGHT_FILES
        .iter()
        .chain(&[STATE_FILE, OPTIMIZER_FILE])
        .copied()
        .filter(|f| dir.join(f).is_file())
        .collect()
}

/// Remove what [`weights_files_in`] finds in `dir`, and the folders a `train` run leaves beside
/// them ([`BEST_DIR`], and [`STAGING_DIR`] of an interrupted save), before other weights are
/// written there (`--force`): new adapters do not go with an old run's trainer state, best
/// weights, ARLA, draft head or bridge. Files m2r2 does not write are kept. Returns what was
/// removed, folders with a trailing `/`.
pub fn clear_weights(dir: &Path) -> Result<Vec<String>> {
    let mut removed: Vec<String> = Vec::new();
    for f in weights_files_in(dir) {
        let path = dir.join(f);
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        removed.push(f.into());
    }
    for folder in [BEST_DIR, STAGING_DIR] {
        let path = dir.join(folder);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            removed.push(format!("{folder}/"));
        }
    }
    Ok(removed)
}

/// The files whose SHA-256 the trainer state records: what training continues from. Not
/// `m2r2_config.json`, which `tune-drafting --write` edits without touching what is trained.
pub const DIGESTED: [&str; 4] = [
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    BRIDGE_FILE,
    OPTIMIZER_FILE,
];

/// Files written into [`STAGING_DIR`] of a folder, moved into the folder by [`Staged::commit`].
pub struct Staged {
    dir: PathBuf,
    staging: PathBuf,
}

impl Staged {
    /// An empty staging folder inside `dir` (both created if needed; a staging folder left by an
    /// interrupted save is cleared).
    pub fn new(dir: &Path) -> Result<Self> {
        let staging = dir.join(STAGING_DIR);
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
        }
        std::fs::create_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
        Ok(Staged {
            dir: dir.to_path_buf(),
            staging,
        })
    }

    /// Where the files of this save are written.
    pub fn path(&self) -> &Path {
        &self.staging
    }

    /// SHA-256 of the staged files among [`DIGESTED`], by file name.
    pub fn digests(&self) -> Result<BTreeMap<String, String>> {
        let mut digests = BTreeMap::new();
        for name in DIGESTED {
            let path = self.staging.join(name);
            if path.exists() {
                digests.insert(name.to_string(), sha256_file(&path, &mut Silent)?);
            }
        }
        Ok(digests)
    }

    /// Remove the [`WEIGHT_FILES`] of the folder that this save did not write, then move every
    /// staged file into the folder, `last` (when staged) after all others.
    pub fn commit(self, last: &str) -> Result<()> {
        let names = self.staged_names()?;
        for name in WEIGHT_FILES {
            let stale = self.dir.join(name);
            if !names.iter().any(|n| n == name) && stale.exists() {
                std::fs::remove_file(&stale).map_err(|e| Error::io(&stale, e))?;
            }
        }
        self.move_in(last)
    }

    fn staged_names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        for entry in std::fs::read_dir(&self.staging).map_err(|e| Error::io(&self.staging, e))? {
            let entry = entry.map_err(|e| Error::io(&self.staging, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    /// Move every staged file into the folder, `last` after all others; remove the staging folder.
    fn move_in(self, last: &str) -> Result<()> {
        let mut names = self.staged_names()?;
        names.sort_by_key(|n| (n == last, n.clone()));
        for name in &names {
            let (from, to) = (self.staging.join(name), self.dir.join(name));
            // the data reaches the disk before the name does
            std::fs::File::open(&from)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(&from, e))?;
            std::fs::rename(&from, &to).map_err(|e| Error::io(&to, e))?;
        }
        std::fs::remove_dir(&self.staging).map_err(|e| Error::io(&self.staging, e))?;
        // the renames reach the disk (a folder opens read-only for its sync on unix)
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

/// Complete a save into `dir` that was killed while its files were renamed into place: when the
/// staging folder holds a whole trainer state whose digests match the files it goes with (each
/// still staged one, else the folder's), move the rest in. Returns whether it did; a staging
/// folder of a save killed before that point is left for the next save to clear.
pub fn finish_interrupted_save(dir: &Path) -> Result<bool> {
    #[derive(Deserialize)]
    struct Files {
        files_sha256: Option<BTreeMap<String, String>>,
    }
    let staging = dir.join(STAGING_DIR);
    let Ok(text) = std::fs::read_to_string(staging.join(STATE_FILE)) else {
        return Ok(false);
    };
    let Ok(Files {
        files_sha256: Some(files),
    }) = serde_json::from_str(&text)
    else {
        return Ok(false);
    };
    for (name, want) in &files {
        let staged = staging.join(name);
        let path = if staged.exists() {
            staged
        } else {
            dir.join(name)
        };
        if !path.exists() || sha256_file(&path, &mut Silent)? != *want {
            return Ok(false);
        }
    }
    let staged = Staged {
        dir: dir.to_path_buf(),
        staging,
    };
    staged.move_in(STATE_FILE)?;
    Ok(true)
}

/// Write an M2R2 weights folder (`OUT/best`) through [`Staged`]: each file is whole, old or new.
pub fn save_weights(weights: &M2r2Weights, dir: &Path) -> Result<()> {
    let staged = Staged::new(dir)?;
    weights.save_dir(staged.path())?;
    staged.commit("")
}

/// Refuse a checkpoint folder whose files are not those its trainer state records (`step`: the
/// state's step count, for the message).
pub fn check_digests(dir: &Path, recorded: &BTreeMap<String, String>, step: usize) -> Result<()> {
    for (name, want) in recorded {
        let path = dir.join(name);
        if !path.exists() {
            return Err(Error::Invalid(format!(
                "{} is missing: the checkpoint saved at step {step} ({STATE_FILE}) has one; \
                 resume from a folder that holds all of its files",
                path.display()
            )));
        }
        if sha256_file(&path, &mut Silent)? != *want {
            let what = if name == OPTIMIZER_FILE {
                "copied from another run, or left by a save that did not finish"
            } else {
                "rewritten after this checkpoint (by `init-m2r2 --force` or `train-arla --out` \
                 into this folder?), copied from another run, or left by a save that did not \
                 finish"
            };
            return Err(Error::Invalid(format!(
                "{} is not the file the checkpoint saved at step {step} (its SHA-256 differs from \
                 the one in {STATE_FILE}): it was {what}, so resuming would continue from other \
                 weights or optimizer moments. Resume from a checkpoint whose files are its own, \
                 or start a new run from these weights with --init",
                path.display()
            )));
        }
    }
    // a digested file the state does not know of (a bridge copied in) is not the checkpoint's
    if !recorded.is_empty()
        && let Some(extra) = DIGESTED
            .iter()
            .find(|n| !recorded.contains_key(**n) && dir.join(n).exists())
    {
        return Err(Error::Invalid(format!(
            "{} is not part of the checkpoint saved at step {step} ({STATE_FILE} records no such \
             file): it was added after the checkpoint; remove it, or start a new run from these \
             weights with --init",
            dir.join(extra).display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit moves the staged files in, the named one last, removes stale weight files, and
    /// leaves no staging folder; a staging folder left by a killed save is cleared by the next.
    #[test]
    fn commit_replaces_files_and_removes_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(ARLA_FILE), "old arla").unwrap();
        std::fs::write(d.join(STATE_FILE), "old state").unwrap();
        std::fs::write(d.join("notes.txt"), "kept").unwrap();
        std::fs::create_dir_all(d.join(STAGING_DIR)).unwrap();
        std::fs::write(d.join(STAGING_DIR).join("half"), "killed").unwrap();
        let staged = Staged::new(d).unwrap();
        assert!(!staged.path().join("half").exists());
        std::fs::write(staged.path().join(STATE_FILE), "new state").unwrap();
        std::fs::write(staged.path().join(ADAPTER_WEIGHTS_FILE), "new adapters").unwrap();
        let digests = staged.digests().unwrap();
        assert_eq!(digests.keys().collect::<Vec<_>>(), [ADAPTER_WEIGHTS_FILE]);
        staged.commit(STATE_FILE).unwrap();
        let read = |n: &str| std::fs::read_to_string(d.join(n)).unwrap();
        assert_eq!(read(STATE_FILE), "new state");
        assert_eq!(read(ADAPTER_WEIGHTS_FILE), "new adapters");
        assert_eq!(read("notes.txt"), "kept");
        assert!(!d.join(ARLA_FILE).exists());
        assert!(!d.join(STAGING_DIR).exists());
        check_digests(d, &digests, 3).unwrap();
        std::fs::write(d.join(ADAPTER_WEIGHTS_FILE), "other adapters").unwrap();
        let e = check_digests(d, &digests, 3).unwrap_err().to_string();
        assert!(
            e.contains("adapter_model.safetensors is not the file"),
            "{e}"
        );
        assert!(e.contains("init-m2r2 --force"), "{e}");
        std::fs::write(d.join(BRIDGE_FILE), "a bridge").unwrap();
        std::fs::write(d.join(ADAPTER_WEIGHTS_FILE), "new adapters").unwrap();
        let e = check_digests(d, &digests, 3).unwrap_err().to_string();
        assert!(e.contains("bridge.safetensors is not part of"), "{e}");
    }
}
