//! Early stopping in `m2r2 train --val-data`: the record this run starts from (a resumed
//! checkpoint's, when it was made on the same validation data, else a new one), and each
//! evaluation: the record and `OUT/best` updated, one line on stderr.

use super::flags::{self, EVAL_EVERY, PATIENCE};
use super::log::gate_summary;
use anyhow::{Context, Result, bail};
use std::path::Path;
use train::checkpoint_files::BEST_DIR;
use train::checkpoint_validation::ValidationRecord;
use train::data::DistillSample;
use train::early_stop::{EarlyStop, Observation};
use train::trainer::{HeldOut, Trainer, mean_kl};

/// The early-stopping record of a run with `--val-data` (`data`), checked before any work:
/// `resumed` is the record of the checkpoint `--resume DIR` continues (`done` steps of `steps`),
/// whose interval and patience apply unless `--eval-every` / `--patience` are given.
pub fn start_record(
    data: &[DistillSample],
    eval_every: Option<usize>,
    patience: Option<usize>,
    resumed: Option<(&Path, &ValidationRecord)>,
    done: usize,
    steps: usize,
) -> Result<ValidationRecord> {
    let record = match resumed {
        Some((dir, r)) if r.is_on(data) => {
            let mut record = r.clone();
            for (flag, given, kept) in [
                ("--eval-every", eval_every, &mut record.eval_every),
                ("--patience", patience, &mut record.patience),
            ] {
                if let Some(v) = given
                    && v != *kept
                {
                    eprintln!(
                        "note: {flag} {v} replaces the {kept} of the run in {}",
                        dir.display()
                    );
                    *kept = v;
                }
            }
            let (early, last) = record.early_stop();
            if let (Some(Observation::Stop), Some((step, kl))) = (last, early.best()) {
                bail!(
                    "{} stopped early at step {}: {} evaluations in a row without a validation \
                     mean KL below {kl:.4} (step {step}); to train on, resume with a larger \
                     --patience",
                    dir.display(),
                    done,
                    record.patience
                );
            }
            if let Some((step, kl)) = early.best() {
                eprintln!(
                    "early stopping continues from {}: best validation mean KL {kl:.4} at step \
                     {step}, {} evaluations so far",
                    dir.display(),
                    record.evaluations.len()
                );
            }
            record
        }
        other => {
            if let Some((dir, _)) = other {
                eprintln!(
                    "note: the early-stopping record in {} was made on other validation data: \
                     early stopping starts afresh, and {BEST_DIR}/ is replaced at the first \
                     evaluation",
                    dir.display()
                );
            }
            ValidationRecord::new(
                data,
                eval_every.unwrap_or(EVAL_EVERY),
                patience.unwrap_or(PATIENCE),
            )
        }
    };
    flags::check_evaluated(record.eval_every, done, steps)?;
    Ok(record)
}

/// Early stopping during the steps: the validation data's slow stream, the record and its state.
pub struct Validation {
    pub held_out: HeldOut,
    pub record: ValidationRecord,
    pub early: EarlyStop,
}

impl Validation {
    pub fn new(held_out: HeldOut, record: ValidationRecord) -> Self {
        let (early, _) = record.early_stop();
        Validation {
            held_out,
            record,
            early,
        }
    }

    /// Evaluate `trainer` when its step is due, write the weights of a new best into `out/best`
    /// and print the evaluation (`print` wraps the progress bar); `None` when not due.
    pub fn step(
        &mut self,
        trainer: &Trainer,
        out: &Path,
        print: impl FnOnce(String),
    ) -> Result<Option<Observation>> {
        if !trainer.step.is_multiple_of(self.record.eval_every) {
            return Ok(None);
        }
        let stats = trainer.evaluate_held_out(&self.held_out);
        let kl = mean_kl(&stats);
        let seen = self.record.observe(&mut self.early, trainer.step, kl);
        if seen == Observation::Improved {
            let best = out.join(BEST_DIR);
            train::checkpoint_files::save_weights(&trainer.weights(), &best)
                .with_context(|| format!("cannot write {}", best.display()))?;
        }
        print(format!(
            "validation at step {}: mean KL {kl:.4} ({}) | {}",
            trainer.step,
            match seen {
                Observation::Improved => format!("best so far, weights in OUT/{BEST_DIR}"),
                Observation::NoBetter { misses } =>
                    format!("no better {misses}/{}", self.early.patience),
                Observation::Stop => "no better: stopping early".to_string(),
            },
            gate_summary(&stats)
        ));
        Ok(Some(seen))
    }
}
