//! # m2r2 train
//!
//! Training of M2R2's accelerator adapters (and ARLA) on a frozen base model, on CPU, with every
//! backward pass written by hand and checked against finite differences (llm.c style).
//!
//! The slow stream is the frozen base model, so each fast row (position `t`, interval `j`) depends
//! only on detached slow quantities of its sample: `s_{e_j}[t]`, the slow K/V of interval `j`'s
//! layers at positions `< t`, and (for its teacher) `s_N[t]`. [`slow_stream`] computes them once
//! per sample; [`fast_stream`] runs an interval on a batch of such rows and back-propagates into
//! that interval's adapters only (no gradient crosses a gate).
//!
//! Dimension legend as in `reference`: `V` vocab, `D` hidden, `I` intermediate, `H` query heads,
//! `Hkv` key/value heads, `Dh` head dim, `R` fast rows in a batch, `S` visible cached positions,
//! `r` adapter rank.

pub mod adamw;
pub mod adapters;
pub mod align;
pub mod arla;
pub mod arla_trainer;
pub mod attention;
pub mod base_digest;
pub mod bridge;
pub mod checkpoint;
pub mod checkpoint_files;
pub mod checkpoint_validation;
pub mod data;
pub mod distill;
pub mod draft_head;
pub mod early_stop;
pub mod error;
pub mod fast_stream;
pub mod gemm;
pub mod grad_check;
pub mod head;
pub mod jsonl_log;
pub mod linear;
pub mod magpie;
pub mod real;
pub mod rmsnorm;
pub mod rope;
pub mod schedule;
pub mod ship;
pub mod slow_cache;
pub mod slow_stream;
pub mod swiglu;
#[cfg(test)]
mod test_util;
pub mod trainer;

pub use error::{Error, Result};
pub use real::Real;
