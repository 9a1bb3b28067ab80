//! Typed errors of the training crate; messages name the file or setting at fault.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Reference(#[from] reference::Error),

    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A distillation data file that is not what `distill-data` writes.
    #[error("{file}: {msg}")]
    Data { file: String, msg: String },

    /// A model or setting the trainer does not handle.
    #[error("{0}")]
    Unsupported(String),

    /// Bad training settings.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
