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
            msg: ort_message(&error.to_string()),
        }
    }
}

/// ONNX Runtime's message without the C++ frame it was thrown from (`Exception during
/// initialization: /onnxruntime_src/...cc:74 onnxruntime::...::Info(const std::vector<...>&, ...)
/// [ONNXRuntimeError] : 1 : FAIL : `), with what to do where the cause is known: external data
/// shorter than the graph says is a truncated `.onnx.data` file.
fn ort_message(msg: &str) -> String {
    const FAIL: &str = "[ONNXRuntimeError] : ";
    // `[ONNXRuntimeError] : <code> : <name> : <detail>`, kept as `<name>: <detail>`
    let parts: Vec<&str> = match msg.rfind(FAIL) {
        Some(at) => msg[at + FAIL.len()..].splitn(3, " : ").collect(),
        None => vec![],
    };
    let detail = match parts[..] {
        [_, name, detail] => format!("{name}: {}", detail.trim()),
        _ => msg.trim().to_string(),
    };
    if detail.contains("External initializer") && detail.contains("out of bounds") {
        format!(
            "{detail} (the graph's external data file is shorter than its initializers say: a \
             truncated copy? export the folder again; `m2r2 info --onnx DIR` lists such problems)"
        )
    } else {
        detail
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

#[cfg(test)]
mod tests {
    /// ONNX Runtime 1.31's message for a truncated `model.onnx.data`, as `run` met it.
    #[test]
    fn ort_messages_lose_the_cxx_frame_and_say_what_to_do() {
        let raw = "Exception during initialization: /onnxruntime_src/onnxruntime/core/optimizer/\
                   optimizer_execution_frame.cc:74 onnxruntime::OptimizerExecutionFrame::Info::\
                   Info(const std::vector<const onnxruntime::Node*>&, const onnxruntime::\
                   logging::Logger&) [ONNXRuntimeError] : 1 : FAIL : tensorprotoutils.cc:1876 \
                   GetExtDataFromTensorProto External initializer: model.embed_tokens.weight \
                   offset: 4096 size to read: 81920 given file_length: 1000 are out of bounds or \
                   can not be read in full.\n";
        let msg = super::ort_message(raw);
        assert!(
            msg.starts_with(
                "FAIL: tensorprotoutils.cc:1876 GetExtDataFromTensorProto External initializer: \
                 model.embed_tokens.weight offset: 4096"
            ),
            "{msg}"
        );
        assert!(
            msg.ends_with("`m2r2 info --onnx DIR` lists such problems)"),
            "{msg}"
        );
        assert!(!msg.contains("std::vector"), "{msg}");
        // a message of another shape is kept whole
        assert_eq!(
            super::ort_message("no such graph file"),
            "no such graph file"
        );
    }
}
