//! `m2r2 moe-sim`: ahead-of-time MoE expert loading (docs/MOE_AOT.md): trace the experts of a
//! greedy decode with the fast stream alongside, then simulate a device expert cache for each
//! prediction policy (`moe_report`, docs/MOE_AOT.md).

use crate::cli::args::moe_sim::MoeSimArgs;
use crate::cli::{common, moe_report};
use anyhow::Result;

pub type Args = MoeSimArgs;

pub fn run(args: &Args) -> Result<()> {
    moe_report::check_numbers(args)?;
    let loaded = common::load(&args.model)?;
    moe_report::run_loaded(args, &loaded)
}
