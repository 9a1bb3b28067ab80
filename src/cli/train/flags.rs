//! The checks of `m2r2 train`'s flags that need no model or data, made before any work and naming
//! the flag: counts of at least 1, finite numbers in range, gates named once.

use super::Args;
use anyhow::{Context, Result, bail};

/// The default of `--eval-every`.
pub const EVAL_EVERY: usize = 100;
/// The default of `--patience`.
pub const PATIENCE: usize = 3;

/// Refuse flag values that no run can use.
pub fn check(args: &Args) -> Result<()> {
    for (flag, value) in [
        ("--save-every", args.save_every),
        ("--eval-every", args.eval_every),
        ("--patience", args.patience),
        ("--log-every", Some(args.log_every)),
        ("--steps", args.steps),
        ("--batch-rows", Some(args.batch_rows)),
    ] {
        if value == Some(0) {
            bail!("{flag} must be at least 1");
        }
    }
    if let Some(warmup) = args.warmup
        && warmup > args.steps()
    {
        bail!(
            "--warmup {warmup} is longer than the run (--steps {}): the learning rate would never \
             reach its peak",
            args.steps()
        );
    }
    if let Some(alpha) = args.alpha
        && !(alpha.is_finite() && alpha > 0.0)
    {
        bail!(
            "--alpha must be a finite number > 0 (the adapters' scale is alpha / r), got {alpha}"
        );
    }
    // (the checkpoint's own values are used with --resume, which refuses these flags)
    let positive = [
        ("--lr", Some(args.lr)),
        ("--clip", Some(args.clip)),
        ("--temperature", Some(args.temperature)),
    ];
    for (flag, value) in positive {
        if let Some(x) = value
            && !(x.is_finite() && x > 0.0)
        {
            bail!("{flag} must be a finite number > 0, got {x}");
        }
    }
    let non_negative = [
        ("--lr-min", args.lr_min),
        ("--weight-decay", Some(args.weight_decay)),
        ("--hard-label-weight", Some(args.hard_label_weight)),
        ("--align-weight", Some(args.align_weight)),
    ];
    for (flag, value) in non_negative {
        if let Some(x) = value
            && !(x.is_finite() && x >= 0.0)
        {
            bail!("{flag} must be a finite number >= 0, got {x}");
        }
    }
    if let Some(lr_min) = args.lr_min
        && lr_min > args.lr
    {
        bail!(
            "--lr-min {lr_min} is above --lr {}: the cosine decay goes from --lr down to --lr-min",
            args.lr
        );
    }
    train_gates(args.train_gates.as_deref())?;
    Ok(())
}

/// Refuse validation that would never run: no multiple of `every` in `(done, steps]` (checked
/// once the validation data is, so that data it refuses is named first).
pub fn check_evaluated(every: usize, done: usize, steps: usize) -> Result<()> {
    if steps / every <= done / every {
        bail!(
            "--eval-every {every}: no evaluation would fall in steps {} to {steps}, so --val-data \
             would never be evaluated (and OUT/best never written): give an --eval-every of at \
             most {}",
            done + 1,
            steps - done
        );
    }
    Ok(())
}

/// `--train-gates` as 1-based gate numbers, each named once (`None`: not given).
pub fn train_gates(list: Option<&str>) -> Result<Option<Vec<usize>>> {
    let Some(list) = list else { return Ok(None) };
    let mut gates = Vec::new();
    for g in list.split(',') {
        let gate = g
            .trim()
            .parse::<usize>()
            .with_context(|| format!("--train-gates: `{g}` is not a gate number"))?;
        if gates.contains(&gate) {
            bail!("--train-gates names gate {gate} twice");
        }
        gates.push(gate);
    }
    Ok(Some(gates))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_are_named_once_and_validation_must_run() {
        assert_eq!(train_gates(Some("1, 3")).unwrap(), Some(vec![1, 3]));
        assert_eq!(train_gates(None).unwrap(), None);
        let e = train_gates(Some("1,1")).unwrap_err().to_string();
        assert!(e.contains("--train-gates names gate 1 twice"), "{e}");
        assert!(train_gates(Some("x")).is_err());
        check_evaluated(100, 0, 100).unwrap();
        check_evaluated(4, 10, 12).unwrap();
        let e = check_evaluated(500, 0, 100).unwrap_err().to_string();
        assert!(e.contains("at most 100"), "{e}");
        let e = check_evaluated(4, 9, 11).unwrap_err().to_string();
        assert!(e.contains("steps 10 to 11"), "{e}");
    }
}
