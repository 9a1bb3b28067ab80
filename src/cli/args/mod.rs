//! The flags that several commands share, as clap structs, and their parsers. Nothing here runs
//! a command: commands flatten these into their own `Args`, so no command imports another.

pub mod bench;
pub mod m2r2;
pub mod model;
pub mod moe_sim;
pub mod onnx;
pub mod sampling;
pub mod trained;
pub mod tree;
