//! The Python package `python/`: it pip-installs without writing into `python/`, its unit tests
//! pass on goldens the reference wrote (format version 3, and token trees of versions 4 and 5,
//! which it reads), a golden it writes
//! from ONNX Runtime's Python API (the example script on an export of `tiny`) passes `m2r2 golden
//! compare` against the reference's, while a perturbed one fails naming the perturbed logit, and
//! speculative goldens it writes (a chain; token trees, fixed and grown with a lookup branch)
//! compare with the reference's.
//!
//! Needs `M2R2_PYTHON`: a Python with the packages of scripts/onnx-check/requirements.txt
//! (onnxruntime, numpy, safetensors, setuptools), set up by scripts/test.sh.

use super::{fails, ok};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Rewrites the reference's speculative golden (argv 1) with the package, as a deployment's harness
/// would record it: format 3 with the graphs' logits (argv 2), format 2 with the rounds alone
/// (argv 3).
const WRITE_SPECULATIVE: &str = "\
import sys
import m2r2_golden
ref, v3, v2 = sys.argv[1:]
g = m2r2_golden.read(ref)
rounds = {k: getattr(g, k) for k in ('prompt_tokens', 'tokens', 'logits', 'round_drafted',
                                     'round_accepted', 'round_base_token', 'round_scores')}
m2r2_golden.write_speculative(v3, like=g, verify_logits=g.verify_logits,
                              draft_logits=g.draft_logits, stop_tokens=g.stop_tokens,
                              max_steps=g.max_steps, **rounds)
m2r2_golden.write_speculative(v2, like=g, **rounds)
";

/// Rewrites the reference's token-tree golden (argv 1) with `write_tree` from its own rounds, as a
/// deployment running token trees would record its decode (argv 2).
const WRITE_TREE: &str = "\
import sys
import numpy as np
import m2r2_golden
ref, out = sys.argv[1:]
g = m2r2_golden.read(ref)
trees = g.round_trees
extra = {}
if g.round_lookup is not None:
    extra['round_lookup'] = [[int(i) for i in row if i >= 0] for row in g.round_lookup]
    extra['round_scores'] = [[float(x) for x in row if not np.isnan(x)] for row in g.round_scores]
m2r2_golden.write_tree(
    out, like=g, prompt_tokens=g.prompt_tokens, tokens=g.tokens, logits=g.logits,
    round_trees=[t.parents for t in trees],
    round_tree_tokens=[list(g.round_tree_tokens[k][:t.nodes]) for k, t in enumerate(trees)],
    round_node=g.round_node, round_accepted=g.round_accepted, round_base_token=g.round_base_token,
    verify_logits=g.verify_logits, draft_logits=g.draft_logits, stop_tokens=g.stop_tokens,
    max_steps=g.max_steps, **extra)
";

/// The interpreter with the pinned packages (`M2R2_PYTHON`, set by scripts/test.sh).
pub(super) fn python() -> PathBuf {
    match std::env::var_os("M2R2_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "M2R2_PYTHON is not set: the Python package's tests need a Python with \
             scripts/onnx-check/requirements.txt installed (scripts/test.sh sets it up; by hand: \
             python3 -m venv V && V/bin/pip install -r scripts/onnx-check/requirements.txt && \
             export M2R2_PYTHON=V/bin/python)"
        ),
    }
}

/// Run `M2R2_PYTHON args` with `env`, require success, return stdout and stderr together.
fn run_python(args: &[&OsStr], env: &[(&str, &OsStr)]) -> String {
    let out = Command::new(python())
        .args(args)
        .env_remove("PYTHONPATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONNOUSERSITE", "1")
        .envs(env.iter().copied())
        .output()
        .expect("M2R2_PYTHON runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python {args:?} failed:\n{text}");
    text
}

/// Every path under `dir`, relative and sorted: the source tree a build must leave as it found it.
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                folders.push(entry.path());
            }
            paths.push(entry.path().strip_prefix(dir).unwrap().to_path_buf());
        }
    }
    paths.sort();
    paths
}

/// Fail naming what appeared in or vanished from `dir` since `before` was listed.
fn assert_unchanged(dir: &Path, before: &[PathBuf], when: &str) {
    let after = listing(dir);
    let added: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    let removed: Vec<_> = before.iter().filter(|p| !after.contains(p)).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "{when} changed {}: added {added:?}, removed {removed:?}",
        dir.display()
    );
}

#[test]
fn python_package_writes_goldens_that_compare() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let s = |name: &str| p(name).display().to_string();

    // pip-installable straight from python/ into a target folder, leaving the venv as it is, and
    // out of tree (python/setup.py): the source folder gains no build/ or *.egg-info
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let sources = listing(&pkg);
    let site = p("site");
    run_python(
        &[
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            s("site").as_str(),
            pkg.to_str().expect("a UTF-8 path"),
        ]
        .map(OsStr::new),
        &[],
    );
    assert!(site.join("m2r2_golden").join("__init__.py").is_file());
    assert_unchanged(&pkg, &sources, "pip install");
    let with_site = [("PYTHONPATH", site.as_os_str())];

    // the reference's goldens and the export
    let (reference, speculative, early_exit, onnx) = (
        s("ref.golden.safetensors"),
        s("spec.golden.safetensors"),
        s("exit.golden.safetensors"),
        s("tiny-onnx"),
    );
    ok(&[
        "golden", "write", "--model", "tiny", "--tokens", "1,2,3", "--steps", "6", "--out",
        &reference,
    ]);
    ok(&[
        "golden",
        "write",
        "--model",
        "tiny",
        "--tokens",
        "1,2,3",
        "--steps",
        "6",
        "--mode",
        "speculative",
        "--draft-len",
        "2",
        "--out",
        &speculative,
    ]);
    ok(&[
        "golden",
        "write",
        "--model",
        "tiny",
        "--tokens",
        "1,2,3",
        "--steps",
        "6",
        "--mode",
        "early-exit",
        "--out",
        &early_exit,
    ]);
    // token-tree goldens: a fixed tree (format 4), grown with a lookup branch (format 5)
    let (tree, grown_tree) = (s("tree.golden.safetensors"), s("grown.golden.safetensors"));
    let speculative_tree = |prompt: &str, steps: &str, out: &str, extra: &[&str]| {
        let args = [
            "golden",
            "write",
            "--model",
            "tiny",
            "--tokens",
            prompt,
            "--steps",
            steps,
            "--mode",
            "speculative",
            "--draft-tree",
            "2,1,1",
            "--out",
            out,
        ];
        ok(&[&args[..], extra].concat());
    };
    speculative_tree("1,2,3", "6", &tree, &[]);
    speculative_tree(
        "1,2,3,4,1,2,3",
        "20",
        &grown_tree,
        &["--dynamic-draft", "--prompt-lookup", "3"],
    );
    ok(&["export", "--model", "tiny", "--out", &onnx]);

    // the package's unit tests (from python/tests, no bytecode written there), on the installed copy
    let tests = pkg.join("tests");
    let report = run_python(
        &[
            OsStr::new("-m"),
            OsStr::new("unittest"),
            OsStr::new("discover"),
            OsStr::new("-v"),
            OsStr::new("-s"),
            tests.as_os_str(),
        ],
        &[
            with_site[0],
            ("M2R2_GOLDEN_GREEDY", OsStr::new(&reference)),
            ("M2R2_GOLDEN_SPECULATIVE", OsStr::new(&speculative)),
            ("M2R2_GOLDEN_EARLY_EXIT", OsStr::new(&early_exit)),
            ("M2R2_GOLDEN_TREE", OsStr::new(&tree)),
            ("M2R2_GOLDEN_GROWN_TREE", OsStr::new(&grown_tree)),
        ],
    );
    println!("{report}");
    assert!(report.contains("\nOK"), "{report}");
    assert!(
        report.contains("test_truncated_and_corrupt_files"),
        "{report}"
    );

    // ONNX Runtime's Python API decodes the reference's prompt; the package writes its golden
    let script = pkg.join("examples").join("onnxruntime_greedy.py");
    let example = |out: &str, perturb: Option<&str>| {
        let mut args = vec![
            script.as_os_str(),
            OsStr::new("--export"),
            OsStr::new(&onnx),
            OsStr::new("--like"),
            OsStr::new(&reference),
            OsStr::new("--out"),
            OsStr::new(out),
        ];
        if let Some(perturb) = perturb {
            args.extend([OsStr::new("--perturb"), OsStr::new(perturb)]);
        }
        println!("{}", run_python(&args, &with_site));
    };
    let actual = s("actual.golden.safetensors");
    example(&actual, None);
    let run = ok(&["golden", "compare", &reference, &actual, "--atol", "2e-4"]);
    println!("{}", run.stdout);
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| {
            ["prompt_tokens ", "tokens ", "logits "]
                .iter()
                .any(|t| l.trim_start().starts_with(t))
        })
        .collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    for line in lines {
        assert!(
            line.contains(" OK ") && !line.contains("NOT OK"),
            "{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
    // the header says who wrote each file
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        run.stdout.contains(&format!("written by m2r2 {version}; "))
            && run.stdout.contains("written by m2r2-golden-python "),
        "{}",
        run.stdout
    );

    // one logit moved by 1e-2: compare fails and names it
    let perturbed = s("perturbed.golden.safetensors");
    example(&perturbed, Some("1,7,0.01"));
    let run = fails(
        &[
            "golden", "compare", &reference, &perturbed, "--atol", "2e-4",
        ],
        &["logits NOT OK"],
    );
    let logits = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("logits "))
        .unwrap_or_else(|| panic!("no logits line:\n{}", run.stdout));
    assert!(
        logits.contains("NOT OK") && logits.contains("at [1, 7]"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("overall: NOT OK"), "{}", run.stdout);
    // a provider this onnxruntime lacks is refused, not replaced by the CPU with a warning
    let missing = Command::new(python())
        .arg(&script)
        .args([
            "--export",
            &onnx,
            "--like",
            &reference,
            "--out",
            &s("no.golden"),
        ])
        .args(["--provider", "NoSuchExecutionProvider"])
        .envs(with_site.iter().copied())
        .output()
        .expect("M2R2_PYTHON runs");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success(), "{stderr}");
    assert!(
        stderr.contains("--provider NoSuchExecutionProvider: this onnxruntime build offers"),
        "{stderr}"
    );
    assert!(!Path::new(&s("no.golden")).exists());
    let run = fails(
        &[
            "golden", "compare", &reference, &perturbed, "--atol", "2e-4", "--json",
        ],
        &["logits NOT OK"],
    );
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let entry = &report["entries"][2];
    assert_eq!(entry["name"], "logits", "{report}");
    assert_eq!(entry["ok"], false, "{report}");
    assert_eq!(entry["at"], serde_json::json!([1, 7]), "{report}");
    let max_abs = entry["max_abs"].as_f64().unwrap();
    assert!((max_abs - 1e-2).abs() < 2e-4, "{report}");
    for other in &report["entries"].as_array().unwrap()[..2] {
        assert_eq!(other["ok"], true, "{report}");
    }

    // a speculative golden the package writes compares with the reference's round by round and
    // graph by graph; without the graphs' logits (format 2) the graphs' lines are skipped
    let (spec_v3, spec_v2) = (
        s("py-spec.golden.safetensors"),
        s("py-spec-v2.golden.safetensors"),
    );
    run_python(
        &["-c", WRITE_SPECULATIVE, &speculative, &spec_v3, &spec_v2].map(OsStr::new),
        &with_site,
    );
    for (file, graphs) in [(&spec_v3, " OK "), (&spec_v2, " SKIPPED ")] {
        let run = ok(&["golden", "compare", &speculative, file]);
        let line = |name: &str| {
            let found = run
                .stdout
                .lines()
                .find(|l| l.trim_start().starts_with(name));
            found.unwrap_or_else(|| panic!("no {name}line:\n{}", run.stdout))
        };
        assert!(line("rounds ").contains(" OK "), "{}", run.stdout);
        for name in ["verify_logits ", "draft_logits "] {
            assert!(line(name).contains(graphs), "{}", run.stdout);
        }
        assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
    }
    // token trees written by the package compare with the reference's and check on it
    for golden in [&tree, &grown_tree] {
        let mine = format!("{golden}.python");
        run_python(
            &["-c", WRITE_TREE, golden.as_str(), &mine].map(OsStr::new),
            &with_site,
        );
        let run = ok(&["golden", "compare", golden, &mine]);
        assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
        assert!(!run.stdout.contains("NOT OK"), "{}", run.stdout);
        let run = ok(&["golden", "check", &mine]);
        assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
    }
    assert_unchanged(&pkg, &sources, "the package's tests and example");
}
