//! What a graph's inputs and outputs are: name, element type and dimensions, as ONNX Runtime
//! describes them (shared by the sessions and the execution-provider checks).

use ort::value::{TensorElementType, ValueType};

/// Element type of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I64,
    /// Anything else, as ONNX Runtime names it.
    Other(String),
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::I64 => f.write_str("i64"),
            DType::Other(name) => f.write_str(name),
        }
    }
}

/// One dimension of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A dynamic dimension (`batch`, `sequence_length`, ...; empty when the graph names none).
    Symbolic(String),
}

/// `256`, or the dimension's name (`?` when the graph names none).
impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Symbolic(s) if s.is_empty() => f.write_str("?"),
            Dim::Symbolic(s) => f.write_str(s),
        }
    }
}

/// Name, element type and dimensions of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub dims: Vec<Dim>,
}

impl TensorInfo {
    /// `f32 [batch, 2, past_sequence_length, 8]`
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(Dim::to_string).collect();
        format!("{} [{}]", self.dtype, dims.join(", "))
    }

    pub(crate) fn from_outlet(outlet: &ort::value::Outlet) -> Self {
        let (dtype, dims) = match outlet.dtype() {
            ValueType::Tensor {
                ty,
                shape,
                dimension_symbols,
            } => {
                let dtype = match ty {
                    TensorElementType::Float32 => DType::F32,
                    TensorElementType::Int64 => DType::I64,
                    other => DType::Other(format!("{other:?}")),
                };
                let dims = shape
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| match usize::try_from(n) {
                        Ok(n) => Dim::Fixed(n),
                        Err(_) => {
                            Dim::Symbolic(dimension_symbols.get(i).cloned().unwrap_or_default())
                        }
                    })
                    .collect();
                (dtype, dims)
            }
            other => (DType::Other(format!("{other}")), Vec::new()),
        };
        TensorInfo {
            name: outlet.name().to_string(),
            dtype,
            dims,
        }
    }
}
