//! The decoding modes on top of the base model and M2R2 (docs/m2r2/early_exit.md, speculative.md):
//! early exit and lossless self-speculative decoding, with the reference's speculative backend.

pub mod bridge_state;
pub mod draft_sim;
pub mod draft_verify;
pub mod drafting;
pub mod early_exit;
pub mod early_exit_naive;
pub mod mode;
pub mod prompt_lookup;
pub mod speculative;
pub mod speculative_naive;
pub mod timed;
pub mod tree_backend;
pub mod tree_draft_verify;
#[cfg(test)]
mod tree_dynamic_tests;
pub mod tree_round;
pub mod tree_sampling;
pub mod tree_speculation;
