//! What the commands that write an M2R2 weights folder replace there: `train-arla --out` keeps
//! other weights unless `--force` (writing into `--m2r2` itself is allowed), `init-m2r2 --force`
//! and `train-arla --force` remove the M2R2 and trainer files they replace and nothing else; and
//! `train-arla`'s counts are bounded before any work.

use super::{Run, fails, m2r2, ok};
use std::path::Path;

/// `n` prompts with ids `{prefix}{i}` in `dir/{prefix}.jsonl`, distilled greedily (8 tokens) into
/// `dir/{prefix}-data`; returns the data folder.
fn distill(dir: &Path, prefix: &str, n: usize) -> String {
    let lines: Vec<String> = (0..n)
        .map(|i| format!("{{\"id\": \"{prefix}{i}\", \"prompt\": \"{prefix}: count to {i}.\"}}\n"))
        .collect();
    let prompts = dir.join(format!("{prefix}.jsonl"));
    std::fs::write(&prompts, lines.concat()).unwrap();
    let out = dir.join(format!("{prefix}-data")).display().to_string();
    ok(&[
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        &prompts.display().to_string(),
        "--out",
        &out,
        "--max-new-tokens",
        "8",
    ]);
    out
}

/// The names of the files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A `train` checkpoint's trainer files and best weights (their contents do not matter here) and
/// a file of the user's, added to the weights folder `dir`.
fn add_trainer_and_user_files(dir: &Path) {
    std::fs::write(dir.join("trainer_state.json"), "{}").unwrap();
    std::fs::write(dir.join("optimizer.safetensors"), "x").unwrap();
    std::fs::create_dir(dir.join("best")).unwrap();
    std::fs::write(dir.join("best/m2r2_config.json"), "{}").unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
}

#[test]
fn init_m2r2_force_replaces_only_the_m2r2_files() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w");
    let shown = w.display().to_string();
    ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "1",
        "--out",
        &shown,
    ]);
    add_trainer_and_user_files(&w);
    std::fs::write(w.join("draft_head.json"), "{}").unwrap();
    fails(
        &["init-m2r2", "--model", "tiny", "--out", &shown],
        &["is not empty", "--force"],
    );
    let run = ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "2",
        "--out",
        &shown,
        "--force",
    ]);
    assert!(
        run.stderr.contains("optimizer.safetensors")
            && run.stderr.contains("trainer_state.json")
            && run.stderr.contains("best/"),
        "{}",
        run.stderr
    );
    assert_eq!(
        files(&w),
        [
            "adapter_config.json",
            "adapter_model.safetensors",
            "arla.safetensors",
            "m2r2_config.json",
            "notes.txt",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(w.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn train_arla_keeps_other_weights_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (data, dev) = (distill(dir.path(), "t", 2), distill(dir.path(), "d", 1));
    let (w, other) = (p("w"), p("other"));
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "2",
        "--out",
        &other,
    ]);
    add_trainer_and_user_files(&dir.path().join("other"));
    let arla = |m2r2_dir: &str, out: &str, extra: &[&str]| -> Run {
        let mut args = vec![
            "train-arla",
            "--model",
            "tiny",
            "--m2r2",
            m2r2_dir,
            "--data",
            &data,
            "--dev-data",
            &dev,
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        // 3 steps of 8 examples, unless `extra` says otherwise
        for (flag, value) in [("--steps", "3"), ("--batch", "8")] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        m2r2(&args)
    };
    let config =
        |name: &str| std::fs::read(dir.path().join(name).join("m2r2_config.json")).unwrap();
    let before = config("other");
    let run = arla(&w, &other, &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    for needle in [
        format!("--out {other} holds M2R2 weights"),
        format!("other than --m2r2 {w}"),
        "--force".to_string(),
    ] {
        assert!(run.stderr.contains(&needle), "{needle}: {}", run.stderr);
    }
    // refused before the exit states are collected, the folder as it was
    assert!(!run.stderr.contains("exit states"), "{}", run.stderr);
    assert_eq!(config("other"), before);

    // --force: the M2R2 and trainer files replaced, the user's kept
    let run = arla(&w, &other, &["--force"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        files(&dir.path().join("other")),
        [
            "adapter_config.json",
            "adapter_model.safetensors",
            "arla.safetensors",
            "m2r2_config.json",
            "notes.txt",
        ]
    );
    assert_eq!(
        std::fs::read(dir.path().join("other/adapter_model.safetensors")).unwrap(),
        std::fs::read(dir.path().join("w/adapter_model.safetensors")).unwrap()
    );
    // into --m2r2 itself (another spelling of it) needs no --force
    let itself = format!("{}/./w", dir.path().display());
    let run = arla(&w, &itself, &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);

    // counts: a --batch beyond the (token, gate) examples is capped, saying so; --steps bounded
    let fresh = p("fresh");
    let run = arla(&w, &fresh, &["--batch", "100000000000"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("--batch 100000000000 is more than the"),
        "{}",
        run.stderr
    );
    let run = arla(&w, &p("never"), &["--steps", "18446744073709551615"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--steps 18446744073709551615 is more than"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("never").exists());
}

/// `draft-head --help` describes its own `--data` and `--dev-data`, `train-arla --help` its own;
/// `init-m2r2 --help` lists the targets without a stray space.
#[test]
fn weights_commands_help_describes_their_own_flags() {
    let help = |command: &str| ok(&[command, "--help"]).stdout;
    let draft_head = help("draft-head");
    assert!(!draft_head.contains("train-arla"), "{draft_head}");
    assert!(draft_head.contains("chooses K"), "{draft_head}");
    let train_arla = help("train-arla");
    assert!(!train_arla.contains("draft-head"), "{train_arla}");
    assert!(
        train_arla.contains("the thresholds are calibrated on"),
        "{train_arla}"
    );
    let init = help("init-m2r2");
    assert!(
        init.contains("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
        "{init}"
    );
}
