//! The five sabotages a golden check must catch, on tiny and on SmolLM2: a scaled
//! weight in model.onnx, a zeroed column in verifier.onnx and in draft.onnx, an f16 export
//! against a suite pinned to f32, and goldens of other M2R2 weights. Each ends in a report that
//! names the graph, the first failing step and the size, with the JUnit and JSON reports written
//! and the documented exit code (1 a mismatch, 2 could not check).

use m2r2_tests::sabotage::{SMOLLM2_TARGETS, TINY_TARGETS, Target, sabotage_export};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;

/// Runs the binary for one model (SmolLM2 from the real cache).
struct Suite<'a> {
    model: &'a str,
    env: Vec<(&'static str, &'a OsStr)>,
    dir: &'a Path,
}

impl Suite<'_> {
    fn p(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn run(&self, args: &[&str]) -> super::Run {
        super::m2r2_env(args, &self.env)
    }

    fn ok(&self, args: &[&str]) {
        let run = self.run(args);
        assert_eq!(run.code, Some(0), "m2r2 {args:?}:\n{}", run.stderr);
    }

    /// `golden check SUITE --onnx DIR --json --junit`: the exit code, the JSON report and the
    /// JUnit XML.
    fn check(&self, onnx: &str, junit: &str) -> (Option<i32>, Value, String) {
        let suite = self.p("suite");
        let junit = self.p(junit);
        let run = self.run(&[
            "golden", "check", &suite, "--onnx", onnx, "--json", "--junit", &junit,
        ]);
        let report: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("JSON report ({e}):\n{}\n{}", run.stdout, run.stderr));
        let xml = std::fs::read_to_string(&junit).expect("the JUnit report is always written");
        (run.code, report, xml)
    }
}

/// The entry `graph tensor` of the suite member `file`.
fn entry<'a>(report: &'a Value, file: &str, graph: &str, tensor: &str) -> &'a Value {
    let member = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["file"]
                .as_str()
                .unwrap()
                .ends_with(&format!("/{file}.golden.safetensors"))
        })
        .unwrap_or_else(|| panic!("no {file} in {report}"));
    member["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["graph"] == graph && e["name"] == tensor)
        .unwrap_or_else(|| panic!("no {graph} {tensor} in {member}"))
}

/// A sabotage caught: `graph tensor` NOT OK in `file`, at its first failing row, by more than
/// the tolerance; the JUnit case of that graph and tensor a failure naming where.
fn assert_caught(report: &Value, xml: &str, file: &str, graph: &str, tensor: &str) {
    let e = entry(report, file, graph, tensor);
    assert_eq!(e["status"], "NOT OK", "{e}");
    let first = e["first"]
        .as_str()
        .unwrap_or_else(|| panic!("no first row: {e}"));
    assert!(e["rows_over"].as_u64().unwrap() >= 1, "{e}");
    assert!(e["max_abs"].as_f64().unwrap() > 1e-3, "{e}");
    assert!(
        e["description"]
            .as_str()
            .unwrap()
            .starts_with(&format!("first over tolerance at {first}")),
        "{e}"
    );
    let failure = format!("<failure message=\"{graph} {tensor} NOT OK: first over tolerance at");
    assert!(xml.contains(&failure), "{failure}:\n{xml}");
}

/// The five sabotages on `model`'s exports (f32 and f16), with a greedy and a speculative golden
/// pinned to f32.
fn five_sabotages(suite: &Suite, targets: &[Target; 3], prompt: &[&str], other_m2r2: &[&str]) {
    let model = suite.model;
    let (onnx, onnx16) = (suite.p("onnx"), suite.p("onnx16"));
    suite.ok(&["export", "--model", model, "--out", &onnx]);
    suite.ok(&[
        "export",
        "--model",
        model,
        "--weights-dtype",
        "f16",
        "--out",
        &onnx16,
    ]);
    let write = |file: &str, extra: &[&str]| {
        let out = suite.p(&format!("suite/{file}"));
        let mut args = vec!["golden", "write", "--model", model, "--expect-dtype", "f32"];
        args.extend_from_slice(prompt);
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", &out]);
        suite.ok(&args);
    };
    write("greedy.golden.safetensors", &["--steps", "8"]);
    write(
        "spec.golden.safetensors",
        &["--steps", "16", "--mode", "speculative"],
    );
    let (code, report, xml) = suite.check(&onnx, "clean.xml");
    assert_eq!(
        (code, &report["status"]),
        (Some(0), &Value::from("ok")),
        "{report}"
    );
    assert!(xml.contains("failures=\"0\" errors=\"0\""), "{xml}");

    // 1-3: a scaled weight in model.onnx, a zeroed column in verifier.onnx and in draft.onnx
    let caught: [&[(&str, &str)]; 3] = [
        &[("greedy", "logits"), ("spec", "logits")],
        &[("spec", "verify_logits")],
        &[("spec", "draft_logits")],
    ];
    for (target, caught) in targets.iter().zip(caught) {
        let broken = suite.p(&format!("broken-{}", target.graph));
        sabotage_export(
            Path::new(&onnx),
            Path::new(&broken),
            target.graph,
            target.initializer,
            target.how,
        )
        .unwrap();
        let (code, report, xml) = suite.check(&broken, &format!("{}.xml", target.graph));
        assert_eq!(code, Some(1), "{} sabotaged: {report}", target.graph);
        for (file, tensor) in caught {
            assert_caught(&report, &xml, file, target.graph, tensor);
        }
        // every NOT OK line is the sabotaged graph's (or the decode it takes part in)
        for member in report["files"].as_array().unwrap() {
            for e in member["entries"].as_array().unwrap() {
                if e["status"] == "NOT OK" {
                    // (a bridged draft reads the verifier's final states, and says so)
                    let graph = e["graph"].as_str().unwrap();
                    let through_bridge = target.graph == "verifier.onnx"
                        && graph == "draft.onnx"
                        && e["note"]
                            .as_str()
                            .unwrap()
                            .contains("reads verifier.onnx's final_states");
                    // a decode's lines name every graph it runs: `feed+draft+verifier.onnx`
                    let stem = target.graph.trim_end_matches(".onnx");
                    let in_decode = graph
                        .trim_end_matches(".onnx")
                        .split('+')
                        .any(|g| g == stem);
                    assert!(
                        in_decode || through_bridge,
                        "{} sabotaged: {e}",
                        target.graph
                    );
                }
            }
        }
        std::fs::remove_dir_all(&broken).unwrap();
    }

    // 4: an f16 export against the suite pinned to f32: not checked, each golden an <error>
    let (code, report, xml) = suite.check(&onnx16, "f16.xml");
    assert_eq!(code, Some(2), "{report}");
    for member in report["files"].as_array().unwrap() {
        assert_eq!(member["status"], "error", "{member}");
        let error = member["error"].as_str().unwrap();
        assert!(
            error.contains(
                "the export holds f16 weights, the suite expects f32 (pinned in the golden)"
            ),
            "{error}"
        );
    }
    assert_eq!(
        xml.matches("<error message=\"not checked: ").count(),
        2,
        "{xml}"
    );
    // on the command line the pin can be overridden, with a tolerance for it
    let run = suite.run(&[
        "golden",
        "check",
        &suite.p("suite"),
        "--onnx",
        &onnx16,
        "--expect-dtype",
        "f16",
        "--atol",
        "0.05",
    ]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("tolerance: atol 5e-2 (--atol)"),
        "{}",
        run.stdout
    );

    // 5: goldens of other M2R2 weights: refused, an <error> naming why, exit 2
    let other = suite.p("other.golden.safetensors");
    let mut args = vec![
        "golden",
        "write",
        "--model",
        model,
        "--steps",
        "4",
        "--mode",
        "speculative",
    ];
    args.extend_from_slice(prompt);
    args.extend_from_slice(other_m2r2);
    args.extend_from_slice(&["--out", &other]);
    suite.ok(&args);
    let junit = suite.p("other.xml");
    let run = suite.run(&[
        "golden", "check", &other, "--onnx", &onnx, "--json", "--junit", &junit,
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["status"], "error", "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("not the ones this golden was recorded with"),
        "{report}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("errors=\"1\"") && xml.contains("<error message=\"not checked: "),
        "{xml}"
    );
}

#[test]
fn five_sabotages_on_tiny() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-m2r2").display().to_string();
    super::ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        "7",
        "--out",
        &other,
    ]);
    let suite = Suite {
        model: "tiny",
        env: vec![],
        dir: dir.path(),
    };
    five_sabotages(
        &suite,
        &TINY_TARGETS,
        &["--tokens", "1,2,3"],
        &["--m2r2", &other],
    );
}

/// The same on SmolLM2 with its shipped M2R2 weights (the real m2r2 cache, where
/// scripts/test.sh fetched it), a chat prompt; the other weights seeded random.
#[test]
fn five_sabotages_on_smollm2() {
    let cache = reference::io::hub::cache_dir();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-m2r2").display().to_string();
    let suite = Suite {
        model: "smollm2",
        env: vec![("M2R2_CACHE", cache.as_os_str())],
        dir: dir.path(),
    };
    suite.ok(&[
        "init-m2r2",
        "--model",
        "smollm2",
        "--seed",
        "7",
        "--out",
        &other,
    ]);
    let prompt = ["--prompt", "Why is the sky blue?", "--chat"];
    five_sabotages(&suite, &SMOLLM2_TARGETS, &prompt, &["--m2r2", &other]);
}
