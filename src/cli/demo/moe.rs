//! The demo's MoE section: ahead-of-time expert loading (`m2r2 moe-sim`) on the demo's prompt.

use super::{Demo, NEW_TOKENS};
use crate::cli::args::moe_sim::MoeSimArgs;
use crate::cli::moe_report;
use anyhow::Result;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use reference::moe_aot::expert_prefetch::collect_trace;

/// Ahead-of-time expert loading (`m2r2 moe-sim`, docs/MOE_AOT.md) on the demo's prompt, for MoE
/// models; dense models say where to see it.
pub(super) fn moe_prefetch(demo: &mut Demo) -> Result<()> {
    let loaded = &demo.loaded;
    if loaded.model.config.moe.is_none() {
        println!(
            "  {} has no MoE layers: `m2r2 demo --model tiny-moe` shows this section \
             (or `m2r2 moe-sim --model tiny-moe --prompt ..`)",
            loaded.name
        );
        return Ok(());
    }
    let steps = NEW_TOKENS - 1;
    let weights = M2r2Weights::builtin_for(&loaded.name, &loaded.model.config)?;
    let decoded = collect_trace(M2r2::new(&loaded.model, &weights), &demo.prompt, steps)?;
    let n = decoded.tokens.len().min(demo.greedy.len());
    demo.check(
        format!(
            "tracing the experts with the fast stream leaves the greedy tokens unchanged ({n})"
        ),
        decoded.tokens[..n] == demo.greedy[..n],
    );
    /// `moe-sim`'s flags with their defaults.
    #[derive(clap::Parser)]
    struct MoeSimFlags {
        #[command(flatten)]
        args: MoeSimArgs,
    }
    let ids: Vec<String> = demo.prompt.iter().map(|t| t.to_string()).collect();
    let steps = steps.to_string();
    let flags = <MoeSimFlags as clap::Parser>::try_parse_from([
        "moe-sim",
        "--model",
        &loaded.name,
        "--tokens",
        &ids.join(","),
        "--steps",
        &steps,
    ])?;
    moe_report::run_loaded(&flags.args, loaded)
}
