//! M2R2 itself (docs/m2r2/): the fast residual stream with its accelerator adapters, the
//! ARLA exit gate and the other exit scores, the pruned draft head, the M2R2 config and weights
//! folders, the shipped trained weights, and the cost model.

pub mod accelerator;
pub mod arla;
pub mod bridge;
pub mod bridge_config;
pub mod config;
pub mod cost;
pub mod draft_head;
pub mod exit_gate;
pub mod exit_threshold;
pub mod fast_stream;
pub mod fast_stream_naive;
pub mod shipped;
pub mod weight_names;
pub mod weights;
