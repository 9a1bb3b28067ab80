//! The subcommands, one per file, and what they share.

pub mod analyze;
pub mod bench;
pub mod bench_onnx;
pub mod common;
pub mod cost_shape;
pub mod decode_speed;
pub mod demo;
pub mod demo_onnx;
pub mod distill_data;
pub mod draft_head;
pub mod export;
pub mod fetch;
pub mod generate;
pub mod golden;
pub mod info;
pub mod init_m2r2;
pub mod logits;
pub mod m2r2_args;
pub mod moe_sim;
pub mod progress;
pub mod run;
pub mod train;
pub mod train_arla;
