//! Typed errors of the exporter: each names what cannot be exported and why.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A model or M2R2 setting the graphs cannot express.
    #[error("cannot export: {0}")]
    Unsupported(String),

    /// An opset outside the range the emitters are written for.
    #[error(
        "opset {opset} is not supported: the dynamic graphs support opset {min}..={max} only ({why}); {fix}"
    )]
    Opset {
        opset: i64,
        min: i64,
        max: i64,
        why: &'static str,
        /// What to pass instead.
        fix: &'static str,
    },

    /// A weight the f16 flavour cannot store: beyond f16's largest finite value it would be inf.
    #[error(
        "weight `{name}` does not fit in f16: its largest |value| is {largest}, beyond 65504 \
         (the largest finite f16), so it would be stored as inf and the graphs would compute inf \
         and NaN; export with --weights-dtype f32"
    )]
    F16Range { name: String, largest: f32 },

    /// Bad arguments from the caller.
    #[error("{0}")]
    Invalid(String),

    /// A written graph that does not decode back.
    #[error("{}: not a valid ONNX model: {msg}", path.display())]
    Decode { path: PathBuf, msg: String },

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
}
