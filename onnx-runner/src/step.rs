//! The int64 inputs every graph takes for a chunk of `T` rows after `past` cached positions, and
//! the checks the reference makes before feeding tokens.
//!
//! # Shapes
//! - `input_ids`, `position_ids`: `[1, T]`; `attention_mask`: `[1, past + T]` (all ones: one
//!   sequence, no padding).

use crate::error::Result;
use crate::session::Input;
use ndarray::Array2;
use reference::{Error as RefError, ModelConfig};

pub struct StepInputs {
    pub input_ids: Array2<i64>,
    pub position_ids: Array2<i64>,
    pub attention_mask: Array2<i64>,
}

impl StepInputs {
    /// Inputs for `tokens` at positions `past..past + T` (ids are not used by verifier.onnx).
    pub fn new(tokens: &[u32], past: usize) -> Self {
        let t = tokens.len();
        StepInputs {
            input_ids: Array2::from_shape_fn((1, t), |(_, i)| i64::from(tokens[i])),
            position_ids: Array2::from_shape_fn((1, t), |(_, i)| (past + i) as i64),
            attention_mask: Array2::ones((1, past + t)),
        }
    }

    /// `T` rows without token ids (the verifier's chunk).
    pub fn rows(rows: usize, past: usize) -> Self {
        StepInputs::new(&vec![0; rows], past)
    }

    /// The named inputs of a graph that takes token ids (model.onnx, draft.onnx).
    pub fn with_ids(&self) -> [(&'static str, Input<'_>); 3] {
        [
            ("input_ids", Input::I64(self.input_ids.view().into_dyn())),
            (
                "attention_mask",
                Input::I64(self.attention_mask.view().into_dyn()),
            ),
            (
                "position_ids",
                Input::I64(self.position_ids.view().into_dyn()),
            ),
        ]
    }
}

/// Refuse token ids outside the vocabulary and positions past the context, as
/// [`reference::Model::check_input`] does (same errors).
pub fn check_tokens(config: &ModelConfig, tokens: &[u32], past: usize) -> Result<()> {
    if let Some(position) = tokens.iter().position(|&t| t as usize >= config.vocab_size) {
        return Err(RefError::TokenOutOfRange {
            id: tokens[position],
            position: past + position,
            vocab_size: config.vocab_size,
        }
        .into());
    }
    let needed = past + tokens.len();
    if needed > config.max_position_embeddings {
        return Err(RefError::ContextOverflow {
            needed,
            capacity: config.max_position_embeddings,
        }
        .into());
    }
    Ok(())
}
