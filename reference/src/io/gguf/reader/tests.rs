//! Tests of the GGUF reader (`io/gguf/reader.rs`).

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
    assert!(err_of(long_array).contains("metadata `k` has 4194305 items, more than the 4194304"));
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
        err_of(ragged).contains("rows of 33 values, not a multiple of the 32-value blocks of Q8_0")
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

/// Overwrite the data offset in the tensor info of `name` (a name found nowhere else in the file).
fn set_offset(bytes: &mut [u8], name: &str, offset: u64) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let pos = at + 4 + 8 * n_dims + 4;
    bytes[pos..pos + 8].copy_from_slice(&offset.to_le_bytes());
}

/// Tensors must lie back to back in the order of the tensor table, as llama.cpp requires: data
/// offsets that overlap another tensor's bytes, or that swap two tensors, lie inside the file and
/// would load and run on the wrong weights. Three 32-byte tensors sit at 0, 32 and 64.
#[test]
fn overlapping_or_reordered_tensor_data_is_refused() {
    let three = || {
        Builder::default()
            .tensor_f32("first", &[8], &[1.0; 8])
            .tensor_f32("second", &[8], &[2.0; 8])
            .tensor_f32("third", &[8], &[3.0; 8])
            .build()
    };
    let f = GgufFile::from_bytes("good.gguf".into(), three()).unwrap();
    let offsets: Vec<u64> = f.tensor_infos().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 32, 64]);

    let mut overlap = three();
    set_offset(&mut overlap, "second", 0); // reads `first`'s bytes
    let err = err_of(overlap);
    assert!(
        err.contains("tensor `second` is at data offset 0, expected 32"),
        "{err}"
    );
    let mut swapped = three();
    set_offset(&mut swapped, "first", 32);
    set_offset(&mut swapped, "second", 0);
    let err = err_of(swapped);
    assert!(
        err.contains("tensor `first` is at data offset 32, expected 0"),
        "{err}"
    );
    assert!(
        err.starts_with("bad.gguf: corrupt or unsupported file"),
        "{err}"
    );
    // a gap is refused too, before the bytes it would need are looked for
    let mut gap = three();
    set_offset(&mut gap, "third", 96);
    let err = err_of(gap);
    assert!(
        err.contains("tensor `third` is at data offset 96, expected 64"),
        "{err}"
    );
}
