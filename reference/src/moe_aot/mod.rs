//! Ahead-of-time MoE expert loading (docs/MOE_AOT.md): expert prediction on a traced decode, a
//! memory simulator of a device expert cache fed over a host link, and sweeps.

pub mod expert_prefetch;
pub mod memory_sim;
pub mod sweep;
