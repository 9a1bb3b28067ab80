//! Mixtral checkpoints in transformers 5's fused expert layout ([`FusedMoe`]: `mlp.gate.weight`,
//! `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), read as the per-expert layout of
//! transformers 4 (`block_sparse_moe.gate.weight`, `block_sparse_moe.experts.{e}.w1/w3/w2.weight`).
//!
//! Each layer is in one layout or the other. The per-expert matrices of a fused layer are
//! consecutive row blocks of the fused tensors (row-major), so each is served as a byte range of
//! its fused tensor ([`Piece`]): the same values in the same order, no arithmetic.

use crate::base::config::ModelConfig;
use crate::base::weight_names::{FusedMoe, MlpProj, WeightId};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// A per-expert-layout tensor that lies in a fused tensor: piece `index` of the `count` equal,
/// consecutive pieces of the fused tensor's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The tensor it is read as.
    pub id: WeightId,
    /// The name of the fused tensor it lies in.
    pub fused: String,
    pub index: usize,
    pub count: usize,
}

/// Every [`Piece`] of the fused layers of a checkpoint, given its tensors' `names` (sorted), the
/// `shape` of each and the file each is in (`file_of`, for errors), after checking each such layer:
/// all three fused tensors there, with the shapes `config` calls for, and no tensor of the
/// per-expert layout beside them. Fused tensors of a layer past `num_hidden_layers`, or of a dense
/// config, are left alone (the loader refuses them as unused).
///
/// # Errors
/// [`Error::Format`] naming a tensor of each layout when a layer has both;
/// [`Error::MissingTensor`] naming the fused tensor missing; [`Error::ShapeMismatch`] naming a
/// fused tensor and both shapes.
pub fn pieces(
    config: &ModelConfig,
    names: &[String],
    shape: impl Fn(&str) -> Option<Vec<usize>>,
    file_of: impl Fn(&str) -> String,
) -> Result<Vec<Piece>> {
    let Some(moe) = &config.moe else {
        return Ok(Vec::new());
    };
    // the first tensor (by name) of each layer in each layout
    let mut fused: BTreeMap<usize, &String> = BTreeMap::new();
    let mut per_expert: HashMap<usize, &String> = HashMap::new();
    for name in names {
        if let Some((l, _)) = FusedMoe::parse(name) {
            fused.entry(l).or_insert(name);
        } else if let Some(l) = WeightId::per_expert_layer(name) {
            per_expert.entry(l).or_insert(name);
        }
    }
    let experts = moe.num_local_experts;
    let mut pieces = Vec::new();
    for (l, first) in fused.range(..config.num_hidden_layers) {
        if let Some(other) = per_expert.get(l) {
            return Err(Error::format(
                file_of(first),
                format!(
                    "layer {l} has its experts in two layouts, transformers 4's per-expert \
                     `{other}` and transformers 5's fused `{first}`: a layer has one or the other"
                ),
            ));
        }
        for t in FusedMoe::ALL {
            let name = t.hf_name(*l);
            let expected = t.shape(config);
            match shape(&name) {
                None => {
                    return Err(Error::MissingTensor {
                        file: file_of(&name),
                        tensor: name,
                    });
                }
                Some(actual) if actual != expected => {
                    return Err(Error::ShapeMismatch {
                        file: file_of(&name),
                        tensor: name,
                        expected,
                        actual,
                    });
                }
                Some(_) => {}
            }
        }
        let piece = |id: WeightId, t: FusedMoe, index: usize, count: usize| Piece {
            id,
            fused: t.hf_name(*l),
            index,
            count,
        };
        pieces.push(piece(WeightId::Router(*l), FusedMoe::Router, 0, 1));
        for e in 0..experts {
            let expert = |p: MlpProj| WeightId::Expert(*l, e, p);
            pieces.extend([
                piece(expert(MlpProj::Gate), FusedMoe::GateUp, 2 * e, 2 * experts),
                piece(
                    expert(MlpProj::Up),
                    FusedMoe::GateUp,
                    2 * e + 1,
                    2 * experts,
                ),
                piece(expert(MlpProj::Down), FusedMoe::Down, e, experts),
            ]);
        }
    }
    Ok(pieces)
}

/// Rewrite MoE layer `l` of `tensors` (HF name, shape, values) from the per-expert layout into
/// transformers 5's fused one, as `MixtralExperts` holds it: the router renamed, gate and up of
/// each expert stacked as `[w1; w3]`, the down projections stacked. For tests and fixtures; the
/// loader reads the result as the tensors it was made from.
///
/// # Errors
/// [`Error::MissingTensor`] naming a per-expert tensor of the layer that `tensors` lacks.
pub fn fuse_layer(
    tensors: &mut Vec<(String, Vec<usize>, Vec<f32>)>,
    l: usize,
    experts: usize,
) -> Result<()> {
    let mut take = |id: WeightId| {
        let name = id.hf_name();
        match tensors.iter().position(|t| t.0 == name) {
            Some(i) => Ok(tensors.remove(i)),
            None => Err(Error::MissingTensor {
                file: "the tensors to fuse".into(),
                tensor: name,
            }),
        }
    };
    let (_, router_shape, router) = take(WeightId::Router(l))?;
    let (mut gate_up, mut down, mut gate_shape) = (Vec::new(), Vec::new(), vec![0, 0]);
    for e in 0..experts {
        let (_, shape, gate) = take(WeightId::Expert(l, e, MlpProj::Gate))?;
        gate_up.extend(gate);
        gate_up.extend(take(WeightId::Expert(l, e, MlpProj::Up))?.2);
        down.extend(take(WeightId::Expert(l, e, MlpProj::Down))?.2);
        gate_shape = shape;
    }
    let [i, d] = gate_shape[..] else {
        return Err(Error::Invalid(format!(
            "layer {l}: the expert matrices have shape {gate_shape:?}, not [I, D]"
        )));
    };
    tensors.extend([
        (FusedMoe::Router.hf_name(l), router_shape, router),
        (
            FusedMoe::GateUp.hf_name(l),
            vec![experts, 2 * i, d],
            gate_up,
        ),
        (FusedMoe::Down.hf_name(l), vec![experts, d, i], down),
    ]);
    Ok(())
}
