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
mod tests {
    use super::*;
    use crate::io::gguf::builder::{Builder, put_str};

    fn small() -> Builder {
        Builder::default()
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2)
            .kv_str_array("tokenizer.ggml.tokens", &["a", "b"])
            .tensor_f32("w", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .tensor_f32("v", &[2], &[7.0, 8.0])
    }

    fn err_of(bytes: Vec<u8>) -> String {
        GgufFile::from_bytes("bad.gguf".into(), bytes)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_metadata_and_tensors() {
        let f = small().open().unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(
            f.metadata["general.architecture"],
            GgufValue::String("llama".into())
        );
        assert_eq!(f.metadata["llama.block_count"], GgufValue::U32(2));
        assert_eq!(f.tensor_names(), vec!["w", "v"]);
        let w = f.tensor_f32("w").unwrap();
        // GGUF dims [3, 2] (ne0 = 3 fastest) are PyTorch shape [2, 3].
        assert_eq!(w.shape, vec![2, 3]);
        assert_eq!(w.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(f.tensor_f32("v").unwrap().data, vec![7.0, 8.0]);
        assert_eq!(f.tensor_info("v").unwrap().offset, 32);
        let missing = f.tensor_f32("nope").unwrap_err().to_string();
        assert!(missing.contains("tensor `nope` is missing"), "{missing}");
    }

    #[test]
    fn version_2_parses_like_version_3() {
        let mut bytes = small().build();
        bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        let f = GgufFile::from_bytes("v2.gguf".into(), bytes).unwrap();
        assert_eq!(f.version, 2);
        assert_eq!(f.tensor_f32("v").unwrap().data, vec![7.0, 8.0]);
    }

    #[test]
    fn every_value_type_parses() {
        let mut nested = 9u32.to_le_bytes().to_vec(); // array of arrays of u8
        nested.extend(1u64.to_le_bytes());
        nested.extend(0u32.to_le_bytes());
        nested.extend(2u64.to_le_bytes());
        nested.extend([5, 6]);
        let f = Builder::default()
            .kv_raw("u8", 0, &[200])
            .kv_raw("i8", 1, &[0xff])
            .kv_raw("u16", 2, &513u16.to_le_bytes())
            .kv_raw("i16", 3, &(-2i16).to_le_bytes())
            .kv_u32("u32", 70000)
            .kv_raw("i32", 5, &(-70000i32).to_le_bytes())
            .kv_f32("f32", 0.25)
            .kv_bool("bool", true)
            .kv_str("string", "héllo")
            .kv_raw("u64", 10, &(1u64 << 40).to_le_bytes())
            .kv_raw("i64", 11, &(-(1i64 << 40)).to_le_bytes())
            .kv_raw("f64", 12, &0.1f64.to_le_bytes())
            .kv_raw("nested", 9, &nested)
            .open()
            .unwrap();
        let m = &f.metadata;
        assert_eq!(m["u8"], GgufValue::U8(200));
        assert_eq!(m["i8"], GgufValue::I8(-1));
        assert_eq!(m["u16"], GgufValue::U16(513));
        assert_eq!(m["i16"], GgufValue::I16(-2));
        assert_eq!(m["u32"], GgufValue::U32(70000));
        assert_eq!(m["i32"], GgufValue::I32(-70000));
        assert_eq!(m["f32"], GgufValue::F32(0.25));
        assert_eq!(m["bool"], GgufValue::Bool(true));
        assert_eq!(m["string"], GgufValue::String("héllo".into()));
        assert_eq!(m["u64"], GgufValue::U64(1 << 40));
        assert_eq!(m["i64"], GgufValue::I64(-(1 << 40)));
        assert_eq!(m["f64"], GgufValue::F64(0.1));
        let inner = GgufValue::Array(GgufValueType::U8, vec![GgufValue::U8(5), GgufValue::U8(6)]);
        assert_eq!(
            m["nested"],
            GgufValue::Array(GgufValueType::Array, vec![inner])
        );
    }

    #[test]
    fn malformed_files_are_named_errors() {
        let good = small().build();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"GGML\x03\0\0\0".to_vec(), "bad magic \"GGML\""),
            (b"GG".to_vec(), "truncated: the magic number needs 4 bytes"),
            (
                b"GGUF\x03\0".to_vec(),
                "truncated: the version needs 4 bytes",
            ),
            (
                b"GGUF\x01\0\0\0".to_vec(),
                "GGUF version 1 is not supported",
            ),
            (b"GGUF\x07\0\0\0".to_vec(), "unsupported GGUF version 7"),
            (
                b"GGUF\0\0\0\x03".to_vec(),
                "big-endian GGUF files are not supported",
            ),
            (
                good[..30].to_vec(),
                "truncated: the length of the key of metadata entry 0",
            ),
            (
                good[..66].to_vec(),
                "the length of metadata `general.architecture` is 5 but only 2 bytes are left at byte 64",
            ),
            (
                good[..good.len() - 4].to_vec(),
                "tensor `v` (8 bytes at data offset 32) extends beyond the end of the file",
            ),
        ];
        for (bytes, want) in cases {
            let err = err_of(bytes);
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(
                err.starts_with("bad.gguf: corrupt or unsupported file"),
                "{err}"
            );
        }
    }

    #[test]
    fn corrupt_fields_are_named_errors() {
        let unknown_type = Builder::default()
            .tensor("t", &[4], GgmlType::F32, &[0; 16])
            .build();
        // Patch the tensor's ggml type (the u32 after name and one dim) to an id ggml never had.
        let type_pos = 24 + 8 + 1 + 4 + 8;
        let mut bad_type = unknown_type.clone();
        bad_type[type_pos..type_pos + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(err_of(bad_type).contains("tensor `t` has unknown ggml type id 1000"));

        let huge_string = Builder::default()
            .kv_raw("k", 8, &u64::MAX.to_le_bytes())
            .build();
        assert!(err_of(huge_string).contains("the length of metadata `k` is 18446744073709551615"));

        // Documented limits, whatever the file's size allows.
        let mut long_array = 0u32.to_le_bytes().to_vec(); // u8 items
        long_array.extend(((MAX_METADATA_ARRAY_LEN + 1) as u64).to_le_bytes());
        long_array.resize(long_array.len() + MAX_METADATA_ARRAY_LEN + 1, 7);
        let long_array = Builder::default().kv_raw("k", 9, &long_array).build();
        assert!(
            err_of(long_array).contains("metadata `k` has 4194305 items, more than the 4194304")
        );
        let mut long_string = ((MAX_METADATA_STRING_BYTES + 1) as u64)
            .to_le_bytes()
            .to_vec();
        long_string.resize(long_string.len() + MAX_METADATA_STRING_BYTES + 1, b'x');
        let long_string = Builder::default().kv_raw("k", 8, &long_string).build();
        assert!(err_of(long_string).contains("67108865 bytes long, more than the 67108864"));

        let bad_value_type = Builder::default().kv_raw("k", 99, &[]).build();
        assert!(err_of(bad_value_type).contains("metadata `k` has unknown value type 99"));

        let bad_bool = Builder::default().kv_raw("k", 7, &[2]).build();
        assert!(err_of(bad_bool).contains("bool stored as 2"));

        let bad_align = Builder::default().kv_u32("general.alignment", 3).build();
        assert!(err_of(bad_align).contains("`general.alignment` must be a uint32 power of two"));

        let twice = Builder::default().kv_u32("k", 1).kv_u32("k", 2).build();
        assert!(err_of(twice).contains("metadata key `k` appears twice"));

        let dup = Builder::default()
            .tensor_f32("t", &[1], &[1.0])
            .tensor_f32("t", &[1], &[1.0])
            .build();
        assert!(err_of(dup).contains("tensor `t` is listed twice"));

        let ragged = Builder::default()
            .tensor("q", &[33, 1], GgmlType::Q8_0, &[0; 68])
            .build();
        assert!(
            err_of(ragged)
                .contains("rows of 33 values, not a multiple of the 32-value blocks of Q8_0")
        );

        let overflow = Builder::default()
            .tensor("o", &[u64::MAX, 2], GgmlType::F32, &[])
            .build();
        assert!(err_of(overflow).contains("whose product overflows"));

        let mut deep = vec![];
        for _ in 0..20 {
            deep.extend(9u32.to_le_bytes());
            deep.extend(1u64.to_le_bytes());
        }
        let deep = Builder::default().kv_raw("d", 9, &deep).build();
        assert!(err_of(deep).contains("nests arrays deeper than 8"));

        let mut not_utf8 = vec![];
        put_str(&mut not_utf8, "ok");
        not_utf8.truncate(8);
        not_utf8.extend([0xff, 0xfe]);
        let not_utf8 = Builder::default().kv_raw("s", 8, &not_utf8).build();
        assert!(err_of(not_utf8).contains("metadata `s` at byte"));
    }

    #[test]
    fn unsupported_type_is_unsupported_dtype() {
        let f = Builder::default()
            .tensor("iq", &[256], GgmlType::IQ2_XXS, &[0; 66])
            .open()
            .unwrap();
        let err = f.tensor_f32("iq").unwrap_err();
        assert!(matches!(err, Error::UnsupportedDtype { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("tensor `iq` has unsupported dtype ggml type IQ2_XXS (id 16)"),
            "{msg}"
        );
    }

    #[test]
    fn custom_alignment_is_honoured() {
        // With alignment 64 the data section starts at a multiple of 64.
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        put_str(&mut bytes, "general.alignment");
        bytes.extend(4u32.to_le_bytes());
        bytes.extend(64u32.to_le_bytes());
        put_str(&mut bytes, "t");
        bytes.extend(1u32.to_le_bytes());
        bytes.extend(2u64.to_le_bytes());
        bytes.extend(0u32.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        while !bytes.len().is_multiple_of(64) {
            bytes.push(0xaa);
        }
        bytes.extend(1.5f32.to_le_bytes());
        bytes.extend(2.5f32.to_le_bytes());
        let f = GgufFile::from_bytes("a.gguf".into(), bytes).unwrap();
        assert_eq!(f.alignment, 64);
        assert_eq!(f.tensor_f32("t").unwrap().data, vec![1.5, 2.5]);
    }
}
