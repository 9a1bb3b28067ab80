//! The slow stream outside the training data: held-out data (`--eval-data`, `--val-data`) through
//! the `--slow-cache` folder, and the line on stderr for each cache file a pass read or wrote.

use anyhow::Result;
use train::slow_cache::{CacheUse, SlowPass};
use train::trainer::{HeldOut, Trainer};

/// The slow stream of held-out `data` (through the cache when there is one).
pub fn held_out(
    model: &reference::Model,
    trainer: &Trainer,
    data: &[train::data::DistillSample],
    cache: Option<&std::path::Path>,
    what: &str,
) -> Result<HeldOut> {
    let mut slow = SlowPass {
        cache,
        ..SlowPass::default()
    };
    let held_out = trainer.held_out(model, data, &mut slow)?;
    report_cache(what, slow.used);
    Ok(held_out)
}

/// One line on stderr per slow-stream cache file: read, written (and how large), or not written.
pub fn report_cache(what: &str, used: Vec<CacheUse>) {
    for u in used {
        match u {
            CacheUse::Read(file) => {
                eprintln!("slow stream of {what} read from {}", file.display())
            }
            CacheUse::Written(file, bytes) => eprintln!(
                "slow stream of {what} written to {} ({:.2} GB)",
                file.display(),
                bytes as f64 / 1e9
            ),
            CacheUse::NotWritten(file, why) => eprintln!(
                "warning: the slow stream of {what} could not be cached in {} ({why}); training \
                 goes on without the cache",
                file.display()
            ),
        }
    }
}
