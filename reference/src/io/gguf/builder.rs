//! Hand-built GGUF bytes: the unit tests of `gguf` and `tokenizer`, and the fuzz seeds of
//! `m2r2-tests` (`hostile`).

use super::ggml_type::GgmlType;
use super::reader::{DEFAULT_ALIGNMENT, GgufFile};
use crate::error::Result;

/// GGUF v3 bytes built key by key and tensor by tensor (default alignment).
#[derive(Default)]
pub struct Builder {
    kvs: Vec<u8>,
    kv_count: u64,
    infos: Vec<u8>,
    tensor_count: u64,
    data: Vec<u8>,
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Builder {
    /// A raw key/value pair: `value` is the type tag followed by the encoded value.
    pub fn kv_raw(mut self, key: &str, type_id: u32, value: &[u8]) -> Self {
        put_str(&mut self.kvs, key);
        self.kvs.extend(type_id.to_le_bytes());
        self.kvs.extend(value);
        self.kv_count += 1;
        self
    }
    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key, 4, &v.to_le_bytes())
    }
    pub fn kv_f32(self, key: &str, v: f32) -> Self {
        self.kv_raw(key, 6, &v.to_le_bytes())
    }
    pub fn kv_bool(self, key: &str, v: bool) -> Self {
        self.kv_raw(key, 7, &[u8::from(v)])
    }
    pub fn kv_str(self, key: &str, v: &str) -> Self {
        let mut b = vec![];
        put_str(&mut b, v);
        self.kv_raw(key, 8, &b)
    }
    pub fn kv_str_array(self, key: &str, items: &[&str]) -> Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((items.len() as u64).to_le_bytes());
        for s in items {
            put_str(&mut b, s);
        }
        self.kv_raw(key, 9, &b)
    }
    pub fn kv_i32_array(self, key: &str, items: &[i32]) -> Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend((items.len() as u64).to_le_bytes());
        for v in items {
            b.extend(v.to_le_bytes());
        }
        self.kv_raw(key, 9, &b)
    }
    /// A tensor with GGUF-order `dims` and raw block bytes, placed at the next aligned offset.
    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: GgmlType, bytes: &[u8]) -> Self {
        while !self.data.len().is_multiple_of(DEFAULT_ALIGNMENT as usize) {
            self.data.push(0);
        }
        put_str(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ggml_type.id().to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.tensor_count += 1;
        self
    }
    /// An f32 tensor with GGUF-order `dims`.
    pub fn tensor_f32(self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F32, &bytes)
    }
    pub fn build(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(self.kvs);
        out.extend(self.infos);
        while !out.len().is_multiple_of(DEFAULT_ALIGNMENT as usize) {
            out.push(0);
        }
        out.extend(self.data);
        out
    }
    pub fn open(self) -> Result<GgufFile> {
        GgufFile::from_bytes("test.gguf".into(), self.build())
    }
}
