//! Provisioning libonnxruntime from the PyPI `onnxruntime` wheel into the m2r2 cache.
//!
//! Debian has no onnxruntime package and ort's own download needs its CDN at build time, so the CPU
//! library is taken from the pinned PyPI wheel (which ships `capi/libonnxruntime.so.<version>`):
//! pip downloads the wheel into `<cache>/downloads`, its SHA-256 is checked, the libraries are
//! extracted into a temporary folder, the main library's SHA-256 is checked, and the folder is
//! renamed to `<cache>/onnxruntime/<version>` in one step, so that path never holds a partial or
//! unverified library. GPU users point `ORT_DYLIB_PATH` at an onnxruntime-gpu build instead.

use crate::error::{Error, Result};
use reference::hub::cache_dir;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const ONNXRUNTIME_PACKAGE: &str = "onnxruntime";
pub const ONNXRUNTIME_VERSION: &str = "1.31.1";
/// The wheel pip is asked for: CPython 3.11, manylinux_2_28 x86_64 (the library inside does not
/// depend on the Python version; pinning one wheel pins one SHA-256).
pub const ONNXRUNTIME_WHEEL: &str = "onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl";
pub const ONNXRUNTIME_WHEEL_SHA256: &str =
    "5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f";
/// The library the runner loads, and its SHA-256.
pub const ONNXRUNTIME_LIB: &str = "libonnxruntime.so.1.31.1";
pub const ONNXRUNTIME_LIB_SHA256: &str =
    "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3";
/// Wheel members extracted next to each other (the providers' shared library is what a GPU
/// provider would load beside the main one; extracting it keeps the folder a faithful copy).
const WHEEL_MEMBERS: [&str; 2] = [
    "onnxruntime/capi/libonnxruntime.so.1.31.1",
    "onnxruntime/capi/libonnxruntime_providers_shared.so",
];

/// `<cache>/onnxruntime/<version>`: the folder `m2r2 fetch onnxruntime` fills.
pub fn library_dir() -> PathBuf {
    cache_dir().join("onnxruntime").join(ONNXRUNTIME_VERSION)
}

/// Where the provisioned library lives (present or not).
pub fn library_path() -> PathBuf {
    library_dir().join(ONNXRUNTIME_LIB)
}

/// Download, verify and extract the library unless a copy is already there (or `force`); returns
/// its path. Pip's progress and our messages go to stderr.
pub fn fetch(force: bool) -> Result<PathBuf> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Err(Error::Provision(format!(
            "the pinned wheel ({ONNXRUNTIME_WHEEL}) is for Linux x86_64; on this platform install \
             ONNX Runtime {ONNXRUNTIME_VERSION} yourself and set ORT_DYLIB_PATH to its library"
        )));
    }
    let target = library_path();
    if target.is_file() && !force {
        return Ok(target);
    }
    let downloads = cache_dir().join("downloads");
    std::fs::create_dir_all(&downloads).map_err(|e| Error::io(&downloads, e))?;
    let wheel = downloads.join(ONNXRUNTIME_WHEEL);
    let reusable = !force && wheel.is_file() && sha256_file(&wheel)? == ONNXRUNTIME_WHEEL_SHA256;
    if !reusable {
        if wheel.exists() {
            // pip would keep a stale file of the same name instead of downloading again.
            std::fs::remove_file(&wheel).map_err(|e| Error::io(&wheel, e))?;
        }
        pip_download(&downloads)?;
        if !wheel.is_file() {
            return Err(Error::Provision(format!(
                "pip finished but {} is not there; {}",
                wheel.display(),
                by_hand(&downloads)
            )));
        }
        let sha = sha256_file(&wheel)?;
        if sha != ONNXRUNTIME_WHEEL_SHA256 {
            std::fs::remove_file(&wheel).ok();
            return Err(Error::Provision(format!(
                "the downloaded wheel has SHA-256 {sha}, expected {ONNXRUNTIME_WHEEL_SHA256} \
                 (removed {}); retry, or {}",
                wheel.display(),
                by_hand(&downloads)
            )));
        }
    }
    eprintln!("wheel {} verified", wheel.display());
    extract(&wheel, &library_dir())?;
    Ok(target)
}

fn by_hand(downloads: &Path) -> String {
    format!(
        "download {ONNXRUNTIME_WHEEL} from https://pypi.org/project/{ONNXRUNTIME_PACKAGE}/{ONNXRUNTIME_VERSION}/#files \
         into {} and run `m2r2 fetch onnxruntime` again, or set ORT_DYLIB_PATH to an ONNX Runtime library",
        downloads.display()
    )
}

/// `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --platform
/// manylinux_2_28_x86_64 onnxruntime==<version> -d <dir>`, pip's stdout sent to our stderr.
fn pip_download(dir: &Path) -> Result<()> {
    let requirement = format!("{ONNXRUNTIME_PACKAGE}=={ONNXRUNTIME_VERSION}");
    let dir_arg = dir.display().to_string();
    let pip_args = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        &requirement,
        "-d",
        &dir_arg,
    ];
    eprintln!("running: python3 {}", pip_args.join(" "));
    let status = Command::new("python3")
        .args(pip_args)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Provision(format!(
            "python3 is not installed (or not on PATH) and the library is fetched with pip; \
             install Python 3 with pip, or {}",
            by_hand(dir)
        ))),
        Err(e) => Err(Error::Provision(format!("cannot run python3: {e}"))),
        Ok(status) if !status.success() => Err(Error::Provision(format!(
            "`python3 -m pip download` failed ({status}); see pip's messages above. If there is \
             no network, {}",
            by_hand(dir)
        ))),
        Ok(_) => Ok(()),
    }
}

/// Extract [`WHEEL_MEMBERS`] of `wheel` into a temporary folder beside `dir`, verify the main
/// library, and rename the folder to `dir`.
fn extract(wheel: &Path, dir: &Path) -> Result<()> {
    let label = wheel.display().to_string();
    let file = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| Error::Provision(format!("{label} is not a zip archive: {e}")))?;
    let parent = dir.parent().expect("the library folder sits in the cache");
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let temp = RemoveOnDrop(Some(parent.join(format!(
        ".{ONNXRUNTIME_VERSION}.part-{}",
        std::process::id()
    ))));
    let temp_dir = temp.0.clone().expect("not kept yet");
    std::fs::create_dir_all(&temp_dir).map_err(|e| Error::io(&temp_dir, e))?;
    for member in WHEEL_MEMBERS {
        let mut entry = zip
            .by_name(member)
            .map_err(|e| Error::Provision(format!("{label} has no member {member}: {e}")))?;
        let name = member.rsplit('/').next().expect("a member name");
        let out_path = temp_dir.join(name);
        let mut out = File::create(&out_path).map_err(|e| Error::io(&out_path, e))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| Error::Provision(format!("cannot read {member} from {label}: {e}")))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| Error::io(&out_path, e))?;
        }
        out.sync_all().map_err(|e| Error::io(&out_path, e))?;
        let sha = hex(&hasher.finalize());
        if name == ONNXRUNTIME_LIB && sha != ONNXRUNTIME_LIB_SHA256 {
            return Err(Error::Provision(format!(
                "{member} extracted from {label} has SHA-256 {sha}, expected {ONNXRUNTIME_LIB_SHA256}"
            )));
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::rename(&temp_dir, dir).map_err(|e| Error::io(dir, e))?;
    temp.keep();
    Ok(())
}

/// SHA-256 of a file as lowercase hex.
fn sha256_file(path: &Path) -> Result<String> {
    let mut file = BufReader::new(File::open(path).map_err(|e| Error::io(path, e))?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A temporary folder removed when dropped, unless kept.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            std::fs::remove_dir_all(path).ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_library_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("w.whl");
        let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
        zip.start_file(WHEEL_MEMBERS[0], zip::write::SimpleFileOptions::default())
            .unwrap();
        zip.write_all(b"not the library").unwrap();
        zip.finish().unwrap();
        let target = dir.path().join("cache").join(ONNXRUNTIME_VERSION);
        let err = extract(&wheel, &target).unwrap_err().to_string();
        assert!(err.contains("expected"), "{err}");
        let left: Vec<_> = std::fs::read_dir(target.parent().unwrap())
            .unwrap()
            .collect();
        assert!(left.is_empty() && !target.exists(), "{left:?}");
    }

    #[test]
    fn sha256_of_a_known_string() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
