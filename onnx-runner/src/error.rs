//! Typed errors of the ONNX runner. Every message names what to fix: the library file, the graph
//! file, the tensor, the execution provider and its own reason.

use std::path::PathBuf;

/// Result alias used throughout the runner.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The ONNX Runtime library is missing, is not an ONNX Runtime build, or is a version the
    /// bindings cannot use.
    #[error("ONNX Runtime: {0}")]
    Runtime(String),

    /// Downloading or unpacking the onnxruntime wheel failed.
    #[error("provisioning ONNX Runtime: {0}")]
    Provision(String),

    /// The requested execution provider could not be registered (its own reason in `reason`).
    #[error(
        "{file}: the {ep} execution provider is not available: {reason} \
         (pass --ep-fallback to run on the CPU instead)"
    )]
    ExecutionProvider {
        file: String,
        ep: &'static str,
        reason: String,
    },

    /// ONNX Runtime refused a graph or failed while running it.
    #[error("{file}: {msg}")]
    Ort { file: String, msg: String },

    #[error("{file}: the graph has no input `{name}` (its inputs: {known})")]
    UnknownInput {
        file: String,
        name: String,
        known: String,
    },

    #[error("{file}: input `{name}` was not given")]
    MissingInput { file: String, name: String },

    /// `known` says what there was instead, in words.
    #[error("{file}: output `{name}` is missing ({known})")]
    MissingOutput {
        file: String,
        name: String,
        known: String,
    },

    #[error("{file}: tensor `{tensor}` is {actual}, the graph expects {expected}")]
    WrongDtype {
        file: String,
        tensor: String,
        expected: String,
        actual: String,
    },

    #[error("{file}: tensor `{tensor}` has shape {actual:?}, the graph expects {expected}")]
    WrongShape {
        file: String,
        tensor: String,
        expected: String,
        actual: Vec<usize>,
    },

    /// A step that would write past the end of a static export's fixed KV buffers.
    #[error(
        "{file}: the static cache holds {l_max} positions and this step needs {needed}; \
         export with a larger --static-cache"
    )]
    StaticCacheFull {
        file: String,
        l_max: usize,
        needed: usize,
    },

    /// An export folder that does not follow the contract (docs/ONNX.md).
    #[error("{file}: {msg}")]
    Export { file: String, msg: String },
    /// `--cuda-graph on` where it cannot apply, or a capture ONNX Runtime refused.
    #[error("{file}: --cuda-graph: {reason}")]
    CudaGraph { file: String, reason: String },

    #[error(transparent)]
    Reference(#[from] reference::Error),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn ort(file: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Error::Ort {
            file: file.into(),
            msg: error.to_string(),
        }
    }
}

/// An error of the runner as the reference's, for the reference's decoding loops
/// (`GreedyBackend`, `SpeculativeBackend`): the reference's own errors pass through, the others keep
/// their message.
pub fn into_reference(error: Error) -> reference::Error {
    match error {
        Error::Reference(e) => e,
        other => reference::Error::Invalid(other.to_string()),
    }
}
