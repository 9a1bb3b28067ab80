//! The subcommands, one per file, and what they share.

pub mod bench;
pub mod common;
pub mod demo;
pub mod fetch;
pub mod generate;
pub mod golden;
pub mod info;
pub mod logits;
pub mod progress;
