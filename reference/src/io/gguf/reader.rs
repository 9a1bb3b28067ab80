//! Parsing a GGUF file (versions 2 and 3, little-endian): header, metadata, tensor infos, data.
//!
//! Layout (GGUF spec, ggml/docs/gguf.md):
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count x (key string | value type u32 | value)
//! tensor_count x (name string | n_dims u32 | dims u64 x n_dims | ggml type u32 | offset u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! ```
//!
//! A string is a u64 byte length followed by UTF-8 bytes; an array is an element type u32, a u64
//! count and the elements. `dims` lists the fastest-varying dimension first (ggml's `ne[0]`), so
//! the PyTorch shape is `dims` reversed.
//!
//! Every number read from the file is checked before use (checked arithmetic, lengths against the
//! bytes left), so a truncated or corrupt file is an [`Error::Format`] naming what is wrong, never a
//! panic or a huge allocation.

use super::dequant;
use super::ggml_type::GgmlType;
use super::value::{GgufValue, GgufValueType};
use crate::base::weights::RawTensor;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// `"GGUF"` read as a little-endian u32.
const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays deeper than this are refused (guards the recursion against crafted files).
const MAX_ARRAY_DEPTH: usize = 8;
/// Items of one metadata array at most: 4 Mi, 16 times the largest vocabulary in use (262 144,
/// Gemma 3), so its parsed values (32 bytes each) stay under 128 MiB whatever the file claims.
pub const MAX_METADATA_ARRAY_LEN: usize = 1 << 22;
/// Bytes of one metadata string at most (64 MiB: a whole `tokenizer.json` embedded as
/// `tokenizer.huggingface.json` fits).
pub const MAX_METADATA_STRING_BYTES: usize = 64 << 20;

/// Where one tensor lives and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the fastest-varying dimension (ggml's `ne[0]`).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Number of values (product of `dims`).
    pub n_elements: usize,
    /// Bytes the tensor occupies in the file.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// The shape in PyTorch order (`dims` reversed): `[out, in]` for a linear weight.
    pub fn shape(&self) -> Vec<usize> {
        // Each dim fits usize: their product was checked when the file was opened.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A GGUF file read into memory: its metadata, its tensor table and its bytes.
pub struct GgufFile {
    pub path: PathBuf,
    /// 2 or 3.
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    /// Alignment of the data section and of every tensor in it.
    pub alignment: u64,
    /// In file order.
    tensors: Vec<TensorInfo>,
    /// Tensor name -> index into `tensors`.
    index: HashMap<String, usize>,
    /// Byte position of the data section in `bytes`.
    data_start: usize,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Read and parse the whole file (tensor data stays raw until [`GgufFile::tensor_f32`]).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(path.to_path_buf(), bytes)
    }

    /// Parse GGUF bytes; `path` is only used to name the file in errors.
    pub fn from_bytes(path: PathBuf, bytes: Vec<u8>) -> Result<GgufFile> {
        let label = path.display().to_string();
        let header = Header::parse(&bytes, &label)?;
        let Header {
            version,
            metadata,
            alignment,
            tensors,
            data_start,
        } = header;
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(Error::format(
                    &label,
                    format!("tensor `{}` is listed twice", t.name),
                ));
            }
        }
        Ok(GgufFile {
            path,
            version,
            metadata,
            alignment,
            tensors,
            index,
            data_start,
            bytes,
        })
    }

    /// The file name for error messages.
    pub fn label(&self) -> String {
        self.path.display().to_string()
    }

    /// Tensor names in file order (GGUF naming: `blk.0.attn_q.weight`, ...).
    pub fn tensor_names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    /// All tensor infos in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, gguf_name: &str) -> Option<&TensorInfo> {
        self.index.get(gguf_name).map(|&i| &self.tensors[i])
    }

    /// The raw (still quantised) bytes of a tensor.
    pub fn tensor_bytes(&self, gguf_name: &str) -> Result<&[u8]> {
        let info = self.require_tensor(gguf_name)?;
        // In range: checked against the file length when the file was opened.
        let start = self.data_start + info.offset as usize;
        Ok(&self.bytes[start..start + info.n_bytes])
    }

    /// The tensor called `gguf_name`, dequantised to f32, values exactly as gguf-py's
    /// `gguf.quants.dequantize` computes them. Errors: [`Error::MissingTensor`], or
    /// [`Error::UnsupportedDtype`] for a ggml type outside [`dequant::SUPPORTED`].
    ///
    /// # Shapes
    /// - returns: GGUF dims reversed (PyTorch order), e.g. `[V, D]` for `token_embd.weight`
    ///   stored with dims `[D, V]`; data row-major
    pub fn tensor_f32(&self, gguf_name: &str) -> Result<RawTensor> {
        let info = self.require_tensor(gguf_name)?;
        let data = dequant::dequantize(info.ggml_type, self.tensor_bytes(gguf_name)?).ok_or_else(
            || Error::UnsupportedDtype {
                file: self.label(),
                tensor: gguf_name.to_string(),
                dtype: format!(
                    "ggml type {} (id {}); supported: {}",
                    info.ggml_type,
                    info.ggml_type.id(),
                    dequant::SUPPORTED
                        .iter()
                        .map(|t| t.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        )?;
        debug_assert_eq!(data.len(), info.n_elements);
        Ok(RawTensor {
            shape: info.shape(),
            data,
        })
    }

    fn require_tensor(&self, gguf_name: &str) -> Result<&TensorInfo> {
        self.tensor_info(gguf_name)
            .ok_or_else(|| Error::MissingTensor {
                file: self.label(),
                tensor: gguf_name.to_string(),
            })
    }
}

/// Everything before the data section.
struct Header {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    alignment: u64,
    tensors: Vec<TensorInfo>,
    data_start: usize,
}

impl Header {
    fn parse(bytes: &[u8], file: &str) -> Result<Header> {
        let mut c = Cursor {
            bytes,
            pos: 0,
            file,
        };
        let magic = c.take(4, "the magic number")?;
        if magic != MAGIC {
            return Err(c.err(format!(
                "bad magic {:?} (expected \"GGUF\"): not a GGUF file",
                String::from_utf8_lossy(magic)
            )));
        }
        let version = c.u32("the version")?;
        if version != 2 && version != 3 {
            let msg = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                "big-endian GGUF files are not supported".to_string()
            } else if version == 1 {
                "GGUF version 1 is not supported (only versions 2 and 3)".to_string()
            } else {
                format!("unsupported GGUF version {version} (only versions 2 and 3)")
            };
            return Err(c.err(msg));
        }
        let tensor_count = c.u64("the tensor count")?;
        let kv_count = c.u64("the metadata count")?;

        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = c.string(&format!("the key of metadata entry {i}"))?;
            let what = format!("metadata `{key}`");
            let type_id = c.u32(&format!("the type of {what}"))?;
            let value = c.value(type_id, &what, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.err(format!("metadata key `{key}` appears twice")));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(GgufValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(v) => {
                return Err(c.err(format!(
                    "`general.alignment` must be a uint32 power of two, got {} {v}",
                    v.type_description()
                )));
            }
        };

        // Each tensor info takes at least 24 bytes; refuse counts the file cannot hold before
        // allocating for them.
        let left = c.remaining() as u64;
        if tensor_count > left / 24 {
            return Err(c.err(format!(
                "tensor count {tensor_count} cannot fit in the {left} bytes left after the metadata"
            )));
        }
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            tensors.push(c.tensor_info(i, alignment)?);
        }

        check_layout(&tensors, alignment, &c)?;

        let data_start = align_up(c.pos as u64, alignment)
            .and_then(|p| usize::try_from(p).ok())
            .ok_or_else(|| c.err("data section offset overflows"))?;
        for t in &tensors {
            let end = (data_start as u64)
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.n_bytes as u64));
            match end {
                Some(end) if end <= bytes.len() as u64 => {}
                _ => {
                    return Err(c.err(format!(
                        "tensor `{}` ({} bytes at data offset {}) extends beyond the end of the file \
                         ({} bytes, data section starts at {data_start}): the file is truncated",
                        t.name,
                        t.n_bytes,
                        t.offset,
                        bytes.len()
                    )));
                }
            }
        }
        Ok(Header {
            version,
            metadata,
            alignment,
            tensors,
            data_start,
        })
    }
}

/// Refuse tensors that are not laid out back to back: each must start where the one before it in
/// the tensor table ends, padded to the alignment, the first at 0. llama.cpp's reader
/// (`gguf_init_from_file_impl`) refuses any other layout, so a file it would not load is not
/// loaded here either; and offsets that overlap or point at another tensor's bytes would
/// otherwise load and run on the wrong weights.
fn check_layout(tensors: &[TensorInfo], alignment: u64, c: &Cursor) -> Result<()> {
    let mut expected = 0u64;
    for t in tensors {
        if t.offset != expected {
            return Err(c.err(format!(
                "tensor `{}` is at data offset {}, expected {expected}: each tensor's data must \
                 follow the previous one's in the order of the tensor table, padded to the \
                 alignment {alignment} (as llama.cpp requires), so offsets that overlap, leave \
                 gaps or are out of order are refused",
                t.name, t.offset
            )));
        }
        expected = expected
            .checked_add(t.n_bytes as u64)
            .and_then(|end| align_up(end, alignment))
            .ok_or_else(|| {
                c.err(format!(
                    "the data of tensor `{}` ends beyond 2^64 bytes",
                    t.name
                ))
            })?;
    }
    Ok(())
}

fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    pos.checked_add(alignment - 1)
        .map(|p| p / alignment * alignment)
}

/// Reads little-endian values from the file bytes, naming what it was reading when they run out.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::format(self.file, msg)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at byte {} but the file has {} bytes",
                self.pos,
                self.bytes.len()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self
            .take(N, what)?
            .try_into()
            .expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length read from the file that must fit in the bytes left, each item taking at least
    /// `min_item_bytes`.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = self.remaining() as u64;
        if n > left / min_item_bytes as u64 {
            return Err(self.err(format!(
                "truncated or corrupt: {what} is {n} but only {left} bytes are left at byte {}",
                self.pos
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.count(&format!("the length of {what}"), 1)?;
        if len > MAX_METADATA_STRING_BYTES {
            return Err(self.err(format!(
                "{what} is {len} bytes long, more than the {MAX_METADATA_STRING_BYTES} a string may have"
            )));
        }
        let start = self.pos;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|e| self.err(format!("{what} at byte {start} is not valid UTF-8: {e}")))
    }

    /// One metadata value of type `type_id`. `depth` counts enclosing arrays.
    fn value(&mut self, type_id: u32, what: &str, depth: usize) -> Result<GgufValue> {
        let ty = GgufValueType::from_id(type_id)
            .ok_or_else(|| self.err(format!("{what} has unknown value type {type_id}")))?;
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(what)?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(what)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(what)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(
                        self.err(format!("{what} is a bool stored as {b} (must be 0 or 1)"))
                    );
                }
            },
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(
                        self.err(format!("{what} nests arrays deeper than {MAX_ARRAY_DEPTH}"))
                    );
                }
                let elem_id = self.u32(&format!("the element type of {what}"))?;
                let elem = GgufValueType::from_id(elem_id).ok_or_else(|| {
                    self.err(format!(
                        "{what} is an array of unknown value type {elem_id}"
                    ))
                })?;
                let n = self.count(&format!("the length of {what}"), 1)?;
                if n > MAX_METADATA_ARRAY_LEN {
                    return Err(self.err(format!(
                        "{what} has {n} items, more than the {MAX_METADATA_ARRAY_LEN} an array may have"
                    )));
                }
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem_id, &format!("{what}[{i}]"), depth + 1)?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }

    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo> {
        let name = self.string(&format!("the name of tensor {i}"))?;
        let what = format!("tensor `{name}`");
        let n_dims = self.u32(&format!("the dimension count of {what}"))?;
        if n_dims > MAX_DIMS {
            return Err(self.err(format!(
                "{what} has {n_dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(&format!("dimension {d} of {what}"))?);
        }
        let type_id = self.u32(&format!("the type of {what}"))?;
        let ggml_type = GgmlType::from_id(type_id)
            .ok_or_else(|| self.err(format!("{what} has unknown ggml type id {type_id}")))?;
        let offset = self.u64(&format!("the data offset of {what}"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(self.err(format!(
                "{what} starts at data offset {offset}, not a multiple of the alignment {alignment}"
            )));
        }

        let n_elements = dims
            .iter()
            .try_fold(1usize, |acc, &d| {
                usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
            })
            .ok_or_else(|| self.err(format!("{what} has dims {dims:?} whose product overflows")))?;
        let block = ggml_type.block_size();
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block as u64) {
            return Err(self.err(format!(
                "{what} has rows of {row} values, not a multiple of the {block}-value blocks of {ggml_type}"
            )));
        }
        let n_bytes = (n_elements / block)
            .checked_mul(ggml_type.type_size())
            .ok_or_else(|| self.err(format!("{what} has a byte size that overflows")))?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
        })
    }
}

#[cfg(test)]
mod tests;
