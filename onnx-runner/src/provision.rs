//! Provisioning libonnxruntime from the PyPI `onnxruntime` wheel into the m2r2 cache.
//!
//! Debian has no onnxruntime package and ort's own download needs its CDN at build time, so the CPU
//! library is taken from the pinned PyPI wheel (which ships `capi/libonnxruntime.so.<version>`):
//! pip downloads the wheel into `<cache>/downloads`, its SHA-256 is checked, the libraries are
//! extracted into a temporary folder, the main library's SHA-256 is checked, and the folder is
//! renamed to `<cache>/onnxruntime/<version>` in one step, so that path never holds a partial or
//! unverified library. A library already there is used only once its SHA-256 matches (about 40 ms
//! for its 29 MB); one damaged since is extracted again. GPU users point `ORT_DYLIB_PATH` at an
//! onnxruntime-gpu build instead.

use crate::error::{Error, Result};
use reference::io::hub::cache_dir;
use reference::io::wheel::{PinnedWheel, Silent, extract_member, sha256_file};
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
    library_dir_in(&cache_dir())
}

/// Where the provisioned library lives (present or not).
pub fn library_path() -> PathBuf {
    library_dir().join(ONNXRUNTIME_LIB)
}

fn library_dir_in(cache: &Path) -> PathBuf {
    cache.join("onnxruntime").join(ONNXRUNTIME_VERSION)
}

/// What [`fetch_into`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The library was there with the pinned SHA-256; nothing else was done.
    Present,
    /// The library was extracted from the verified wheel: it was missing, `force` was given, or
    /// the file there had another SHA-256.
    Extracted,
}

/// [`fetch_into`] the m2r2 cache, returning the library's path.
pub fn fetch(force: bool) -> Result<PathBuf> {
    Ok(fetch_into(&cache_dir(), force)?.0)
}

/// Download, verify and extract the library into `cache` unless a copy with the pinned SHA-256 is
/// already there (or `force`); returns its path and what was done. Pip's progress and our messages
/// go to stderr.
pub fn fetch_into(cache: &Path, force: bool) -> Result<(PathBuf, Fetched)> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Err(Error::Provision(format!(
            "the pinned wheel ({}) is for Linux x86_64; on this platform install ONNX Runtime \
             {ONNXRUNTIME_VERSION} yourself and set ORT_DYLIB_PATH to its library",
            ONNXRUNTIME_WHEEL.file_name
        )));
    }
    fetch_pinned(cache, force, &ONNXRUNTIME_WHEEL, ONNXRUNTIME_LIB_SHA256)
}

/// [`fetch_into`] with the wheel and the library's SHA-256 as arguments.
fn fetch_pinned(
    cache: &Path,
    force: bool,
    wheel: &PinnedWheel,
    library_sha256: &str,
) -> Result<(PathBuf, Fetched)> {
    let dir = library_dir_in(cache);
    let target = dir.join(ONNXRUNTIME_LIB);
    if target.is_file() && !force {
        let sha = sha256_file(&target, &mut Silent).map_err(|e| Error::Provision(e.to_string()))?;
        if sha == library_sha256 {
            return Ok((target, Fetched::Present));
        }
        eprintln!(
            "{} has SHA-256 {sha}, expected {library_sha256} (truncated or damaged): extracting \
             it again",
            target.display()
        );
    }
    let wheel = wheel
        .download(&cache.join("downloads"), force, &mut Silent)
        .map_err(|e| Error::Provision(e.to_string()))?;
    eprintln!("wheel {} verified", wheel.display());
    extract(&wheel, &dir, library_sha256)?;
    Ok((target, Fetched::Extracted))
}

/// Extract [`WHEEL_MEMBERS`] of `wheel` into a temporary folder beside `dir`, check that the main
/// library's SHA-256 is `library_sha256`, and rename the folder to `dir`.
fn extract(wheel: &Path, dir: &Path, library_sha256: &str) -> Result<()> {
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
        if name == ONNXRUNTIME_LIB && sha != library_sha256 {
            return Err(Error::Provision(format!(
                "{member} extracted from {} has SHA-256 {sha}, expected {library_sha256}",
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

    /// A wheel holding [`WHEEL_MEMBERS`] with these bytes.
    fn wheel_with(path: &Path, library: &[u8], providers: &[u8]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        for (member, bytes) in WHEEL_MEMBERS.iter().zip([library, providers]) {
            zip.start_file(*member, zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }

    /// The SHA-256 of `bytes`.
    fn sha(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), bytes).unwrap();
        sha256_file(&dir.path().join("f"), &mut Silent).unwrap()
    }

    /// A cache folder whose downloads hold a verified test wheel (so pip never runs), and that
    /// wheel pinned.
    fn cache_with_wheel() -> (tempfile::TempDir, PinnedWheel) {
        let cache = tempfile::tempdir().unwrap();
        let downloads = cache.path().join("downloads");
        std::fs::create_dir(&downloads).unwrap();
        let path = downloads.join(ONNXRUNTIME_WHEEL.file_name);
        wheel_with(&path, b"the library", b"providers");
        let sha256 = sha256_file(&path, &mut Silent).unwrap();
        let wheel = PinnedWheel {
            sha256: String::leak(sha256),
            ..ONNXRUNTIME_WHEEL
        };
        (cache, wheel)
    }

    #[test]
    fn a_damaged_library_is_extracted_again() {
        let (cache, wheel) = cache_with_wheel();
        let library_sha = sha(b"the library");
        let dir = library_dir_in(cache.path());
        std::fs::create_dir_all(&dir).unwrap();
        for damaged in [&b"the lib"[..], b"garbage!!!!", b""] {
            std::fs::write(dir.join(ONNXRUNTIME_LIB), damaged).unwrap();
            let (path, fetched) = fetch_pinned(cache.path(), false, &wheel, &library_sha).unwrap();
            assert_eq!(
                (path.as_path(), fetched),
                (dir.join(ONNXRUNTIME_LIB).as_path(), Fetched::Extracted)
            );
            assert_eq!(std::fs::read(&path).unwrap(), b"the library");
            assert_eq!(
                std::fs::read(dir.join("libonnxruntime_providers_shared.so")).unwrap(),
                b"providers"
            );
        }
        let (_, fetched) = fetch_pinned(cache.path(), false, &wheel, &library_sha).unwrap();
        assert_eq!(fetched, Fetched::Present);
    }

    #[test]
    fn a_verified_library_needs_no_wheel() {
        let cache = tempfile::tempdir().unwrap();
        let dir = library_dir_in(cache.path());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(ONNXRUNTIME_LIB), b"the library").unwrap();
        let (path, fetched) = fetch_pinned(
            cache.path(),
            false,
            &ONNXRUNTIME_WHEEL,
            &sha(b"the library"),
        )
        .unwrap();
        assert_eq!(
            (path, fetched),
            (dir.join(ONNXRUNTIME_LIB), Fetched::Present)
        );
        assert!(!cache.path().join("downloads").exists());
    }

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
        let err = extract(&wheel, &target, ONNXRUNTIME_LIB_SHA256)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected"), "{err}");
        let left: Vec<_> = std::fs::read_dir(target.parent().unwrap())
            .unwrap()
            .collect();
        assert!(left.is_empty() && !target.exists(), "{left:?}");
    }
}
