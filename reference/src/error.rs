//! Typed errors of the reference crate. Every message names the file and, where there is one, the
//! tensor and both shapes, so a user can fix a checkpoint without reading our code.

use std::path::PathBuf;

/// Result alias used throughout the reference crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A config that cannot be read, or that asks for something we do not implement.
    #[error("{file}: {msg}")]
    Config { file: String, msg: String },

    /// A file whose bytes are not what its format promises (truncated, corrupt header, ...).
    #[error("{file}: corrupt or unsupported file: {msg}")]
    Format { file: String, msg: String },

    #[error("{file}: tensor `{tensor}` is missing")]
    MissingTensor { file: String, tensor: String },

    #[error("{file}: tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        file: String,
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },

    #[error("{file}: tensor `{tensor}` has unsupported dtype {dtype}")]
    UnsupportedDtype {
        file: String,
        tensor: String,
        dtype: String,
    },

    #[error(
        "token id {id} at position {position} is out of range: the vocabulary has {vocab_size} tokens"
    )]
    TokenOutOfRange {
        id: u32,
        position: usize,
        vocab_size: usize,
    },

    #[error(
        "sequence needs {needed} positions but the context holds {capacity} \
         (shorten the prompt, or ask for fewer new tokens)"
    )]
    ContextOverflow { needed: usize, capacity: usize },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// Bad arguments from the caller (an unknown built-in name, an empty prompt, ...).
    #[error("{0}")]
    Invalid(String),

    /// Downloading or verifying a pinned wheel (`wheel`).
    #[error("{0}")]
    Fetch(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub fn config(file: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config {
            file: file.into(),
            msg: msg.into(),
        }
    }

    pub fn format(file: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Format {
            file: file.into(),
            msg: msg.into(),
        }
    }
}
