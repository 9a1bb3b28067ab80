//! `logits` and `golden` files (greedy): written, reproducible, and a tampered file fails the check.

use super::{fails, ok};
use reference::io::builtin::tiny_config;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// Read `logits` of a safetensors file: (shape, data, metadata).
fn read_logits(path: &Path) -> (Vec<usize>, Vec<f32>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), Dtype::F32);
    let data = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    (
        t.shape().to_vec(),
        data,
        meta.metadata().clone().unwrap_or_default(),
    )
}

#[test]
fn logits_are_written_and_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    // b goes in folders that do not exist yet: created, as `golden write --out` does
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("new/sub/b.safetensors"),
    );
    for out in [&a, &b] {
        ok(&[
            "logits",
            "--tokens",
            "1,2,3,4",
            "--out",
            out.to_str().unwrap(),
        ]);
    }
    let (shape, data, meta) = read_logits(&a);
    assert_eq!(shape, vec![4, 320]);
    assert_eq!(meta["model"], "tiny");
    assert_eq!(meta["config_hash"], tiny_config().hash());
    assert_eq!(read_logits(&b).1, data);
    // The same numbers as the library.
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let want = model.teacher_forced_logits(&[1, 2, 3, 4]).unwrap();
    assert_eq!(want.iter().copied().collect::<Vec<f32>>(), data);
}

/// A safetensors file's tensors `(name, dtype, shape, bytes)` and metadata.
pub(crate) type RawFile = (
    Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    HashMap<String, String>,
);

/// Rewrite a safetensors file in place through `edit` of its tensors and metadata.
pub(crate) fn edit_file(path: &Path, edit: impl FnOnce(&mut RawFile)) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    let mut raw = (tensors, meta.metadata().clone().unwrap_or_default());
    edit(&mut raw);
    let (owned, meta) = raw;
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// Rewrite a safetensors file in place with `edit` applied to the bytes of `tensor` (metadata kept).
pub(crate) fn edit_tensor(path: &Path, tensor: &str, edit: impl FnOnce(Dtype, &mut [u8])) {
    edit_file(path, |(tensors, _)| {
        let (_, dtype, _, data) = tensors.iter_mut().find(|t| t.0 == tensor).unwrap();
        edit(*dtype, data);
    });
}

/// Rewrite a safetensors file with one element of `tensor` (f32) moved by `delta`.
fn tamper(path: &Path, tensor: &str, index: usize, delta: f32) {
    set_f32(path, tensor, index, |v| v + delta);
}

/// Rewrite a safetensors file with one element of `tensor` (f32) set to `value(old)`.
fn set_f32(path: &Path, tensor: &str, index: usize, value: impl FnOnce(f32) -> f32) {
    edit_tensor(path, tensor, |dtype, data| {
        assert_eq!(dtype, Dtype::F32);
        let at = 4 * index;
        let v = value(f32::from_le_bytes(data[at..at + 4].try_into().unwrap()));
        data[at..at + 4].copy_from_slice(&v.to_le_bytes());
    });
}

#[test]
fn golden_write_check_and_tamper() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "4", "--out", file,
    ]);
    let run = ok(&["golden", "check", file]);
    assert!(
        run.stdout.contains("overall: OK") && !run.stdout.contains("NOT OK"),
        "{}",
        run.stdout
    );
    let report = ok(&["golden", "check", file, "--json"]).json();
    assert_eq!(report["ok"], true);
    assert_eq!(report["entries"][0]["name"], "logits");
    // --m2r2 is for M2R2 goldens (a suite may mix both): a greedy one says it is not used
    let run = ok(&["golden", "check", file, "--m2r2", "none"]);
    assert!(
        run.stdout.contains("--m2r2 none is not used") && run.stdout.contains("overall: OK"),
        "{}",
        run.stdout
    );

    tamper(&path, "logits", 2 * 320 + 7, 0.01);
    let run = fails(&["golden", "check", file], &["NOT OK"]);
    assert!(run.stdout.contains("NOT OK"), "{}", run.stdout);
    assert!(
        run.stdout.contains("[2, 7]"),
        "the report says where: {}",
        run.stdout
    );
    // A looser tolerance accepts it.
    ok(&["golden", "check", file, "--atol", "0.1"]);
    // Checking with another model is refused.
    fails(
        &["golden", "check", file, "--model", "tiny-moe"],
        &["not the one this golden was recorded with"],
    );
}

#[test]
fn tolerances_must_be_finite_and_not_negative() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    let write = [
        "golden", "write", "--tokens", "1,2,3", "--steps", "2", "--out", file,
    ];
    fails(
        &[&write[..], &["--atol=-1"]].concat(),
        &["--atol must be a finite number >= 0, got -1"],
    );
    // As check and compare do, write reads a negative bound as a number and refuses it itself.
    fails(
        &[&write[..], &["--atol", "-1"]].concat(),
        &["--atol must be a finite number >= 0, got -1"],
    );
    fails(
        &[&write[..], &["--rtol", "-0.5"]].concat(),
        &["--rtol must be a finite number >= 0, got -0.5"],
    );
    // a number beyond an f32 is quoted as typed, not as the f32's inf
    let beyond = "got 1e308, beyond what an f32 holds (at most 3.4028235e38)";
    fails(
        &[&write[..], &["--rtol", "1e308"]].concat(),
        &["--rtol must be a finite number >= 0", beyond],
    );
    ok(&write);
    fails(
        &["golden", "check", file, "--rtol", "NaN"],
        &["--rtol must be a finite number >= 0, got NaN"],
    );
    let run = fails(
        &["golden", "check", file, "--atol", "1e308"],
        &["--atol must be a finite number >= 0", beyond],
    );
    assert!(!run.stderr.contains("got inf"), "{}", run.stderr);
    fails(
        &["golden", "compare", file, file, "--atol", "-1e39"],
        &["got -1e39"],
    );
}

/// A golden check that would not check what it seems to is NOT CHECKED (exit 2), never OK:
/// ONNX Runtime's flags without `--onnx` (only the reference would run), a golden of no steps,
/// a JUnit report that cannot be written; `golden write` refuses what would record nothing or
/// pin nothing (`--steps 0`, `--m2r2` for a greedy golden) and names `--steps` and the failing
/// suite member past the context; `compare` of a golden that ran a smaller budget is OK.
#[test]
fn checks_that_would_prove_nothing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.golden.safetensors");
    let file = path.to_str().unwrap();
    let write = ["golden", "write", "--tokens", "1,2,3", "--out", file];
    fails(
        &[&write[..], &["--steps", "0"]].concat(),
        &["--steps 0 records nothing to check"],
    );
    fails(
        &[&write[..], &["--m2r2", "none"]].concat(),
        &[
            "--m2r2 none is for M2R2 goldens",
            "records the base model alone",
        ],
    );
    fails(
        &[&write[..], &["--steps", "600", "--mode", "speculative"]].concat(),
        &["needs 606 positions but the context holds 512 (shorten the prompt or lower --steps)"],
    );
    // a suite names the prompt that failed and what it had written
    let prompts = dir.path().join("prompts.jsonl");
    let long = "x".repeat(600);
    std::fs::write(
        &prompts,
        format!("{{\"id\": \"short\", \"prompt\": \"hi\"}}\n{{\"id\": \"long\", \"prompt\": \"{long}\"}}\n"),
    )
    .unwrap();
    let suite = dir.path().join("suite");
    fails(
        &[
            "golden",
            "write",
            "--prompts",
            prompts.to_str().unwrap(),
            "--steps",
            "2",
            "--out",
            suite.to_str().unwrap(),
        ],
        &[
            "long.golden.safetensors (1 of the suite's goldens written before it)",
            "--steps",
        ],
    );
    ok(&[&write[..], &["--steps", "3"]].concat());
    // a golden of a smaller budget compares with a longer one over the common steps
    let longer = dir.path().join("longer.golden.safetensors");
    let longer = longer.to_str().unwrap();
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "5", "--out", longer,
    ]);
    let run = ok(&["golden", "compare", longer, file]);
    assert!(
        run.stdout
            .contains("actual ran its whole budget and ended after 3"),
        "{}",
        run.stdout
    );
    let not_checked = |args: &[&str], needle: &str| {
        let run = fails(args, &[needle]);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        run
    };
    for flag in [
        &["--ep", "cuda"][..],
        &["--ort-threads", "1"],
        &["--cuda-graph", "on"],
    ] {
        let run = not_checked(
            &[&["golden", "check", file][..], flag].concat(),
            "sets up ONNX Runtime, which runs only with --onnx DIR",
        );
        assert!(
            run.stdout.contains("overall: NOT CHECKED"),
            "{}",
            run.stdout
        );
    }
    not_checked(
        &[
            "golden",
            "check",
            file,
            "--junit",
            dir.path().to_str().unwrap(),
        ],
        "cannot write",
    );
    // a golden of no steps (the library records one; the command line refuses to)
    let model = reference::io::builtin::builtin("tiny").unwrap();
    let empty = dir.path().join("empty.golden.safetensors");
    reference::golden::Golden::record_greedy(&model, "tiny", &[1, 2, 3], 0)
        .unwrap()
        .write(&empty)
        .unwrap();
    let empty = empty.to_str().unwrap();
    not_checked(
        &["golden", "check", empty],
        "records no step: there is nothing to check",
    );
    not_checked(&["golden", "compare", file, empty], "records no step");
}

/// Two writes of the same golden, or of the same logits, are the same bytes (the metadata's keys
/// sorted, not in a hash map's order): goldens committed to a repository change only with their
/// content. The files still read with the safetensors crate.
#[test]
fn goldens_and_logits_are_written_byte_for_byte_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let write = |kind: &str, i: usize| {
        let out = p(&format!("{kind}{i}.safetensors"));
        let args: &[&str] = match kind {
            "golden" => &["golden", "write", "--tokens", "1,2", "--steps", "2"],
            _ => &["logits", "--tokens", "1,2"],
        };
        ok(&[args, &["--out", &out]].concat());
        std::fs::read(&out).unwrap()
    };
    for kind in ["golden", "logits"] {
        let first = write(kind, 0);
        for i in 1..4 {
            assert!(write(kind, i) == first, "{kind} {i} differs from {kind} 0");
        }
        let (_, meta) = SafeTensors::read_metadata(&first).unwrap();
        assert!(meta.metadata().as_ref().unwrap().len() > 2, "{kind}");
        SafeTensors::deserialize(&first)
            .unwrap()
            .tensor("logits")
            .unwrap();
    }
    // and a golden so written checks
    ok(&["golden", "check", &p("golden0.safetensors")]);
}

/// A hand-edited golden is refused for what is wrong in it: an unknown mode by name (not for the
/// M2R2 metadata a mode would need), a token id outside the vocabulary by its tensor and step
/// (not by its position in the model's sequence).
#[test]
fn hand_edited_modes_and_ids_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.golden.safetensors");
    let file = path.to_str().unwrap();
    let write = [
        "golden", "write", "--tokens", "5,6,7", "--steps", "6", "--out", file,
    ];
    let not_checked = |edit: &dyn Fn(&mut RawFile), needle: &str| {
        ok(&write);
        edit_file(&path, edit);
        let run = fails(&["golden", "check", file], &[needle]);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
    };
    not_checked(
        &|(_, meta)| {
            meta.insert("mode".into(), "banana".into());
        },
        "unknown mode `banana` (expected greedy, early-exit or speculative)",
    );
    not_checked(
        &|(tensors, _)| {
            let tokens = tensors.iter_mut().find(|t| t.0 == "tokens").unwrap();
            tokens.3[32..40].copy_from_slice(&999i64.to_le_bytes());
        },
        "`tokens` holds token id 999 at step 4, outside the vocabulary of 320 tokens",
    );
}

/// What a golden holds is quoted escaped, as Rust's `{:?}` writes it (`gr\u{1}eedy`): on the
/// terminal (the table, stderr) and in JUnit, whose XML cannot hold a control character and
/// would drop it, so that the mode would read `greedy`. A model name the loader refuses too.
#[test]
fn control_characters_from_a_golden_are_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.golden.safetensors");
    let file = path.to_str().unwrap();
    let junit = dir.path().join("report.xml");
    let write = [
        "golden", "write", "--tokens", "5,6,7", "--steps", "2", "--out", file,
    ];
    for (key, value, says) in [
        (
            "mode",
            "gr\u{1}eedy",
            "unknown mode `gr\\u{1}eedy` (expected greedy, early-exit or speculative)",
        ),
        ("model", "ti\u{1b}[1mny", "unknown model `ti\\u{1b}[1mny`"),
    ] {
        ok(&write);
        edit_file(&path, |(_, meta)| {
            meta.insert(key.into(), value.into());
        });
        let run = fails(
            &["golden", "check", file, "--junit", junit.to_str().unwrap()],
            &[says],
        );
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        let xml = std::fs::read_to_string(&junit).unwrap();
        for (what, text) in [
            ("stdout", &run.stdout),
            ("stderr", &run.stderr),
            ("JUnit", &xml),
        ] {
            assert!(
                !text.contains(value) && !text.chars().any(|c| c.is_control() && c != '\n'),
                "{key}: {what} holds a control character:\n{text:?}"
            );
        }
        assert!(xml.contains(says), "{key}: {xml}");
    }
}

/// A JUnit report that cannot be written (`--junit` names a folder) is exit 2, and `--json` says
/// so as well: `status` `error`, `ok` false and the reason, for one golden, a suite (whose golden
/// itself stays `ok`) and a comparison; never `"ok": true` beside exit 2.
#[test]
fn an_unwritable_junit_report_makes_the_json_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    let path = suite.join("g.golden.safetensors");
    let (file, folder) = (path.to_str().unwrap(), suite.to_str().unwrap());
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "2", "--out", file,
    ]);
    let unwritable = dir.path().to_str().unwrap();
    for args in [
        &["golden", "check", file][..],
        &["golden", "check", folder],
        &["golden", "compare", file, file],
        &["golden", "compare", folder, folder],
    ] {
        let all = [args, &["--junit", unwritable, "--json"]].concat();
        let run = fails(&all, &[&format!("cannot write {unwritable}")]);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        let report = run.json();
        assert_eq!(report["status"], "error", "{args:?}: {report}");
        assert_eq!(report["ok"], false, "{args:?}: {report}");
        let error = report["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with(&format!("cannot write {unwritable}: ")),
            "{args:?}: {report}"
        );
        if args[2] == folder {
            assert_eq!(report["files"][0]["status"], "ok", "{args:?}: {report}");
        }
    }
}

/// `compare` names where two prompts part, by position (a prompt has no steps): the first that
/// differs, else the first the shorter one lacks, with both lengths; in the table, the JSON and
/// JUnit alike (never `at ?`).
#[test]
fn prompts_that_differ_are_named_by_position() {
    let dir = tempfile::tempdir().unwrap();
    let write = |tokens: &str| {
        let out = dir.path().join(format!("{tokens}.golden.safetensors"));
        let out = out.display().to_string();
        ok(&[
            "golden", "write", "--tokens", tokens, "--steps", "2", "--out", &out,
        ]);
        out
    };
    let (three, four, other) = (write("1,2,3"), write("1,2,3,4"), write("1,2,4"));
    let junit = dir.path().join("compare.xml");
    let junit = junit.to_str().unwrap();
    let line = |stdout: &str| -> String {
        let found = stdout.lines().find(|l| l.contains(" prompt_tokens "));
        found
            .unwrap_or_else(|| panic!("no prompt_tokens line:\n{stdout}"))
            .into()
    };
    let run = fails(
        &["golden", "compare", &three, &four, "--junit", junit],
        &["prompt_tokens NOT OK"],
    );
    let shorter = "first divergence at position 3: token golden (nothing: ended) vs actual ";
    let prompt = line(&run.stdout);
    assert!(
        prompt.contains(shorter) && prompt.ends_with("(prompts of 3 and 4 tokens)"),
        "{}",
        run.stdout
    );
    let xml = std::fs::read_to_string(junit).unwrap();
    assert!(xml.contains(shorter) && !xml.contains("at ?"), "{xml}");
    let report = fails(&["golden", "compare", &three, &four, "--json"], &[]).json();
    let entry = &report["entries"][0];
    assert_eq!(entry["name"], "prompt_tokens", "{report}");
    assert_eq!(entry["first"], "position 3", "{report}");
    assert_eq!(entry["at"], serde_json::json!([3]), "{report}");
    assert!(
        entry["description"].as_str().unwrap().contains(shorter),
        "{report}"
    );
    // prompts of one length: the position where they part
    let run = fails(
        &["golden", "compare", &three, &other],
        &["prompt_tokens NOT OK"],
    );
    let prompt = line(&run.stdout);
    assert!(
        prompt.contains("first divergence at position 2: token golden ")
            && !prompt.contains("step"),
        "{}",
        run.stdout
    );
}

/// NaN and infinities in logits: the same value at the same place is equal, so a golden with a
/// NaN logit compares OK with itself (as one with an infinity does); a NaN against a number is
/// NOT OK, its difference reported as NaN, not inf.
#[test]
fn non_finite_logits_compare_by_one_rule() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (g, odd) = (p("g.safetensors"), p("odd.safetensors"));
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "4", "--out", &g,
    ]);
    for value in [f32::INFINITY, f32::NAN] {
        std::fs::copy(&g, &odd).unwrap();
        set_f32(Path::new(&odd), "logits", 2 * 320 + 7, |_| value);
        let run = ok(&["golden", "compare", &odd, &odd]);
        assert!(
            run.stdout.contains("overall: OK"),
            "{value}: {}",
            run.stdout
        );
    }
    let run = fails(&["golden", "compare", &g, &odd], &["logits NOT OK"]);
    let line = run.stdout.lines().find(|l| l.contains(" logits ")).unwrap();
    assert!(
        line.contains("max abs diff NaN") && line.contains("worst NaN at [2, 7]"),
        "{}",
        run.stdout
    );
}

/// `golden check --json` reports the tolerance as the decimal given (`0.0001`, not the f32's
/// `9.999999747378752e-05`), the default's too.
#[test]
fn json_tolerances_are_the_decimals_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "2", "--out", file,
    ]);
    for extra in [&[][..], &["--atol", "0.0001", "--rtol", "0.3"]] {
        let report = ok(&[&["golden", "check", file, "--json"][..], extra].concat()).json();
        assert_eq!(report["atol"].as_f64(), Some(0.0001), "{report}");
        let rtol = if extra.is_empty() { 0.0 } else { 0.3 };
        assert_eq!(report["rtol"].as_f64(), Some(rtol), "{report}");
    }
}

/// `golden check` refuses bench's ONNX Runtime flags up front, naming the flag (the export is
/// not opened, nor blamed), and does not offer `--ort-compare`; `golden compare --help` describes
/// its own `--atol` default, without `check --onnx`'s.
#[test]
fn bench_flags_are_refused_by_name_and_compare_help_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let file = path.to_str().unwrap();
    ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "2", "--out", file,
    ]);
    let export = dir.path().join("no-export").display().to_string();
    for (flag, value, says) in [
        (
            "--ort-compare",
            "a:threads=1",
            "--ort-compare is for `m2r2 bench",
        ),
        (
            "--cuda-graph",
            "both",
            "--cuda-graph both is for `bench --onnx`",
        ),
    ] {
        let run = fails(
            &["golden", "check", file, "--onnx", &export, flag, value],
            &[says],
        );
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(!run.stderr.contains("cannot open export"), "{}", run.stderr);
    }
    let help = ok(&["golden", "check", "--help"]).stdout;
    assert!(
        !help.contains("--ort-compare") && help.contains("--cuda-graph"),
        "{help}"
    );
    let help = ok(&["golden", "compare", "--help"]).stdout;
    let atol = help.lines().find(|l| l.contains("--atol")).unwrap();
    assert!(
        atol.contains("the expected golden's pin, else 1e-4") && !atol.contains("--onnx"),
        "{help}"
    );
}

/// A suite's prompt ids name its files: an empty id, or one starting with a dot (`..` would
/// write `...golden.safetensors`), would name a hidden file and is refused, naming the line,
/// before anything is written.
#[test]
fn prompt_ids_that_would_name_hidden_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    let suite = dir.path().join("suite");
    for id in ["", "..", ".x"] {
        std::fs::write(
            &prompts,
            format!("{{\"id\": \"a\", \"prompt\": \"hi\"}}\n\n{{\"id\": \"{id}\", \"prompt\": \"hi\"}}\n"),
        )
        .unwrap();
        fails(
            &[
                "golden",
                "write",
                "--prompts",
                prompts.to_str().unwrap(),
                "--steps",
                "2",
                "--out",
                suite.to_str().unwrap(),
            ],
            &[
                "prompts.jsonl line 3",
                &format!("the prompt id {id:?} would name a hidden file"),
            ],
        );
        assert!(!suite.exists(), "{id:?}: nothing written");
    }
}
