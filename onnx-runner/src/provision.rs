//! Provisioning libonnxruntime from the PyPI `onnxruntime` wheel into the m2r2 cache.
//!
//! Debian has no onnxruntime package and ort's own download needs its CDN at build time, so the CPU
//! library is taken from the pinned PyPI wheel (which ships `capi/libonnxruntime.so.<version>`):
//! pip downloads the wheel into `<cache>/downloads`, its SHA-256 is checked, the libraries are
//! extracted into a temporary folder, the main library's SHA-256 is checked, and the folder is
//! renamed to `<cache>/onnxruntime/<version>` in one step, so that path never holds a partial or
//! unverified library. GPU users point `ORT_DYLIB_PATH` at an onnxruntime-gpu build instead.

use crate::error::{Error, Result};
use reference::io::hub::cache_dir;
use reference::io::wheel::{PinnedWheel, Silent, extract_member};
use std::path::{Path, PathBuf};

pub const ONNXRUNTIME_PACKAGE: &str = "onnxruntime";
pub const ONNXRUNTIME_VERSION: &str = "1.31.1";
/// The wheel pip is asked for: CPython 3.11, manylinux_2_28 x86_64 (the library inside does not
/// depend on the Python version; pinning one wheel pins one SHA-256).
pub const ONNXRUNTIME_WHEEL: PinnedWheel = PinnedWheel {
    package: ONNXRUNTIME_PACKAGE,
    version: ONNXRUNTIME_VERSION,
    file_name: "onnxruntime-1.31.1-cp311-cp311-manylinux_2_28_x86_64.whl",
    sha256: "5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f",
    pip_selectors: &[
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
    ],
    alternative: "set ORT_DYLIB_PATH to an ONNX Runtime library",
};
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
            "the pinned wheel ({}) is for Linux x86_64; on this platform install ONNX Runtime \
             {ONNXRUNTIME_VERSION} yourself and set ORT_DYLIB_PATH to its library",
            ONNXRUNTIME_WHEEL.file_name
        )));
    }
    let target = library_path();
    if target.is_file() && !force {
        return Ok(target);
    }
    let wheel = ONNXRUNTIME_WHEEL
        .download(&cache_dir().join("downloads"), force, &mut Silent)
        .map_err(|e| Error::Provision(e.to_string()))?;
    eprintln!("wheel {} verified", wheel.display());
    extract(&wheel, &library_dir())?;
    Ok(target)
}

/// Extract [`WHEEL_MEMBERS`] of `wheel` into a temporary folder beside `dir`, verify the main
/// library, and rename the folder to `dir`.
fn extract(wheel: &Path, dir: &Path) -> Result<()> {
    let parent = dir.parent().expect("the library folder sits in the cache");
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{ONNXRUNTIME_VERSION}.part-"))
        .tempdir_in(parent)
        .map_err(|e| Error::io(parent, e))?;
    for member in WHEEL_MEMBERS {
        let name = member.rsplit('/').next().expect("a member name");
        let sha = extract_member(wheel, member, &temp.path().join(name), &mut Silent)
            .map_err(|e| Error::Provision(e.to_string()))?;
        if name == ONNXRUNTIME_LIB && sha != ONNXRUNTIME_LIB_SHA256 {
            return Err(Error::Provision(format!(
                "{member} extracted from {} has SHA-256 {sha}, expected {ONNXRUNTIME_LIB_SHA256}",
                wheel.display()
            )));
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::rename(temp.path(), dir).map_err(|e| Error::io(dir, e))?;
    // The folder now lives at `dir`; nothing is left for the guard to remove.
    let _ = temp.keep();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

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
}
