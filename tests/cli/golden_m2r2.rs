//! `m2r2 golden write --mode early-exit | speculative` and `golden check` of those files, and the
//! demo's M2R2 section.

use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Rewrite a safetensors file with one element of the I64 `tensor` set to `value`.
fn set_i64(path: &Path, tensor: &str, index: usize, value: i64) {
    super::golden::edit_tensor(path, tensor, |dtype, data| {
        assert_eq!(dtype, Dtype::I64);
        data[8 * index..8 * index + 8].copy_from_slice(&value.to_le_bytes());
    });
}

fn read_i64(path: &Path, tensor: &str) -> Vec<i64> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensor(tensor)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn all_ok(stdout: &str) -> bool {
    stdout.contains("overall: OK") && !stdout.contains("NOT OK")
}

#[test]
fn golden_m2r2_modes_write_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let modes: [&[&str]; 4] = [
        &["--mode", "early-exit"],
        &[
            "--mode",
            "early-exit",
            "--gate",
            "confidence",
            "--threshold",
            "0.05",
        ],
        &["--mode", "speculative", "--draft-len", "3"],
        &["--mode", "speculative", "--dynamic-draft"],
    ];
    for (i, mode) in modes.iter().enumerate() {
        let path = dir.path().join(format!("g{i}.safetensors"));
        let file = path.to_str().unwrap();
        let mut args = vec![
            "golden", "write", "--tokens", "1,2,3", "--steps", "12", "--out", file,
        ];
        args.extend_from_slice(mode);
        let run = super::ok(&args);
        assert!(run.stdout.contains(mode[1]), "{}", run.stdout);
        let run = super::ok(&["golden", "check", file]);
        assert!(all_ok(&run.stdout), "{mode:?}: {}", run.stdout);
        let report = super::ok(&["golden", "check", file, "--json"]).json();
        assert_eq!(report["ok"], true);
        assert_eq!(report["mode"], mode[1]);
        // Other M2R2 weights are refused.
        super::fails(
            &["golden", "check", file, "--m2r2", "none"],
            &["not the ones this golden was recorded with"],
        );
    }
}

/// A speculative golden's `--threshold` and `--gate` must be read: refused beside fixed drafting,
/// chain or tree (as on `generate`).
#[test]
fn speculative_goldens_refuse_an_unread_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    for drafting in [&["--draft-len", "2"][..], &["--draft-tree", "2,1"]] {
        for (flag, value) in [("--threshold", "0.5"), ("--gate", "entropy")] {
            let args = [
                &[
                    "golden", "write", "--tokens", "1,2,3", "--steps", "4", "--out", file,
                ][..],
                &["--mode", "speculative", flag, value],
                drafting,
            ];
            let refused = super::fails(&args.concat(), &["a fixed 2 token(s)"]);
            assert!(refused.stderr.contains(&format!(": {flag} is read")));
            assert!(!path.exists());
        }
    }
    let generate = [
        "generate",
        "--tokens",
        "1,2,3",
        "--mode",
        "speculative",
        "--gate",
        "entropy",
    ];
    super::fails(
        &generate,
        &["--gate is read by dynamic drafting", "drop --gate"],
    );
}

#[test]
fn early_exit_goldens_need_the_exact_kv_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    super::fails(
        &[
            "golden",
            "write",
            "--tokens",
            "1,2,3",
            "--steps",
            "4",
            "--out",
            path.to_str().unwrap(),
            "--mode",
            "early-exit",
            "--kv-policy",
            "fast-kv",
        ],
        &["early-exit goldens need --kv-policy exact: with fast-kv the cache is approximate"],
    );
    assert!(!path.exists(), "nothing is written");
}

#[test]
fn tampered_m2r2_goldens_fail_where_they_differ() {
    let dir = tempfile::tempdir().unwrap();
    // Early exit: one step's exit gate changed.
    let path = dir.path().join("ee.safetensors");
    let file = path.to_str().unwrap();
    super::ok(&[
        "golden",
        "write",
        "--tokens",
        "1,2,3",
        "--steps",
        "12",
        "--mode",
        "early-exit",
        "--out",
        file,
    ]);
    let gates = read_i64(&path, "exit_gate");
    let step = gates.len() - 1;
    set_i64(
        &path,
        "exit_gate",
        step,
        if gates[step] == 1 { 2 } else { 1 },
    );
    let run = super::fails(&["golden", "check", file], &["NOT OK"]);
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("reference") && l.contains("exit_gate"))
        .unwrap();
    assert!(
        line.contains("NOT OK")
            && line.contains(&format!("first divergence at step {step}: exit gate")),
        "{}",
        run.stdout
    );

    // Speculative: one round's accepted count changed (one less: tiny accepts every draft, and
    // the rounds must still emit the tokens, or the file is refused as it is read).
    let path = dir.path().join("sp.safetensors");
    let file = path.to_str().unwrap();
    super::ok(&[
        "golden",
        "write",
        "--tokens",
        "1,2,3",
        "--steps",
        "12",
        "--mode",
        "speculative",
        "--out",
        file,
    ]);
    let accepted = read_i64(&path, "round_accepted");
    assert!(accepted[1] > 0, "{accepted:?}");
    set_i64(&path, "round_accepted", 1, accepted[1] - 1);
    let run = super::fails(&["golden", "check", file], &["NOT OK"]);
    // one line for the rounds, at the first that differs
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("reference") && l.contains(" rounds "))
        .unwrap();
    assert!(
        line.contains("NOT OK")
            && line.contains(&format!(
                "first divergence at round 1: accepted golden {} vs recomputed {}",
                accepted[1] - 1,
                accepted[1]
            )),
        "{}",
        run.stdout
    );
}

#[test]
fn demo_runs_the_m2r2_modes_without_not_ok() {
    let run = super::ok(&["demo"]);
    // The golden section prints a deliberate NOT OK for its tampered logit; the checks do not.
    let section = run
        .stdout
        .split("M2R2 modes ==")
        .nth(1)
        .expect("an M2R2 section");
    let section = section.split("\n== ").next().unwrap();
    assert!(!section.contains("NOT OK"), "{section}");
    assert_eq!(section.matches("  OK ").count(), 6, "{section}");
    assert!(run.stdout.contains(" checks, 0 NOT OK"), "{}", run.stdout);
    super::run::check_demo_onnx_section(&run.stdout);
}

/// Speculative goldens of one prompt that differ only in their budget, or in stopping at end of
/// turn where the other ran on (`--ignore-eos`), compare OK whatever the drafting (a chain, a token
/// tree, dynamic drafting): the rounds both decoded are compared, and the `stop` line judges where
/// they ended.
#[test]
fn speculative_goldens_of_other_budgets_compare_ok() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let drafting: [&[&str]; 3] = [
        &["--draft-len", "2"],
        &["--draft-tree", "2,1,1"],
        &["--dynamic-draft"],
    ];
    for mode in drafting {
        let write = |name: &str, budget: &[&str]| {
            let out = p(name);
            let args = [
                "golden",
                "write",
                "--model",
                "tiny-moe",
                "--tokens",
                "5,6,7",
                "--mode",
                "speculative",
                "--out",
                &out,
            ];
            super::ok(&[&args[..], mode, budget].concat());
            out
        };
        let long = write("long.golden.safetensors", &["--steps", "12"]);
        let short = write("short.golden.safetensors", &["--steps", "7"]);
        // tiny-moe ends its turn after 17 tokens of this prompt
        let stopped = write("stopped.golden.safetensors", &["--steps", "20"]);
        let ran_on = write(
            "ran-on.golden.safetensors",
            &["--steps", "30", "--ignore-eos"],
        );
        for (a, b, stop) in [
            (
                &long,
                &short,
                "actual ran its whole budget and ended after 7",
            ),
            (&ran_on, &stopped, "actual stopped after 17"),
        ] {
            let run = super::ok(&["golden", "compare", a, b]);
            let line = |name: &str| {
                let line = run.stdout.lines().find(|l| l.contains(name));
                line.unwrap_or_else(|| panic!("{mode:?}: {}", run.stdout))
            };
            assert!(line(" stop ").contains(stop), "{mode:?}: {}", run.stdout);
            assert!(
                line(" rounds ").contains("rounds compared, equal"),
                "{mode:?}: {}",
                run.stdout
            );
        }
    }
}

/// What is wrong is named: a speculative golden whose accepted counts do not emit its tokens is
/// refused as it is read, naming `round_accepted` (not, once replayed, as a context too small),
/// and a check on another `--model` names the model, not the M2R2 weights.
#[test]
fn inconsistent_rounds_and_another_model_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (m2r2, golden) = (p("m2r2-seed0"), p("s.golden.safetensors"));
    super::ok(&[
        "init-m2r2",
        "--model",
        "tiny-moe",
        "--seed",
        "0",
        "--out",
        &m2r2,
    ]);
    let write = [
        "golden",
        "write",
        "--model",
        "tiny-moe",
        "--tokens",
        "5,6,7",
        "--steps",
        "10",
        "--mode",
        "speculative",
        "--draft-len",
        "2",
        "--out",
        &golden,
        "--m2r2",
        &m2r2,
    ];
    super::ok(&write);
    let run = super::fails(
        &[
            "golden", "check", &golden, "--m2r2", &m2r2, "--model", "tiny",
        ],
        &["--model tiny: the model's config", "model `tiny-moe`"],
    );
    assert!(
        run.code == Some(2) && !run.stderr.contains("M2R2 weights:"),
        "{}",
        run.stderr
    );
    // every draft refused: 9 rounds of one token after the prompt's; one round said to accept one
    let path = Path::new(&golden);
    assert_eq!(read_i64(path, "round_accepted"), vec![0; 9]);
    set_i64(path, "round_accepted", 2, 1);
    let run = super::fails(
        &["golden", "check", &golden, "--m2r2", &m2r2],
        &["tensor `round_accepted` does not agree with `tokens`"],
    );
    assert!(
        run.code == Some(2) && !run.stderr.contains("context holds"),
        "{}",
        run.stderr
    );
}

/// `golden write` refuses `--rtol` for the M2R2 modes (a check of them takes atol alone); a file
/// that pins one anyway is refused by `check` and `compare` alike as a bad file naming the
/// metadata, not the flag nobody gave; `check --rtol` of an M2R2 golden names the flag.
#[test]
fn an_rtol_for_an_m2r2_golden_is_refused_where_it_comes_from() {
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("r.golden.safetensors");
    let file = golden.to_str().unwrap();
    for mode in ["early-exit", "speculative"] {
        let write = [
            "golden",
            "write",
            "--tokens",
            "5,17,200,33",
            "--steps",
            "3",
            "--mode",
            mode,
            "--out",
            file,
        ];
        super::fails(
            &[&write[..], &["--rtol", "0.1"]].concat(),
            &["--rtol is for greedy goldens", &format!("(--mode {mode})")],
        );
        super::ok(&[&write[..], &["--atol", "0.1"]].concat());
        let run = super::fails(&["golden", "check", file, "--rtol", "0.1"], &["--rtol"]);
        assert!(
            run.stdout
                .contains("overall: NOT CHECKED: --rtol is for greedy goldens")
        );
        super::golden::edit_file(&golden, |(_, meta)| {
            meta.insert("rtol".into(), "0.1".into());
        });
        let pinned = format!("metadata `rtol` = `0.1` is pinned in an M2R2 golden (mode `{mode}`)");
        for command in [&["check", file][..], &["compare", file, file]] {
            let run = super::fails(&[&["golden"][..], command].concat(), &[&pinned]);
            assert_eq!(run.code, Some(2), "{}", run.stderr);
            assert!(!run.stdout.contains("--rtol"), "{}", run.stdout);
        }
    }
}

/// What a golden says about its model and weights is checked, not only their hashes: a `config`
/// or `m2r2_config` edited under them (the tester's sizes, gates and rank), an unknown metadata
/// key or tensor, each NOT CHECKED naming what; `compare` refuses a golden whose settings differ
/// under the same hash.
#[test]
fn descriptive_metadata_edited_under_its_hashes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let (golden, edited) = (p("ee.golden.safetensors"), p("edited.golden.safetensors"));
    let (file, bad) = (golden.to_str().unwrap(), edited.to_str().unwrap());
    super::ok(&[
        "golden",
        "write",
        "--tokens",
        "5,17,200,33",
        "--steps",
        "6",
        "--mode",
        "early-exit",
        "--out",
        file,
    ]);
    let edit = |key: &str, change: &dyn Fn(&mut serde_json::Value)| {
        std::fs::copy(&golden, &edited).unwrap();
        super::golden::edit_file(&edited, |(_, meta)| {
            let mut value: serde_json::Value = serde_json::from_str(&meta[key]).unwrap();
            change(&mut value);
            meta.insert(key.into(), value.to_string());
        });
    };
    edit("config", &|c| {
        c["num_hidden_layers"] = 4.into();
        c["hidden_size"] = 32.into();
    });
    let run = super::fails(
        &["golden", "check", bad],
        &["metadata `config` does not hash to `config_hash`", bad],
    );
    assert_eq!(run.code, Some(2));
    edit("m2r2_config", &|c| {
        c["gates"] = serde_json::json!([1, 3, 5]);
        c["rank"] = 4.into();
    });
    let needles = [
        "metadata `m2r2_config` is not the settings its `m2r2_weights_hash`",
        "`gates` ([1,3,5] vs",
        "`rank` (4 vs",
        bad,
    ];
    assert_eq!(
        super::fails(&["golden", "check", bad], &needles).code,
        Some(2)
    );
    super::fails(
        &["golden", "compare", file, bad],
        &["the same `m2r2_weights_hash`", "`gates` ("],
    );
    for (what, needle) in [
        ("key", "holds metadata `foo`"),
        ("tensor", "holds tensor `junk`"),
    ] {
        std::fs::copy(&golden, &edited).unwrap();
        super::golden::edit_file(&edited, |(tensors, meta)| match what {
            "key" => {
                meta.insert("foo".into(), "bar".into());
            }
            _ => tensors.push(("junk".into(), Dtype::F32, vec![1], vec![0; 4])),
        });
        for command in [&["check", bad][..], &["compare", file, bad]] {
            super::fails(&[&["golden"][..], command].concat(), &[needle, bad]);
        }
    }
}

/// Other M2R2 weights than recorded: the advice names where the recorded ones are, the model's
/// own weights (drop --m2r2) or `--m2r2 none`'s zeros, and a folder only when neither is.
#[test]
fn the_advice_for_other_weights_names_where_the_recorded_ones_are() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let w1 = p("w1");
    super::ok(&["init-m2r2", "--model", "tiny", "--out", &w1, "--seed", "1"]);
    let write = |out: &str, m2r2: &[&str]| {
        let args = [
            "golden",
            "write",
            "--tokens",
            "5,17,200,33",
            "--mode",
            "speculative",
            "--steps",
            "10",
            "--out",
            out,
        ];
        super::ok(&[&args[..], m2r2].concat());
    };
    let (own, zeros, folder) = (p("own.st"), p("zeros.st"), p("folder.st"));
    write(&own, &[]);
    write(&zeros, &["--m2r2", "none"]);
    write(&folder, &["--m2r2", &w1]);
    for (golden, m2r2, advice) in [
        (
            &own,
            &["--m2r2", w1.as_str()][..],
            "the model's own M2R2 weights, builtin",
        ),
        (&own, &["--m2r2", "none"], "not a folder: drop --m2r2"),
        (
            &zeros,
            &[],
            "it was recorded with --m2r2 none (zeros): pass --m2r2 none",
        ),
        (&zeros, &["--m2r2", w1.as_str()], "pass --m2r2 none"),
        (
            &folder,
            &[],
            "pass --m2r2 with the folder it was recorded with",
        ),
    ] {
        let run = super::fails(
            &[&["golden", "check", golden][..], m2r2].concat(),
            &[advice],
        );
        let folder_advice = run.stderr.contains("with the folder it was recorded with");
        assert_eq!(folder_advice, golden == &folder, "{}", run.stderr);
    }
}

/// A speculative round's drafts edited (the tester's `round_drafted[1,3] = -1`, round 1 having
/// accepted 3 of 4): refused naming `round_drafted`, which was edited, not `verify_logits`,
/// whose rows it implies.
#[test]
fn edited_drafts_are_named_not_the_rows_they_imply() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.golden.safetensors");
    let file = path.to_str().unwrap();
    super::ok(&[
        "golden",
        "write",
        "--tokens",
        "5,17,200,33",
        "--mode",
        "speculative",
        "--steps",
        "10",
        "--out",
        file,
    ]);
    assert_eq!(read_i64(&path, "round_accepted"), vec![4, 3]);
    set_i64(&path, "round_drafted", 7, -1);
    let run = super::fails(
        &["golden", "check", file],
        &[
            "tensor `round_drafted`: round 1 drafted 3 tokens, but a fixed draft length drafts \
           `draft_max` = 4 every round",
        ],
    );
    assert!(!run.stderr.contains("verify_logits"), "{}", run.stderr);
}
