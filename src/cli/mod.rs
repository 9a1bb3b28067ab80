//! The command line: one file (or folder) per subcommand, and the modules they share. A command
//! imports only the shared modules, never another command (`tests/tests/layering.rs` checks it).

// Shared by the commands.
pub mod args;
pub mod common;
pub mod decode_speed;
pub mod moe_checks;
pub mod moe_report;
pub mod progress;
pub mod report;
pub mod step_times;

// The subcommands, as `m2r2 --help` lists them.
pub mod analyze;
pub mod bench;
pub mod demo;
pub mod distill_data;
pub mod distill_prompts;
pub mod draft_head;
pub mod export;
pub mod fetch;
pub mod generate;
pub mod golden;
pub mod info;
pub mod init_m2r2;
pub mod logits;
pub mod moe_sim;
pub mod run;
pub mod train;
pub mod train_arla;
pub mod tune_drafting;
