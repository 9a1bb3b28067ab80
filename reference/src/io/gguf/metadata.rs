//! Typed getters for GGUF metadata. A missing key or a value of the wrong type is an
//! [`Error::Format`] naming the file, the key and what was found.
//!
//! Integers are accepted from any GGUF integer type whose value fits the requested type (writers
//! differ: llama.cpp writes token ids as uint32, others as int32 or uint64). Floats are accepted
//! from float32 and float64.

use super::reader::GgufFile;
use super::value::GgufValue;
use crate::error::{Error, Result};

impl GgufFile {
    /// The raw value under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn require_key(&self, key: &str) -> Result<&GgufValue> {
        self.get(key)
            .ok_or_else(|| Error::format(self.label(), format!("metadata key `{key}` is missing")))
    }

    fn wrong_type(&self, key: &str, want: &str, found: &GgufValue) -> Error {
        Error::format(
            self.label(),
            format!(
                "metadata `{key}` should be {want}, found {} {found}",
                found.type_description()
            ),
        )
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require_key(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require_key(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool", v))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, want: &str) -> Result<T> {
        let v = self.require_key(key)?;
        v.as_integer()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| self.wrong_type(key, want, v))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "an integer in 0..=4294967295")
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "a non-negative integer")
    }

    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.get_int(key, "a non-negative integer")
    }

    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int(key, "an integer")
    }

    /// A float32 value (a float64 is rounded to f32).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_f64(key).map(|v| v as f32)
    }

    /// A float32 or float64 value, widened exactly to f64.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require_key(key)?;
        v.as_float()
            .ok_or_else(|| self.wrong_type(key, "a float", v))
    }

    /// The elements of the array under `key`.
    pub fn get_array(&self, key: &str) -> Result<&[GgufValue]> {
        let v = self.require_key(key)?;
        v.as_array()
            .ok_or_else(|| self.wrong_type(key, "an array", v))
    }

    /// An array of strings (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.require_key(key)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "an array of strings", v))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| self.wrong_type(key, "an array of strings", v))
            })
            .collect()
    }

    /// An array of integers (`tokenizer.ggml.token_type`), each fitting i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require_key(key)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "an array of integers", v))?;
        items
            .iter()
            .map(|item| {
                item.as_integer()
                    .and_then(|i| i64::try_from(i).ok())
                    .ok_or_else(|| self.wrong_type(key, "an array of integers", v))
            })
            .collect()
    }

    /// `Ok(None)` when the key is absent, else the getter's result (so a present value of the
    /// wrong type is still an error).
    pub fn optional<'a, T>(
        &'a self,
        key: &str,
        getter: impl FnOnce(&'a Self, &str) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.get(key).is_some() {
            getter(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::io::gguf::builder::Builder;

    #[test]
    fn getters_convert_and_name_the_key() {
        let f = Builder::default()
            .kv_str("s", "text")
            .kv_u32("n", 7)
            .kv_raw("neg", 5, &(-1i32).to_le_bytes())
            .kv_f32("x", 0.1)
            .kv_bool("b", true)
            .kv_str_array("toks", &["a", "b"])
            .kv_i32_array("types", &[1, 3])
            .open()
            .unwrap();
        assert_eq!(f.get_str("s").unwrap(), "text");
        assert_eq!(f.get_u32("n").unwrap(), 7);
        assert_eq!(f.get_usize("n").unwrap(), 7);
        assert_eq!(f.get_i64("neg").unwrap(), -1);
        assert_eq!(f.get_f32("x").unwrap(), 0.1f32);
        assert_eq!(f.get_f64("x").unwrap(), f64::from(0.1f32));
        assert!(f.get_bool("b").unwrap());
        assert_eq!(f.get_str_array("toks").unwrap(), vec!["a", "b"]);
        assert_eq!(f.get_i64_array("types").unwrap(), vec![1, 3]);
        assert_eq!(f.get_array("toks").unwrap().len(), 2);
        assert_eq!(
            f.optional("absent", crate::io::gguf::GgufFile::get_u32)
                .unwrap(),
            None
        );
        assert_eq!(
            f.optional("n", crate::io::gguf::GgufFile::get_u32).unwrap(),
            Some(7)
        );

        let cases = [
            (
                f.get_str("absent").unwrap_err(),
                "metadata key `absent` is missing",
            ),
            (
                f.get_u32("s").unwrap_err(),
                "metadata `s` should be an integer in 0..=4294967295, found string \"text\"",
            ),
            (
                f.get_u32("neg").unwrap_err(),
                "metadata `neg` should be an integer in 0..=4294967295, found int32 -1",
            ),
            (
                f.get_f32("n").unwrap_err(),
                "metadata `n` should be a float, found uint32 7",
            ),
            (
                f.get_str_array("types").unwrap_err(),
                "`types` should be an array of strings, found array of int32 [2 x int32]",
            ),
            (
                f.get_i64_array("toks").unwrap_err(),
                "`toks` should be an array of integers",
            ),
            (
                f.get_array("n").unwrap_err(),
                "`n` should be an array, found uint32 7",
            ),
            (
                f.optional("s", crate::io::gguf::GgufFile::get_bool)
                    .unwrap_err(),
                "`s` should be a bool",
            ),
        ];
        for (err, want) in cases {
            let msg = err.to_string();
            assert!(
                msg.starts_with("test.gguf: corrupt or unsupported file"),
                "{msg}"
            );
            assert!(msg.contains(want), "{msg:?} should contain {want:?}");
        }
    }
}
