//! A small ONNX graph builder: nodes named after the module path they belong to
//! (`layers.3/attn/Softmax`), weights as initializers under their one name from
//! [`reference::base::weight_names`], small constants, graph inputs / outputs with dynamic dims, and the
//! final [`ModelProto`] with its opset import and `metadata_props`.
//!
//! Values are named after the node that produces them, so a value name tells where it comes from.
//! In the f16 flavour every weight is stored as an f16 initializer followed by one `Cast` to f32;
//! the emitters never see the difference ([`GraphBuilder::weight`] returns the f32 value). A weight
//! beyond f16's finite range is refused there ([`F16_MAX`]), and [`GraphBuilder::try_finish`]
//! returns the refusal in place of the graph.

use crate::error::{Error, Result};
use crate::proto::tensor_proto::DataType;
use crate::proto::tensor_shape_proto::{Dimension, dimension};
use crate::proto::type_proto;
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, attribute_proto::AttributeType,
};
use ndarray::ArrayViewD;
use std::collections::{HashMap, HashSet};

/// The opsets the emitters are written for (inclusive). 17 is the default: Shape with start/end
/// (15), Split / ReduceSum / Squeeze / Unsqueeze with their axes as inputs (13) and the rest are
/// all there; the ops used did not change meaning up to 21.
pub const MIN_OPSET: i64 = 17;
pub const MAX_OPSET: i64 = 21;
pub const DEFAULT_OPSET: i64 = 17;
/// The opset of static-cache graphs (`export --static-cache`): `RMSNormalization` and
/// `RotaryEmbedding` (23), `Attention` and `TensorScatter` (24).
pub const STATIC_OPSET: i64 = 24;

/// The IR version that goes with an opset (onnx's VERSION_TABLE): at most 12, below the 13 that
/// ONNX Runtime 1.31 reads (it refuses 14, what onnx 1.23's `make_model` writes by default).
pub fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=18 => 8,
        19 | 20 => 9,
        21 | 22 => 10,
        23 => 11,
        _ => 12,
    }
}

/// Refuse opsets the emitters are not written for.
pub fn check_opset(opset: i64) -> Result<()> {
    if opset < MIN_OPSET {
        return Err(Error::Opset {
            opset,
            min: MIN_OPSET,
            max: MAX_OPSET,
            why: "17 is the oldest opset the exporter is written and checked for",
            fix: "pass --opset 17 (the default) up to 21",
        });
    }
    if opset > MAX_OPSET {
        return Err(Error::Opset {
            opset,
            min: MIN_OPSET,
            max: MAX_OPSET,
            why: "newer opsets are untested with the TensorRT / ORT versions targeted",
            fix: "pass --opset 17 (the default) up to 21; opset 24 comes with --static-cache \
                  L_MAX (a static KV cache, always opset 24) in place of --opset",
        });
    }
    Ok(())
}

/// The largest finite f16 value: f16 stores anything of larger magnitude as inf, so an f16 export
/// refuses a weight beyond it.
pub const F16_MAX: f32 = 65504.0;

/// How weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsDtype {
    F32,
    F16,
}

impl WeightsDtype {
    pub fn name(self) -> &'static str {
        match self {
            WeightsDtype::F32 => "f32",
            WeightsDtype::F16 => "f16",
        }
    }
}

impl std::str::FromStr for WeightsDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(WeightsDtype::F32),
            "f16" => Ok(WeightsDtype::F16),
            _ => Err(Error::Invalid(format!(
                "unknown weights dtype `{s}`: expected f32 or f16"
            ))),
        }
    }
}

/// One axis of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(usize),
    /// A dynamic axis, named (`batch`, `sequence_length`, ...).
    Named(&'static str),
}

/// Element types used at the graph boundary and in constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    I64,
    Bool,
}

impl Elem {
    fn data_type(self) -> i32 {
        match self {
            Elem::F32 => DataType::Float as i32,
            Elem::I64 => DataType::Int64 as i32,
            Elem::Bool => DataType::Bool as i32,
        }
    }
}

/// An attribute of a node.
pub enum Attr {
    Int(i64),
    /// A string attribute (`TensorScatter`'s `mode`).
    Str(&'static str),
    Ints(Vec<i64>),
    Float(f32),
    /// A tensor attribute (`ConstantOfShape` value): one f32.
    F32Tensor(f32),
}

/// Builds one graph.
pub struct GraphBuilder {
    pub opset: i64,
    pub weights_dtype: WeightsDtype,
    graph: GraphProto,
    scope: Vec<String>,
    node_names: HashSet<String>,
    /// initializer name -> the f32 value emitters use (the Cast output in the f16 flavour)
    weights: HashMap<String, String>,
    /// value -> its transposed value (`Transpose` of a weight matrix, emitted once)
    transposed: HashMap<String, String>,
    constants: HashSet<String>,
    /// `(value, output name)` of every declared output, folded into the graph by `finish`.
    outputs: Vec<(String, String)>,
    /// The first weight the f16 flavour could not store ([`f16_bytes`]), returned by
    /// [`try_finish`](Self::try_finish): [`weight`](Self::weight) cannot fail without every
    /// emitter doing so.
    refused: Option<Error>,
}

impl GraphBuilder {
    pub fn new(name: &str, opset: i64, weights_dtype: WeightsDtype) -> Self {
        GraphBuilder {
            opset,
            weights_dtype,
            graph: GraphProto {
                name: Some(name.into()),
                ..Default::default()
            },
            scope: Vec::new(),
            node_names: HashSet::new(),
            weights: HashMap::new(),
            transposed: HashMap::new(),
            constants: HashSet::new(),
            outputs: Vec::new(),
            refused: None,
        }
    }

    /// Run `f` with `name` appended to the module path of the nodes it emits.
    pub fn scoped<R>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        self.scope.push(name.to_string());
        let r = f(self);
        self.scope.pop();
        r
    }

    /// A unique node name `scope/label` (`_1`, `_2`, ... appended on repeats).
    fn node_name(&mut self, label: &str) -> String {
        let base = if self.scope.is_empty() {
            label.to_string()
        } else {
            format!("{}/{label}", self.scope.join("/"))
        };
        let mut name = base.clone();
        let mut i = 0;
        while self.node_names.contains(&name) {
            i += 1;
            name = format!("{base}_{i}");
        }
        self.node_names.insert(name.clone());
        name
    }

    /// Emit a node with `outputs` outputs, labelled by its op type; returns the output values.
    pub fn node_n(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<(&str, Attr)>,
    ) -> Vec<String> {
        self.labelled_n(op, op, inputs, outputs, attrs)
    }

    /// [`node_n`](Self::node_n) with a label other than the op type (`q_proj/MatMul`).
    pub fn labelled_n(
        &mut self,
        label: &str,
        op: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<(&str, Attr)>,
    ) -> Vec<String> {
        let name = self.node_name(label);
        let outs: Vec<String> = if outputs == 1 {
            vec![name.clone()]
        } else {
            (0..outputs).map(|i| format!("{name}:{i}")).collect()
        };
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.clone(),
            name: Some(name),
            op_type: Some(op.into()),
            attribute: attrs.into_iter().map(|(n, a)| attribute(n, a)).collect(),
            ..Default::default()
        });
        outs
    }

    /// A one-output node.
    pub fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<(&str, Attr)>) -> String {
        self.node_n(op, inputs, 1, attrs).remove(0)
    }

    /// A one-output node with a label.
    pub fn labelled(
        &mut self,
        label: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<(&str, Attr)>,
    ) -> String {
        self.labelled_n(label, op, inputs, 1, attrs).remove(0)
    }

    /// `op(a, b)` for a binary elementwise or matrix op.
    pub fn binary(&mut self, op: &str, a: &str, b: &str) -> String {
        self.node(op, &[a, b], vec![])
    }

    /// `op(a)` for a unary op.
    pub fn unary(&mut self, op: &str, a: &str) -> String {
        self.node(op, &[a], vec![])
    }

    /// An int64 constant tensor of shape `[values.len()]`.
    pub fn const_i64(&mut self, values: &[i64]) -> String {
        let joined: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let name = format!("const/i64[{}]", joined.join(","));
        self.constant(&name, vec![values.len() as i64], DataType::Int64, || {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        })
    }

    /// An int64 scalar constant.
    pub fn scalar_i64(&mut self, value: i64) -> String {
        let name = format!("const/i64({value})");
        self.constant(&name, vec![], DataType::Int64, || {
            value.to_le_bytes().to_vec()
        })
    }

    /// An f32 scalar constant.
    pub fn scalar_f32(&mut self, value: f32) -> String {
        let name = format!("const/f32({value:e})");
        self.constant(&name, vec![], DataType::Float, || {
            value.to_le_bytes().to_vec()
        })
    }

    /// An f32 constant vector (always f32, whatever the weights dtype: computed tables such as RoPE's
    /// inverse frequencies).
    pub fn const_f32(&mut self, name: &str, values: &[f32]) -> String {
        self.constant(name, vec![values.len() as i64], DataType::Float, || {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        })
    }

    /// An f32 constant matrix `[rows, cols]` from row-major `values` (always f32).
    pub fn const_f32_matrix(&mut self, name: &str, rows: usize, values: &[f32]) -> String {
        assert_eq!(
            values.len() % rows,
            0,
            "{name}: {} values in {rows} rows",
            values.len()
        );
        let dims = vec![rows as i64, (values.len() / rows) as i64];
        self.constant(name, dims, DataType::Float, || {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        })
    }

    fn constant(
        &mut self,
        name: &str,
        dims: Vec<i64>,
        dtype: DataType,
        bytes: impl FnOnce() -> Vec<u8>,
    ) -> String {
        if self.constants.insert(name.to_string()) {
            self.graph.initializer.push(TensorProto {
                name: Some(name.into()),
                dims,
                data_type: Some(dtype as i32),
                raw_data: Some(bytes()),
                ..Default::default()
            });
        }
        name.to_string()
    }

    /// The weight `name` (emitted once, whatever the number of uses) as an f32 value: the initializer
    /// itself, or in the f16 flavour the output of its `Cast`. Every f16 initializer is converted
    /// here; one f16 cannot hold is left empty and refused by [`try_finish`](Self::try_finish).
    pub fn weight(&mut self, name: &str, data: ArrayViewD<f32>) -> String {
        if let Some(v) = self.weights.get(name) {
            return v.clone();
        }
        let dims = data.shape().iter().map(|&d| d as i64).collect();
        let (data_type, raw) = match self.weights_dtype {
            WeightsDtype::F32 => (
                DataType::Float,
                data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            WeightsDtype::F16 => (
                DataType::Float16,
                f16_bytes(name, &data).unwrap_or_else(|e| {
                    self.refused.get_or_insert(e);
                    Vec::new()
                }),
            ),
        };
        self.graph.initializer.push(TensorProto {
            name: Some(name.into()),
            dims,
            data_type: Some(data_type as i32),
            raw_data: Some(raw),
            ..Default::default()
        });
        let value = match self.weights_dtype {
            WeightsDtype::F32 => name.to_string(),
            WeightsDtype::F16 => {
                let cast = self.scoped("weights", |b| b.scoped(name, |b| b.node_name("Cast")));
                self.graph.node.push(NodeProto {
                    input: vec![name.into()],
                    output: vec![cast.clone()],
                    name: Some(cast.clone()),
                    op_type: Some("Cast".into()),
                    attribute: vec![attribute("to", Attr::Int(DataType::Float as i64))],
                    ..Default::default()
                });
                cast
            }
        };
        self.weights.insert(name.into(), value.clone());
        value
    }

    /// `W^T` of a weight value (`[out, in]` -> `[in, out]`), one `Transpose` per weight; ONNX
    /// Runtime and TensorRT fold it into a constant at load time.
    pub fn transposed(&mut self, value: &str) -> String {
        if let Some(t) = self.transposed.get(value) {
            return t.clone();
        }
        let t = self.scoped("weights", |b| {
            b.scoped(value, |b| {
                b.node(
                    "Transpose",
                    &[value],
                    vec![("perm", Attr::Ints(vec![1, 0]))],
                )
            })
        });
        self.transposed.insert(value.into(), t.clone());
        t
    }

    /// Declare a graph input.
    pub fn input(&mut self, name: &str, elem: Elem, dims: &[Dim]) -> String {
        self.graph.input.push(value_info(name, elem, dims));
        name.to_string()
    }

    /// Declare graph output `name` holding `value`. `finish` renames the value itself to `name`
    /// where it can (no node), else adds an `Identity`.
    pub fn output(&mut self, name: &str, value: &str, elem: Elem, dims: &[Dim]) {
        self.outputs.push((value.to_string(), name.to_string()));
        self.graph.output.push(value_info(name, elem, dims));
    }

    /// Give each output's value the output's name, in every node that produces or reads it. An
    /// `Identity` per output would be one more kernel per output and run (on a GPU also a copy of
    /// a KV layer where the output has its own bound buffer), so it is kept only where renaming
    /// cannot work: the value is a graph input or an initializer, already another output, or a
    /// second output of one value.
    fn fold_outputs(&mut self) {
        let mut fixed: HashSet<String> = self
            .graph
            .input
            .iter()
            .filter_map(|v| v.name.clone())
            .collect();
        fixed.extend(self.graph.initializer.iter().filter_map(|t| t.name.clone()));
        fixed.extend(self.outputs.iter().map(|(_, name)| name.clone()));
        let mut renamed: HashMap<String, String> = HashMap::new();
        for (value, name) in std::mem::take(&mut self.outputs) {
            if value == name {
                continue;
            }
            let source = renamed.get(&value).cloned();
            if source.is_none() && !fixed.contains(&value) {
                for node in &mut self.graph.node {
                    for v in node.input.iter_mut().chain(node.output.iter_mut()) {
                        if *v == value {
                            v.clone_from(&name);
                        }
                    }
                }
                renamed.insert(value, name);
                continue;
            }
            let node = self.scoped("outputs", |b| b.node_name(&name));
            self.graph.node.push(NodeProto {
                input: vec![source.unwrap_or(value)],
                output: vec![name],
                name: Some(node),
                op_type: Some("Identity".into()),
                ..Default::default()
            });
        }
    }

    /// The finished model with `metadata_props` (in the given order), or the first weight the f16
    /// flavour refused (`f16_bytes`). Exports build through this.
    pub fn try_finish(mut self, metadata: &[(String, String)]) -> Result<ModelProto> {
        match self.refused.take() {
            Some(refused) => Err(refused),
            None => Ok(self.finish(metadata)),
        }
    }

    /// The finished model with `metadata_props` (in the given order), for graphs of single
    /// modules in tests; a weight the f16 flavour refused stays an empty initializer, which no
    /// runtime loads ([`try_finish`](Self::try_finish) says why instead).
    pub fn finish(mut self, metadata: &[(String, String)]) -> ModelProto {
        self.fold_outputs();
        ModelProto {
            ir_version: Some(ir_version(self.opset)),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            producer_name: Some("m2r2-export".into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            graph: Some(self.graph),
            metadata_props: metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: Some(k.clone()),
                    value: Some(v.clone()),
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// `data` as little-endian f16 bytes, or the refusal of a weight with a value beyond [`F16_MAX`]:
/// f16 would store it as inf, and every output that reads it would turn inf or NaN (an f32 export
/// holds it). NaN is stored as NaN, as an f32 export would.
fn f16_bytes(name: &str, data: &ArrayViewD<f32>) -> Result<Vec<u8>> {
    if data.iter().any(|v| v.abs() > F16_MAX) {
        let largest = data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        return Err(Error::F16Range {
            name: name.into(),
            largest,
        });
    }
    Ok(data
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect())
}

fn attribute(name: &str, attr: Attr) -> AttributeProto {
    let mut a = AttributeProto {
        name: Some(name.into()),
        ..Default::default()
    };
    match attr {
        Attr::Int(i) => {
            a.i = Some(i);
            a.r#type = Some(AttributeType::Int as i32);
        }
        Attr::Str(v) => {
            a.s = Some(v.as_bytes().to_vec());
            a.r#type = Some(AttributeType::String as i32);
        }
        Attr::Ints(v) => {
            a.ints = v;
            a.r#type = Some(AttributeType::Ints as i32);
        }
        Attr::Float(f) => {
            a.f = Some(f);
            a.r#type = Some(AttributeType::Float as i32);
        }
        Attr::F32Tensor(f) => {
            a.t = Some(TensorProto {
                dims: vec![1],
                data_type: Some(DataType::Float as i32),
                raw_data: Some(f.to_le_bytes().to_vec()),
                ..Default::default()
            });
            a.r#type = Some(AttributeType::Tensor as i32);
        }
    }
    a
}

fn value_info(name: &str, elem: Elem, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => dimension::Value::DimValue(*n as i64),
                Dim::Named(s) => dimension::Value::DimParam(s.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem.data_type()),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tensor_proto::DataType;

    #[test]
    fn node_names_carry_the_scope_and_stay_unique() {
        let mut b = GraphBuilder::new("g", 17, WeightsDtype::F32);
        let (x1, x2) = b.scoped("layers.3", |b| {
            b.scoped("attn", |b| {
                (b.unary("Softmax", "x"), b.unary("Softmax", "x"))
            })
        });
        assert_eq!(x1, "layers.3/attn/Softmax");
        assert_eq!(x2, "layers.3/attn/Softmax_1");
        let outs = b.node_n("Split", &["x"], 2, vec![]);
        assert_eq!(outs, vec!["Split:0", "Split:1"]);
    }

    #[test]
    fn weights_are_emitted_once_and_cast_in_the_f16_flavour() {
        let w = ndarray::arr1(&[1.0f32, 0.1, -2.0]).into_dyn();
        let mut b = GraphBuilder::new("g", 17, WeightsDtype::F16);
        let v1 = b.weight("w", w.view());
        let v2 = b.weight("w", w.view());
        assert_eq!(v1, v2);
        assert_eq!(v1, "weights/w/Cast");
        let model = b.finish(&[("k".into(), "v".into())]);
        let g = model.graph.unwrap();
        assert_eq!(g.initializer.len(), 1);
        let t = &g.initializer[0];
        assert_eq!(t.data_type, Some(DataType::Float16 as i32));
        let raw = t.raw_data.as_ref().unwrap();
        // 0.1 rounds to the f16 0x2E66 (little-endian bytes)
        assert_eq!(&raw[2..4], &[0x66, 0x2E]);
        assert_eq!(g.node.len(), 1);
        assert_eq!(g.node[0].op_type.as_deref(), Some("Cast"));
        assert_eq!(model.metadata_props[0].key.as_deref(), Some("k"));
        assert_eq!(model.ir_version, Some(8));
    }

    #[test]
    fn an_f16_weight_beyond_the_f16_range_is_refused_by_name() {
        let fits = ndarray::arr1(&[F16_MAX, -F16_MAX]).into_dyn();
        let beyond = ndarray::arr1(&[1.0f32, 99840.0, -1.5e5, 2.0]).into_dyn();
        let mut b = GraphBuilder::new("g", 17, WeightsDtype::F16);
        b.weight("model.norm.weight", fits.view());
        b.weight("lm_head.weight", beyond.view());
        let msg = b.try_finish(&[]).unwrap_err().to_string();
        for needle in ["`lm_head.weight`", "150000", "65504", "--weights-dtype f32"] {
            assert!(msg.contains(needle), "{needle:?} not in: {msg}");
        }
        // f32 holds it, and f16 holds everything up to its largest finite value
        let mut b = GraphBuilder::new("g", 17, WeightsDtype::F32);
        b.weight("lm_head.weight", beyond.view());
        b.try_finish(&[]).unwrap();
        let mut b = GraphBuilder::new("g", 17, WeightsDtype::F16);
        b.weight("model.norm.weight", fits.view());
        b.try_finish(&[]).unwrap();
    }

    #[test]
    fn opset_range_and_ir_versions() {
        assert!(
            check_opset(16)
                .unwrap_err()
                .to_string()
                .contains("opset 16")
        );
        assert!(check_opset(22).is_err());
        for opset in MIN_OPSET..=MAX_OPSET {
            check_opset(opset).unwrap();
        }
        assert_eq!((ir_version(17), ir_version(19), ir_version(21)), (8, 9, 10));
        assert_eq!(ir_version(STATIC_OPSET), 12);
    }
}
