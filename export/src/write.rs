//! Writing graphs as protobuf files, with the large initializers in an external data file when
//! asked for or when the model would pass protobuf's 2 GB limit, and reading them back.
//!
//! External data follows the ONNX convention: the initializer keeps its name, dims and dtype,
//! `data_location = EXTERNAL`, and `external_data` holds `location` (`<graph>.onnx.data`, relative
//! to the graph), `offset` and `length`. Offsets are 4096-aligned so runtimes can map the file.

use crate::error::{Error, Result};
use crate::proto::tensor_proto::DataLocation;
use crate::proto::{ModelProto, StringStringEntryProto};
use prost::Message;
use std::io::Write;
use std::path::Path;

/// Protobuf messages cannot exceed 2 GiB; models at or above this size get external data.
pub const PROTOBUF_LIMIT: usize = i32::MAX as usize;
/// Initializers at least this large move to the external file (small constants stay inline).
pub const EXTERNAL_MIN_BYTES: usize = 1024;
const ALIGN: u64 = 4096;

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    /// The model as stored in the `.onnx` file (external initializers without their bytes).
    pub proto: ModelProto,
    /// Bytes of the `.onnx` file plus its external data file.
    pub bytes: u64,
    /// The external data file name, when one was written.
    pub external: Option<String>,
}

/// Write `model` to `path` (and `<path>.data` when `external`, or when the model is too large for
/// one protobuf message).
pub fn write_graph(model: ModelProto, path: &Path, external: bool) -> Result<Written> {
    write_graph_limited(model, path, external, PROTOBUF_LIMIT)
}

/// [`write_graph`] with external data switched on automatically from `limit` encoded bytes.
pub fn write_graph_limited(
    mut model: ModelProto,
    path: &Path,
    external: bool,
    limit: usize,
) -> Result<Written> {
    let external = external || model.encoded_len() >= limit;
    let mut bytes = 0u64;
    let mut data_name = None;
    if external {
        let file_name = format!(
            "{}.data",
            path.file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| Error::Invalid(format!("bad graph path {}", path.display())))?
        );
        let data_path = path.with_file_name(&file_name);
        let file = std::fs::File::create(&data_path).map_err(|e| Error::io(&data_path, e))?;
        let mut out = std::io::BufWriter::new(file);
        let mut offset = 0u64;
        let graph = model.graph.as_mut().expect("built models have a graph");
        for t in &mut graph.initializer {
            let Some(raw) = t.raw_data.as_ref() else {
                continue;
            };
            if raw.len() < EXTERNAL_MIN_BYTES {
                continue;
            }
            let pad = (ALIGN - offset % ALIGN) % ALIGN;
            out.write_all(&vec![0u8; pad as usize])
                .map_err(|e| Error::io(&data_path, e))?;
            offset += pad;
            out.write_all(raw).map_err(|e| Error::io(&data_path, e))?;
            let entry = |k: &str, v: String| StringStringEntryProto {
                key: Some(k.into()),
                value: Some(v),
            };
            t.external_data = vec![
                entry("location", file_name.clone()),
                entry("offset", offset.to_string()),
                entry("length", raw.len().to_string()),
            ];
            offset += raw.len() as u64;
            t.raw_data = None;
            t.data_location = Some(DataLocation::External as i32);
        }
        out.flush().map_err(|e| Error::io(&data_path, e))?;
        bytes += offset;
        data_name = Some(file_name);
    }
    let encoded = model.encode_to_vec();
    std::fs::write(path, &encoded).map_err(|e| Error::io(path, e))?;
    bytes += encoded.len() as u64;
    Ok(Written {
        proto: model,
        bytes,
        external: data_name,
    })
}

/// Decode an `.onnx` file (external data stays referenced, not loaded).
pub fn read_graph(path: &Path) -> Result<ModelProto> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    ModelProto::decode(bytes.as_slice()).map_err(|e| Error::Decode {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}
