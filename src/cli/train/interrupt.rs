//! SIGINT and SIGTERM (Ctrl-C, `kill`) during `m2r2 train`'s steps: the first asks the loop to
//! stop after the current step and save the checkpoint; a second ends the process at once, with
//! the same status 130 (128 + SIGINT, what a shell reports for Ctrl-C).

use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit status of an interrupted run.
pub const EXIT_CODE: u8 = 130;

/// Set once a stop was asked for.
#[derive(Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Catch SIGINT and SIGTERM from now on (once per process: the training loop alone installs
    /// it, so that a signal during the slow stream still ends the run at once).
    pub fn install() -> Result<Self> {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&flag);
        ctrlc::set_handler(move || {
            if seen.swap(true, Ordering::SeqCst) {
                eprintln!("second signal: exiting without saving");
                std::process::exit(EXIT_CODE.into());
            }
            eprintln!(
                "signal: stopping after this step to save the checkpoint (again to exit at once)"
            );
        })
        .context("cannot catch SIGINT / SIGTERM")?;
        Ok(Stop(flag))
    }

    /// Whether a stop was asked for.
    pub fn asked(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
