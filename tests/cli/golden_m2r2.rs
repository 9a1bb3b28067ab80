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

    // Speculative: one round's accepted count changed.
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
    set_i64(&path, "round_accepted", 1, accepted[1] + 1);
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
                accepted[1] + 1,
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
