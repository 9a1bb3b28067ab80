//! GGUF metadata values: the thirteen value types of the GGUF spec, arrays included.

use std::fmt;

/// The type tag of a metadata value (`gguf_metadata_value_type` in the GGUF spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    /// The type with tag `id`, or `None` for a tag the spec does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The spec's name of the type (`uint32`, `string`, ...), for messages.
    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            U32 => "uint32",
            I32 => "int32",
            F32 => "float32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "uint64",
            I64 => "int64",
            F64 => "float64",
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value. An array keeps its element type, so an empty array still says what it holds.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// `(element type, elements)`; every element has the element type.
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// A description of the type for messages: `uint32`, `array of string`, ...
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(elem, _) => format!("array of {elem}"),
            other => other.value_type().name().to_string(),
        }
    }

    /// Any integer value as `i128` (every GGUF integer type fits), `None` for other types.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A `float32` or `float64` value as `f64` (exact), `None` for other types.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

impl fmt::Display for GgufValue {
    /// Scalars as themselves, strings quoted, arrays as `[n x type]` (they can hold 100k tokens).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::String(s) => write!(f, "{s:?}"),
            GgufValue::Array(elem, items) => write!(f, "[{} x {elem}]", items.len()),
            GgufValue::Bool(b) => write!(f, "{b}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
            other => write!(
                f,
                "{}",
                other.as_integer().expect("remaining variants are integers")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_and_descriptions() {
        assert_eq!(GgufValue::U32(7).as_integer(), Some(7));
        assert_eq!(GgufValue::I64(-3).as_integer(), Some(-3));
        assert_eq!(GgufValue::F32(0.5).as_integer(), None);
        assert_eq!(GgufValue::F32(1e-5).as_float(), Some(f64::from(1e-5f32)));
        assert_eq!(GgufValue::String("a".into()).as_str(), Some("a"));
        let arr = GgufValue::Array(GgufValueType::String, vec![GgufValue::String("x".into())]);
        assert_eq!(arr.type_description(), "array of string");
        assert_eq!(arr.to_string(), "[1 x string]");
        assert_eq!(arr.as_array().map(<[GgufValue]>::len), Some(1));
        for id in 0..13 {
            assert_eq!(GgufValueType::from_id(id).map(|t| t as u32), Some(id));
        }
        assert_eq!(GgufValueType::from_id(13), None);
    }
}
