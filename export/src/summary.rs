//! Per-graph statistics for the export summary table: nodes, op histogram, parameters, bytes,
//! inputs and outputs.

use crate::graphs::GraphKind;
use crate::proto::ModelProto;
use crate::proto::tensor_proto::DataType;
use std::collections::BTreeMap;

#[derive(Clone, Debug, serde::Serialize)]
pub struct GraphSummary {
    pub graph: &'static str,
    pub file: String,
    pub nodes: usize,
    /// op type -> count
    pub ops: BTreeMap<String, usize>,
    /// Elements of the weight initializers (constants such as shapes and RoPE frequencies excluded).
    pub parameters: u64,
    /// Bytes on disk (`.onnx` plus external data).
    pub bytes: u64,
    pub external_data: Option<String>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// True for initializers that are computed constants rather than model weights.
pub fn is_constant(name: &str) -> bool {
    name.starts_with("const/") || name.starts_with("rope/")
}

/// Statistics of a built graph (`bytes` is filled in once it is written).
pub fn summarize(kind: GraphKind, model: &ModelProto) -> GraphSummary {
    let graph = model.graph.as_ref().expect("built models have a graph");
    let mut ops = BTreeMap::new();
    for n in &graph.node {
        *ops.entry(n.op_type.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    let parameters = graph
        .initializer
        .iter()
        .filter(|t| !is_constant(t.name.as_deref().unwrap_or("")))
        .filter(|t| {
            matches!(
                DataType::try_from(t.data_type.unwrap_or(0)),
                Ok(DataType::Float | DataType::Float16)
            )
        })
        .map(|t| t.dims.iter().product::<i64>() as u64)
        .sum();
    let names = |v: &[crate::proto::ValueInfoProto]| {
        v.iter()
            .map(|x| x.name.clone().unwrap_or_default())
            .collect()
    };
    GraphSummary {
        graph: kind.name(),
        file: kind.file_name(),
        nodes: graph.node.len(),
        ops,
        parameters,
        bytes: 0,
        external_data: None,
        inputs: names(&graph.input),
        outputs: names(&graph.output),
    }
}

impl GraphSummary {
    /// The op histogram as `MatMul 120, Add 90, ...`, most frequent first.
    pub fn op_histogram(&self) -> String {
        let mut ops: Vec<(&String, &usize)> = self.ops.iter().collect();
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        ops.iter()
            .map(|(op, n)| format!("{op} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
