//! Residual dynamics: the paper's motivation measured on a model (what `m2r2 analyze` prints).
//!
//! M2R2's premise is that the slow residual stream changes direction slowly in its late layers, so
//! the final residual `s_N` can be predicted from an intermediate one by a stream that moves faster
//! (docs/m2r2/streams.md). For every position of a teacher-forced sequence, and per layer
//! `l = 1..=N`:
//!
//! ```text
//! cos_prev(l)       = cos(s_{l-1}, s_l)                         directional change per layer
//! cos_final(l)      = cos(s_l, s_N)                             alignment with the final residual
//! cos_final_normed(l) = cos(FinalNorm(s_l), FinalNorm(s_N))     the same, as the LM head sees it
//! exit_agreement(l) = [argmax LMHead(FinalNorm(s_l)) == argmax LMHead(FinalNorm(s_N))]
//! ```
//!
//! and per gate `g` the same for the fast exit state `u_g` next to the slow residual `s_{e_g}` at the
//! gate's layer, so the adapters' gain is visible (with zero adapters `u_g == s_{e_g}`). Cosines are
//! summarised over positions as mean / min / max, agreements as a fraction of positions.
//!
//! With the `linalg` feature, `pca_2d` (`pca.rs`) projects a residual trajectory `s_0..s_N` (and the fast
//! exit states) onto its top two principal components.
//!
//! Dimension legend as in the crate root; `P` points of a trajectory (`N + 1`), `J` gates.

mod dynamics;
#[cfg(feature = "linalg")]
mod pca;

pub use dynamics::{Dynamics, GateRow, LayerRow, Stats, cosine, exit_tokens, residual_dynamics};
#[cfg(feature = "linalg")]
pub use pca::{Pca2d, pca_2d};
