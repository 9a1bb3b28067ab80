//! The ggml tensor types a GGUF file can name, with their block geometry.
//!
//! Every type stores its values in blocks: `block_size` values packed into `type_size` bytes (plain
//! types have blocks of one value). Ids follow `enum ggml_type` in ggml.h; ids that ggml retired
//! (4, 5, 31..=33, 36..=38) are unknown here, like any id we have never heard of.

use std::fmt;

/// A ggml tensor type, as numbered by `enum ggml_type` in ggml.h (variants spelled as ggml does).
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// `(type, id, name, block_size, type_size)`: the one table of ggml types.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// The type with ggml id `id`, or `None` for an id ggml does not (or no longer) define.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|row| row.0 == self)
            .expect("every GgmlType has a row in TABLE")
    }

    /// The ggml id (`enum ggml_type`).
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The name ggml and gguf-py print (`Q4_K`, `BF16`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &(ty, id, name, block, size) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty), "{name}");
            assert_eq!(
                (ty.id(), ty.name(), ty.block_size(), ty.type_size()),
                (id, name, block, size)
            );
            assert_eq!(TABLE.iter().filter(|row| row.1 == id).count(), 1, "{name}");
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }
}
