//! `train`'s checkpoints end to end on the built-in `tiny` model: an `--out` holding a checkpoint
//! or weights is refused unless `--force` or `--resume` of it; a resumed run with `--val-data`
//! ends as an uninterrupted one (best weights and report); files that are not the checkpoint's
//! own, or another model, are refused on resume; SIGINT / SIGTERM save a checkpoint that resumes.

use super::train::distill_tiny;
use super::{fails, ok};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn state(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("trainer_state.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn bytes(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap()
}

/// `a` then `b`.
fn cat<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    [a, b].concat()
}

/// `--out` holding a checkpoint, M2R2 weights or best weights is refused, saying how to go on;
/// `--force` replaces the checkpoint and removes its `best/`; `--resume` of the same folder
/// continues it; `--resume` into a new folder carries the best weights along.
#[test]
fn out_holding_a_checkpoint_needs_force_or_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(
        d,
        &[
            ("train.jsonl", "t", 4, "data"),
            ("val.jsonl", "v", 2, "val"),
        ],
    );
    let (data, val, ck) = (p("data"), p("val"), p("ck"));
    let base = ["train", "--data", &data, "--train-gates", "1"];
    ok(&cat(
        &base,
        &[
            "--val-data",
            &val,
            "--eval-every",
            "2",
            "--steps",
            "6",
            "--batch-rows",
            "8",
            "--out",
            &ck,
        ],
    ));
    assert!(d.join("ck/best/adapter_model.safetensors").is_file());
    let before = bytes(&d.join("ck"), "adapter_model.safetensors");
    let run = fails(
        &cat(&base, &["--steps", "2", "--out", &ck]),
        &[
            "holds a training checkpoint (step 6 of 6)",
            &format!("continue it with --resume {ck} --out {ck}"),
            "--force",
        ],
    );
    assert!(!run.stderr.contains("slow stream"), "{}", run.stderr);
    assert_eq!(bytes(&d.join("ck"), "adapter_model.safetensors"), before);
    // resuming into another folder carries the best weights its record names
    let ck2 = p("ck2");
    ok(&[
        "train", "--data", &data, "--resume", &ck, "--steps", "8", "--out", &ck2,
    ]);
    assert_eq!(
        bytes(&d.join("ck2/best"), "adapter_model.safetensors"),
        bytes(&d.join("ck/best"), "adapter_model.safetensors")
    );
    // the same folder continues; --force beside it is refused
    ok(&[
        "train", "--data", &data, "--resume", &ck, "--steps", "8", "--out", &ck,
    ]);
    assert_eq!(state(&d.join("ck"))["step"], 8);
    fails(
        &[
            "train", "--data", &data, "--resume", &ck, "--steps", "9", "--out", &ck, "--force",
        ],
        &["leave out --force"],
    );
    // --force: a new run, and no best weights of the old one beside it
    ok(&cat(
        &base,
        &["--steps", "2", "--batch-rows", "8", "--force", "--out", &ck],
    ));
    assert_eq!(state(&d.join("ck"))["step"], 2);
    assert!(!d.join("ck/best").exists());
    // M2R2 weights (init-m2r2) are not overwritten either
    ok(&["init-m2r2", "--model", "tiny", "--out", &p("w")]);
    fails(
        &cat(&base, &["--steps", "1", "--out", &p("w")]),
        &["holds M2R2 weights", "--force"],
    );
    ok(&cat(&base, &["--steps", "1", "--force", "--out", &p("w")]));
    assert!(!d.join("w/arla.safetensors").exists(), "stale ARLA kept");
}

/// A run with `--val-data` stopped and resumed ends with the best weights, the report and the
/// final adapters of the uninterrupted run: the checkpoint keeps the early-stopping record.
#[test]
fn resumed_early_stopping_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(
        d,
        &[
            ("train.jsonl", "t", 6, "data"),
            ("val.jsonl", "v", 2, "val"),
        ],
    );
    let (data, val) = (p("data"), p("val"));
    // a constant learning rate: a run of 22 steps is the first 22 steps of a run of 40 (which
    // finds its best at step 20 and stops early at step 26)
    let train = |steps: &str, out: &str, resume: bool| {
        let out = p(out);
        let mut args = vec!["train", "--data", &data, "--val-data", &val];
        if resume {
            args.extend(["--resume", &out]);
        } else {
            args.extend([
                "--train-gates",
                "1",
                "--lr",
                "0.05",
                "--lr-min",
                "0.05",
                "--warmup",
                "0",
                "--batch-rows",
                "8",
                "--eval-every",
                "2",
                "--patience",
                "3",
            ]);
        }
        ok(&[&args[..], &["--steps", steps, "--out", &out]].concat())
    };
    let straight = train("40", "straight", false);
    train("22", "parts", false);
    let resumed = train("40", "parts", true);
    let best_line = |stdout: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with("best validation mean KL"))
            .map(|l| l.split(": weights").next().unwrap().to_string())
    };
    assert_eq!(best_line(&straight.stdout), best_line(&resumed.stdout));
    let (a, b) = (d.join("straight"), d.join("parts"));
    for file in [
        "best/adapter_model.safetensors",
        "adapter_model.safetensors",
    ] {
        assert_eq!(bytes(&a, file), bytes(&b, file), "{file}");
    }
    for run in [&straight, &resumed] {
        assert!(run.stderr.contains("stopping early"), "{}", run.stderr);
    }
    // the best so far came before the stop: a resumed run that forgot it would replace it
    assert!(
        resumed.stderr.contains("early stopping continues from"),
        "{}",
        resumed.stderr
    );
    assert_eq!(state(&a)["step"], state(&b)["step"]);
    assert_eq!(state(&a)["validation"], state(&b)["validation"]);
    // the stopped-early checkpoint goes on only with a larger patience
    let more = ["train", "--data", &data, "--val-data", &val];
    let b = p("parts");
    fails(
        &[&more[..], &["--resume", &b, "--out", &b, "--steps", "60"]].concat(),
        &["stopped early at step", "larger --patience"],
    );
    let go_on = [
        "--resume",
        &b,
        "--out",
        &b,
        "--steps",
        "60",
        "--patience",
        "9",
    ];
    ok(&[&more[..], &go_on].concat());
}

/// Resume refuses files that are not those the checkpoint saved (another run's adapters or
/// optimizer moments), a folder of weights alone and another base model; a checkpoint saved
/// before digests were recorded still resumes.
#[test]
fn resume_refuses_files_that_are_not_the_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(d, &[("train.jsonl", "t", 4, "data")]);
    let data = p("data");
    for (out, seed) in [("a", "1"), ("b", "2")] {
        ok(&[
            "train",
            "--data",
            &data,
            "--train-gates",
            "1",
            "--steps",
            "3",
            "--batch-rows",
            "8",
            "--seed",
            seed,
            "--out",
            &p(out),
        ]);
    }
    assert!(!d.join("a/.saving").exists(), "the staging folder is left");
    let copy = |name: &str| {
        let to = d.join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(d.join("a")).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
        to.display().to_string()
    };
    let resume = |ck: &str, needles: &[&str]| {
        let args = [
            "train", "--data", &data, "--resume", ck, "--out", ck, "--steps", "5",
        ];
        let run = fails(&args, needles);
        assert!(!run.stderr.contains("slow stream"), "{}", run.stderr);
    };
    for file in ["adapter_model.safetensors", "optimizer.safetensors"] {
        let ck = copy(&format!("mixed-{file}"));
        std::fs::copy(d.join("b").join(file), Path::new(&ck).join(file)).unwrap();
        resume(
            &ck,
            &[file, "is not the file the checkpoint saved at step 3"],
        );
    }
    // weights alone are not a checkpoint
    let ck = copy("weights-only");
    std::fs::remove_file(Path::new(&ck).join("trainer_state.json")).unwrap();
    resume(&ck, &["not a checkpoint of `m2r2 train`", "--init"]);
    // another base model (its config hash)
    let ck = copy("other-model");
    let mut s = state(Path::new(&ck));
    s["model_config_hash"] = "0123456789abcdef".into();
    std::fs::write(Path::new(&ck).join("trainer_state.json"), s.to_string()).unwrap();
    resume(&ck, &["trained on a model of config 0123456789abcdef"]);
    // a checkpoint of before the digests: read, with a note
    let ck = copy("old");
    let mut s = state(Path::new(&ck));
    s.as_object_mut().unwrap().remove("files_sha256");
    std::fs::write(Path::new(&ck).join("trainer_state.json"), s.to_string()).unwrap();
    let run = ok(&[
        "train", "--data", &data, "--resume", &ck, "--out", &ck, "--steps", "5",
    ]);
    assert!(run.stderr.contains("not checked"), "{}", run.stderr);
    assert!(state(Path::new(&ck))["files_sha256"].is_object());
}

/// SIGINT or SIGTERM during the steps: the step finishes, the checkpoint is saved, the run says
/// how to continue and exits 130; the checkpoint resumes.
#[test]
fn a_signal_saves_a_checkpoint_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(d, &[("train.jsonl", "t", 4, "data")]);
    let data = p("data");
    for signal in ["INT", "TERM"] {
        let out = p(signal);
        let mut child = Command::new(env!("CARGO_BIN_EXE_m2r2"))
            .args(["train", "--data", &data, "--train-gates", "1"])
            .args(["--steps", "1000000", "--log-every", "1", "--out", &out])
            .env(
                "M2R2_CACHE",
                std::env::temp_dir().join("m2r2-cli-tests-empty-cache"),
            )
            .env("RAYON_NUM_THREADS", "2")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut stderr = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            stderr += &format!("{line}\n");
            if line.starts_with("step ") {
                break;
            }
        }
        let pid = child.id().to_string();
        let kill = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status();
        assert!(kill.unwrap().success());
        for line in lines {
            stderr += &format!("{}\n", line.unwrap());
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "{stderr}");
        let step = state(Path::new(&out))["step"].as_u64().unwrap();
        let want = format!("stopped at step {step}: checkpoint in {out}, continue with --resume");
        assert!(stderr.contains(&want), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let total = (step + 2).to_string();
        let run = ok(&[
            "train", "--data", &data, "--resume", &out, "--out", &out, "--steps", &total,
        ]);
        assert!(run.stdout.contains("trained 2 steps"), "{}", run.stdout);
    }
}

/// `--resume` without `--steps` goes on to the checkpoint's own total, so that the command an
/// interrupted run prints continues that run (it once trained to the default 1000 instead); a
/// finished run needs a larger `--steps`.
#[test]
fn a_resume_without_steps_keeps_the_runs_total() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(d, &[("train.jsonl", "t", 2, "data")]);
    let (data, out) = (p("data"), p("ck"));
    let train = ["train", "--data", &data, "--out", &out];
    ok(&cat(&train, &["--train-gates", "1", "--steps", "3"]));
    let resume = cat(&train, &["--resume", &out]);
    fails(
        &resume,
        &["has already done 3 of 3 steps: give a larger --steps to train on"],
    );
    // a run of 5 steps stopped after 3, as its state records it
    let mut s = state(Path::new(&out));
    s["options"]["steps"] = 5.into();
    std::fs::write(Path::new(&out).join("trainer_state.json"), s.to_string()).unwrap();
    let run = ok(&resume);
    assert!(run.stdout.contains("trained 2 steps"), "{}", run.stdout);
    assert_eq!(state(Path::new(&out))["step"], 5);
    assert!(!run.stderr.contains("holds ARLA"), "{}", run.stderr);
    // ARLA trained into the checkpoint is kept by a resume, which says it needs retraining
    let dev = p("dev");
    distill_tiny(d, &[("dev.jsonl", "d", 2, "dev")]);
    let arla = [
        "train-arla",
        "--m2r2",
        &out,
        "--data",
        &data,
        "--dev-data",
        &dev,
    ];
    ok(&cat(&arla, &["--steps", "2", "--out", &out]));
    let run = ok(&cat(&resume, &["--steps", "6"]));
    assert!(
        run.stderr
            .contains("holds ARLA (arla.safetensors, with its calibrated thresholds)"),
        "{}",
        run.stderr
    );
}

/// Flags no run can use are refused before any work, by name; a batch above the data's rows is
/// capped; `--bridge-only` runs the bridge's gate alone; validation that would never run is
/// refused.
#[test]
fn bad_training_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    distill_tiny(
        d,
        &[
            ("train.jsonl", "t", 2, "data"),
            ("val.jsonl", "v", 1, "val"),
        ],
    );
    let (data, val, out) = (p("data"), p("val"), p("o"));
    let base = ["train", "--data", &data, "--steps", "2", "--out", &out];
    for (extra, needle) in [
        (
            &["--lr", "-1"][..],
            "--lr must be a finite number > 0, got -1",
        ),
        (&["--lr=nan"], "--lr must be a finite number > 0, got NaN"),
        (
            &["--temperature=inf"],
            "--temperature must be a finite number > 0, got inf",
        ),
        (
            &["--clip", "0"],
            "--clip must be a finite number > 0, got 0",
        ),
        (
            &["--align", "cosine", "--align-weight", "-1"],
            "--align-weight must be a finite number >= 0, got -1",
        ),
        (
            &["--align", "mse", "--align-weight=nan"],
            "--align-weight must be a finite number >= 0, got NaN",
        ),
        (&["--lr-min", "1"], "--lr-min 1 is above --lr 0.002"),
        (
            &["--train-gates", "1,1"],
            "--train-gates names gate 1 twice",
        ),
        (&["--batch-rows", "0"], "--batch-rows must be at least 1"),
        (
            &["--val-data", &val, "--eval-every", "5"],
            "--val-data would never be evaluated",
        ),
    ] {
        let run = fails(&cat(&base, extra), &[needle]);
        assert!(!run.stderr.contains("slow stream"), "{}", run.stderr);
    }
    assert!(!d.join("o").exists());
    // 2 samples of 12 response tokens: 26 rows
    let run = ok(&cat(
        &base,
        &["--train-gates", "1", "--batch-rows", "100000"],
    ));
    assert!(
        run.stderr
            .contains("--batch-rows 100000 is more than the 26 trainable rows"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("26 rows per gate per step"),
        "{}",
        run.stdout
    );
    let bridged = cat(&base, &["--bridge-rank", "4", "--bridge-only", "--force"]);
    let run = ok(&cat(&bridged, &[]));
    assert!(
        run.stderr.contains("training only the bridge (gate [1]"),
        "{}",
        run.stderr
    );
    fails(
        &cat(&bridged, &["--train-gates", "1,2"]),
        &[
            "--bridge-only trains the bridge alone",
            "leave out --train-gates",
        ],
    );
}
