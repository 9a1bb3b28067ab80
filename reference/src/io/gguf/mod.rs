//! GGUF files (llama.cpp's format): reading, dequantising, and presenting a llama GGUF as a base
//! model with HF names and layout.
//!
//! - [`reader`]: [`GgufFile`]: header, metadata, tensor table, raw tensor bytes (v2 and v3).
//! - [`metadata`]: typed metadata getters (`get_str`, `get_u32`, ...).
//! - [`value`]: [`GgufValue`], the metadata value types.
//! - [`ggml_type`]: [`GgmlType`], the tensor types and their block geometry.
//! - [`dequant`]: f32 from F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K blocks,
//!   bit for bit as gguf-py.
//! - [`builder`]: GGUF bytes built key by key (tests, fuzz seeds).
//! - [`llama`]: [`config_from_gguf`] and [`GgufSource`] (HF names, q/k un-permuted).
//!
//! ```no_run
//! # fn main() -> reference::Result<()> {
//! use reference::io::gguf::{GgufFile, GgufSource, config_from_gguf};
//! let file = GgufFile::open(&reference::io::hub::require_smollm2()?)?;
//! let config = config_from_gguf(&file)?;
//! let weights = reference::base::weights::Weights::load(&config, &GgufSource::new(&file, &config))?;
//! # Ok(()) }
//! ```

pub mod builder;
pub mod dequant;
pub mod ggml_type;
pub mod llama;
pub mod metadata;
pub mod reader;
pub mod value;

pub use ggml_type::GgmlType;
pub use llama::{GgufSource, config_from_gguf, unpermute_rows};
pub use reader::{GgufFile, TensorInfo};
pub use value::{GgufValue, GgufValueType};
