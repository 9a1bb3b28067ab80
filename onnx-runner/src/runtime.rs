//! Loading libonnxruntime, once per process.
//!
//! Lookup order: `ORT_DYLIB_PATH`, else the m2r2 cache (`m2r2 fetch onnxruntime`), else the pinned
//! PyPI wheel is provisioned into the cache on first use (with a message on stderr). The file is
//! checked before ort sees it (present, a shared library exporting ONNX Runtime's entry point is
//! ort's own check), ort rejects versions older than its `api-30` bindings (ONNX Runtime 1.30), and
//! the version is read back from ONNX Runtime after loading. Every failure is an [`Error::Runtime`],
//! never a panic.
//!
//! ONNX Runtime allows one environment per process, so the environment lives in a static next to
//! the [`RuntimeInfo`] describing it.

use crate::error::{Error, Result};
use crate::provision;
use ort::environment::Environment;
use ort::logging::LogLevel;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where the loaded library came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibrarySource {
    /// `ORT_DYLIB_PATH`
    Env,
    /// Found in the m2r2 cache.
    Cache,
    /// Provisioned into the cache by this process.
    Provisioned,
}

/// The loaded ONNX Runtime.
#[derive(Clone, Debug)]
pub struct RuntimeInfo {
    pub path: PathBuf,
    pub source: LibrarySource,
    /// e.g. `1.31.1`, as the library reports it (`GetVersionString`).
    pub version: String,
    /// ONNX Runtime's build string.
    pub build_info: String,
}

struct Runtime {
    info: RuntimeInfo,
    environment: Environment,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Load ONNX Runtime if it is not loaded yet (idempotent; later calls return the same info).
pub fn init() -> Result<&'static RuntimeInfo> {
    Ok(&runtime()?.info)
}

/// The process's ONNX Runtime environment (loaded on first use).
pub(crate) fn environment() -> Result<&'static Environment> {
    Ok(&runtime()?.environment)
}

fn runtime() -> Result<&'static Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let _guard = INIT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let (path, source) = locate()?;
    let runtime = load(&path, source)?;
    Ok(RUNTIME.get_or_init(|| runtime))
}

/// The library to load and where it was found; provisions it when nothing is found.
fn locate() -> Result<(PathBuf, LibrarySource)> {
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Ok((PathBuf::from(path), LibrarySource::Env));
    }
    let cached = provision::library_path();
    if cached.is_file() {
        // checked against its pinned SHA-256 (about 40 ms) and extracted again when damaged: a
        // truncated library dies of SIGBUS inside ONNX Runtime, with no message
        return Ok((provision::fetch(false)?, LibrarySource::Cache));
    }
    eprintln!(
        "ONNX Runtime is not set up (ORT_DYLIB_PATH is unset and {} is missing): provisioning \
         onnxruntime {} from PyPI into {} (once; `m2r2 fetch onnxruntime` does the same)",
        cached.display(),
        provision::ONNXRUNTIME_VERSION,
        provision::library_dir().display()
    );
    Ok((provision::fetch(false)?, LibrarySource::Provisioned))
}

/// Check `path`, read its version, hand it to ort and build the environment.
fn load(path: &Path, source: LibrarySource) -> Result<Runtime> {
    check_library_file(path, source)?;
    let version = library_version(path)
        .map_err(|e| Error::Runtime(format!("{} ({}): {e}", path.display(), describe(source))))?;
    let minor = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if !version.starts_with("1.") || minor < ort::MINOR_VERSION {
        return Err(Error::Runtime(format!(
            "{} is ONNX Runtime {version}, but these bindings need 1.{}.x or newer ({}); \
             unset ORT_DYLIB_PATH to use the provisioned {}, or point it at a newer build",
            path.display(),
            ort::MINOR_VERSION,
            describe(source),
            provision::ONNXRUNTIME_VERSION
        )));
    }
    let builder = ort::init_from(path).map_err(|e| {
        Error::Runtime(format!(
            "cannot load {} ({}): {e}",
            path.display(),
            describe(source)
        ))
    })?;
    // One intra-op thread pool for every session of the process, a thread per core. With ONNX
    // Runtime's defaults (a spinning pool per session) the idle workers of the graph that ran
    // last keep spinning while the next graph runs (draft, then verifier) and take the cores the
    // working ones need (docs/ONNX.md, "Cost of a run"). One shared pool has no such neighbours,
    // so its idle threads do spin: blocking them made every parallel operator wake a sleeping
    // thread, and ONNX Runtime CPU decoding measured 20-25 % slower (docs/journal/2026-11-26-onnx-spinning.md).
    // `--ort-spinning off` gives each session its own pool that blocks, for machines whose
    // cores are busy with other work.
    let pool = ort::environment::GlobalThreadPoolOptions::default()
        .with_spin_control(true)
        .map_err(|e| Error::Runtime(format!("cannot configure the thread pool: {e}")))?;
    let level = log_level()?;
    let environment = builder
        .with_name("m2r2")
        .with_global_thread_pool(pool)
        .with_logger(std::sync::Arc::new(
            move |at, _: &str, _: &str, _: &str, msg: &str| log_plainly(level, at, msg),
        ))
        .build()
        .map_err(|e| Error::Runtime(format!("cannot create the environment: {e}")))?;
    // ort creates an environment with a custom logger at the verbose level: every graph
    // transformer's and initializer's line would reach the logger (hundreds a session); the
    // logger itself filters the lines of the environment's creation
    environment.set_log_level(level);
    Ok(Runtime {
        info: RuntimeInfo {
            path: path.to_path_buf(),
            source,
            version,
            build_info: ort::info().to_string(),
        },
        environment,
    })
}

/// The least severe of ONNX Runtime's own log lines that reach stderr: `ORT_LOG` (`verbose`,
/// `info`, `warning`, `error` or `fatal`, the names the `ort` crate reads), warnings when it is
/// unset or empty. `ORT_LOG=info` shows, for example, each CUDA graph capture and replay.
fn log_level() -> Result<LogLevel> {
    let value = std::env::var("ORT_LOG").unwrap_or_default();
    Ok(match value.as_str() {
        "" | "warning" => LogLevel::Warning,
        "verbose" => LogLevel::Verbose,
        "info" => LogLevel::Info,
        "error" => LogLevel::Error,
        "fatal" => LogLevel::Fatal,
        other => {
            return Err(Error::Runtime(format!(
                "ORT_LOG={other:?} is not a log level: use verbose, info, warning, error or fatal \
                 (or unset it for warnings)"
            )));
        }
    })
}

/// One of ONNX Runtime's own log lines, at level `at`, as plain text on stderr with its level when
/// `at` is at least `least` ([`log_level`]): its default logger colours them with terminal
/// escapes, which pipes and CI logs show raw. Its errors are not printed here: the call that
/// failed returns the same message, which the runner reports once, with the file it names.
fn log_plainly(least: LogLevel, at: LogLevel, msg: &str) {
    if at < least {
        return;
    }
    let name = match at {
        LogLevel::Verbose => "verbose",
        LogLevel::Info => "info",
        LogLevel::Warning => "warning",
        LogLevel::Error | LogLevel::Fatal => return,
    };
    eprintln!("onnxruntime {name}: {msg}");
}

/// The version string ONNX Runtime reports (`OrtGetApiBase()->GetVersionString()`), read by
/// opening the library on its own (ort then opens the same file; the loader shares it).
pub fn library_version(path: &Path) -> std::result::Result<String, String> {
    // SAFETY: loading a shared library runs its initialisers; the file was checked to be a shared
    // library, and an ONNX Runtime build has no initialisers with preconditions on the caller.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("cannot load the library: {e}"))?;
    // SAFETY: `OrtGetApiBase` is ONNX Runtime's C entry point with this exact signature.
    let get_api_base = unsafe {
        library.get::<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase>(b"OrtGetApiBase")
    }
    .map_err(|_| "it does not export `OrtGetApiBase`, so it is not ONNX Runtime".to_string())?;
    // SAFETY: the entry point takes no arguments and returns a pointer to a static table (or null).
    let base = unsafe { get_api_base() };
    if base.is_null() {
        return Err("`OrtGetApiBase` returned nothing".into());
    }
    // SAFETY: `base` points to ONNX Runtime's static OrtApiBase; GetVersionString returns a static
    // NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(((*base).GetVersionString)()) };
    version
        .to_str()
        .map(str::to_string)
        .map_err(|_| "its version string is not UTF-8".into())
}

fn describe(source: LibrarySource) -> &'static str {
    match source {
        LibrarySource::Env => "from ORT_DYLIB_PATH",
        LibrarySource::Cache => "from the m2r2 cache; `m2r2 fetch onnxruntime --force` replaces it",
        LibrarySource::Provisioned => "just provisioned",
    }
}

/// A readable shared library (ELF, Mach-O or PE header), before dlopen sees it.
pub fn check_library_file(path: &Path, source: LibrarySource) -> Result<()> {
    let hint = match source {
        LibrarySource::Env => {
            "ORT_DYLIB_PATH must name libonnxruntime.so.<version> (e.g. the capi/ folder of the \
             onnxruntime or onnxruntime-gpu wheel); unset it to use `m2r2 fetch onnxruntime`"
        }
        _ => "run `m2r2 fetch onnxruntime --force`",
    };
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut magic)
    });
    if let Err(e) = read {
        return Err(Error::Runtime(format!(
            "cannot read the library {}: {e}; {hint}",
            path.display()
        )));
    }
    let shared_library = magic == *b"\x7fELF"
        || magic[..2] == *b"MZ"
        || [0xfeedfacf_u32, 0xcffaedfe, 0xcafebabe].contains(&u32::from_be_bytes(magic));
    if !shared_library {
        return Err(Error::Runtime(format!(
            "{} is not a shared library; {hint}",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_foreign_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("libonnxruntime.so.1.31.1");
        let err = check_library_file(&missing, LibrarySource::Env).unwrap_err();
        assert!(err.to_string().contains("cannot read the library"), "{err}");
        assert!(err.to_string().contains("ORT_DYLIB_PATH"), "{err}");
        std::fs::write(&missing, b"just text, not a library").unwrap();
        let err = check_library_file(&missing, LibrarySource::Cache).unwrap_err();
        assert!(err.to_string().contains("is not a shared library"), "{err}");
        std::fs::write(&missing, b"\x7fELF and more").unwrap();
        check_library_file(&missing, LibrarySource::Cache).unwrap();
    }
}
