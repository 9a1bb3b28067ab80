//! Goldens against deployments (docs/GOLDEN.md): `golden check --onnx` replays a greedy golden on
//! an ONNX export through ONNX Runtime, `golden compare` compares two golden files; perturbed
//! files, goldens of another model and files of different modes are reported or refused clearly
//! (M2R2 goldens on ONNX Runtime: golden_m2r2_onnx.rs).

use super::{fails, m2r2, ok};
use reference::golden::Golden;
use serde_json::Value;
use std::path::Path;

#[test]
fn check_on_onnx_runtime_and_compare_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (g, onnx) = (p("g.safetensors"), p("onnx"));
    ok(&[
        "golden", "write", "--model", "tiny", "--tokens", "1,2,3", "--steps", "6", "--out", &g,
    ]);
    ok(&["export", "--model", "tiny", "--out", &onnx]);

    // the export reproduces the reference's golden within the default tolerance
    let run = ok(&[
        "golden",
        "check",
        &g,
        "--onnx",
        &onnx,
        "--json",
        "--junit",
        &p("reports/ok.xml"), // its folder is created
    ]);
    let xml = std::fs::read_to_string(p("reports/ok.xml")).unwrap();
    assert!(
        xml.contains("tests=\"2\"") && xml.contains("failures=\"0\""),
        "{xml}"
    );
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    // the report names the runtime and its provider
    assert!(
        report["model"]
            .as_str()
            .unwrap()
            .contains("on ONNX Runtime 1."),
        "{report}"
    );
    assert_eq!(report["execution_provider"], "cpu", "{report}");
    assert!(report["onnxruntime"].as_str().unwrap().starts_with("1."));
    assert_eq!(report["entries"][0]["graph"], "model.onnx", "{report}");
    assert_eq!(report["tolerance_reason"], "f32 export default", "{report}");
    let logits = &report["entries"][0];
    assert_eq!(logits["name"], "logits");
    assert!(logits["max_abs"].as_f64().unwrap() < 1e-4, "{report}");
    assert_eq!(report["entries"][1]["name"], "tokens");
    // an impossible tolerance fails, naming the worst position
    let run = fails(
        &["golden", "check", &g, "--onnx", &onnx, "--atol", "0"],
        &["model.onnx logits NOT OK", "on export"],
    );
    if !run.stdout.contains("max abs diff 0.000e0") {
        assert!(
            run.stdout
                .contains("model.onnx               logits         NOT OK"),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout.contains("tolerance: atol 0e0 (--atol)"),
            "{}",
            run.stdout
        );
    }

    // an f16 export: outside the f32 default, inside the f16 one the check picks by itself
    let onnx16 = p("onnx16");
    ok(&[
        "export",
        "--model",
        "tiny",
        "--weights-dtype",
        "f16",
        "--out",
        &onnx16,
    ]);
    let run = ok(&["golden", "check", &g, "--onnx", &onnx16, "--json"]);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["atol"].as_f64(), Some(0.05), "{report}");
    assert!(
        report["entries"][0]["max_abs"].as_f64().unwrap() > 1e-4,
        "{report}"
    );
    assert!(report.get("worst_token_text").is_some(), "{report}");
    fails(
        &["golden", "check", &g, "--onnx", &onnx16, "--atol", "1e-4"],
        &["logits NOT OK"],
    );

    // compare: a file with itself, then a perturbed copy
    let run = ok(&["golden", "compare", &g, &g]);
    assert!(run.stdout.contains("overall: OK"), "{}", run.stdout);
    let mut perturbed = Golden::read(std::path::Path::new(&g)).unwrap();
    perturbed.logits[[2, 9]] += 0.5;
    perturbed
        .write(std::path::Path::new(&p("bad.safetensors")))
        .unwrap();
    let junit = p("report.xml");
    let run = fails(
        &[
            "golden",
            "compare",
            &g,
            &p("bad.safetensors"),
            "--json",
            "--junit",
            &junit,
        ],
        &["golden compare of", "logits NOT OK"],
    );
    // JUnit: one test case per tensor, the logits one failed
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("tests=\"3\"") && xml.contains("failures=\"1\""),
        "{xml}"
    );
    assert!(xml.contains("<testcase name=\"logits\""), "{xml}");
    assert!(
        xml.contains("<failure message=\"logits NOT OK: first over tolerance at step 2; 1 of 6 steps and 1 values over"),
        "{xml}"
    );
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(
        report["entries"][2]["at"],
        serde_json::json!([2, 9]),
        "{report}"
    );
    // within a loose relative tolerance it passes
    let want = f64::from(perturbed.logits[[2, 9]] - 0.5).abs();
    let rtol = format!("{}", 0.6 / want.max(1e-3));
    ok(&[
        "golden",
        "compare",
        &g,
        &p("bad.safetensors"),
        "--atol",
        "0",
        "--rtol",
        &rtol,
    ]);
    fails(
        &["golden", "compare", &g, &g, "--rtol", "-1"],
        &["--rtol must be"],
    );

    // refusals: a golden of another model, an export of another model, an M2R2 golden on ORT
    let moe = p("moe.safetensors");
    ok(&[
        "golden", "write", "--model", "tiny-moe", "--tokens", "1,2,3", "--steps", "6", "--out",
        &moe,
    ]);
    fails(
        &["golden", "compare", &g, &moe],
        &["different model configs"],
    );
    fails(
        &["golden", "check", &moe, "--onnx", &onnx],
        &["not the one this golden was recorded with"],
    );
    let spec = p("spec.safetensors");
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
        "--out",
        &spec,
    ]);
    fails(&["golden", "compare", &g, &spec], &["different modes"]);
    // a truncated file
    let bytes = std::fs::read(&g).unwrap();
    std::fs::write(p("cut.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let run = m2r2(&["golden", "compare", &g, &p("cut.safetensors")]);
    assert_eq!(run.code, Some(2), "could not compare: {}", run.stderr);
    assert!(run.stderr.contains("cut.safetensors"), "{}", run.stderr);
}

#[test]
fn suites_of_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        dir.path().join("prompts.jsonl"),
        "{\"id\": \"a/1\", \"prompt\": \"Hi\"}\n{\"id\": \"b\", \"prompt\": \"Count to 3.\"}\n",
    )
    .unwrap();
    let (suite, onnx) = (p("suite"), p("onnx"));
    let run = ok(&[
        "golden",
        "write",
        "--model",
        "tiny",
        "--prompts",
        &p("prompts.jsonl"),
        "--chat",
        "--steps",
        "4",
        "--out",
        &suite,
        "--json",
    ]);
    let written: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(written["files"].as_array().unwrap().len(), 2, "{written}");
    // one file per prompt, named by its id
    assert!(dir.path().join("suite/a_1.golden.safetensors").is_file());
    assert!(dir.path().join("suite/b.golden.safetensors").is_file());
    let run = ok(&["golden", "check", &suite]);
    assert!(
        run.stdout.contains("suite: 2 of 2 files OK"),
        "{}",
        run.stdout
    );
    ok(&["export", "--model", "tiny", "--out", &onnx]);
    let run = ok(&["golden", "check", &suite, "--onnx", &onnx, "--json"]);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["files"].as_array().unwrap().len(), 2, "{report}");

    // a perturbed member: compare names it; JUnit has one test suite per file
    let copy = p("copy");
    std::fs::create_dir(&copy).unwrap();
    for name in ["a_1.golden.safetensors", "b.golden.safetensors"] {
        std::fs::copy(
            dir.path().join("suite").join(name),
            dir.path().join("copy").join(name),
        )
        .unwrap();
    }
    let member = dir.path().join("copy/b.golden.safetensors");
    let mut g = Golden::read(&member).unwrap();
    g.logits[[1, 2]] += 1.0;
    g.write(&member).unwrap();
    let junit = p("suite.xml");
    let run = fails(
        &["golden", "compare", &suite, &copy, "--junit", &junit],
        &["b.golden.safetensors", "logits NOT OK"],
    );
    assert!(
        run.stdout.contains("suite: 1 of 2 files OK"),
        "{}",
        run.stdout
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testsuite ").count(), 2, "{xml}");
    assert!(xml.contains("failures=\"1\""), "{xml}");
    // a missing member, a file against a folder, an empty folder
    std::fs::remove_file(dir.path().join("copy/a_1.golden.safetensors")).unwrap();
    let run = fails(
        &["golden", "compare", &suite, &copy],
        &[
            "a_1.golden.safetensors has no counterpart",
            "b.golden.safetensors",
        ],
    );
    assert_eq!(run.code, Some(2), "a member not compared: {}", run.stderr);
    fails(
        &["golden", "compare", &suite, &p("copy/b.golden.safetensors")],
        &["a folder with a folder"],
    );
    std::fs::create_dir(p("empty")).unwrap();
    fails(
        &["golden", "check", &p("empty")],
        &["holds no golden files"],
    );
    fails(
        &[
            "golden",
            "write",
            "--model",
            "tiny",
            "--steps",
            "2",
            "--out",
            &p("x"),
        ],
        &["give a prompt"],
    );
}

/// Hand-edited files: a missing tensor and a wrong dtype are refused by `check` (with and without
/// `--onnx`) and `compare`, naming the file and the tensor; a GPU provider asked of the CPU-only
/// ONNX Runtime fails fast with a message, before any golden is replayed.
#[test]
fn hand_edited_goldens_and_unavailable_providers() {
    use safetensors::{Dtype, SafeTensors};
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (g, onnx) = (p("g.safetensors"), p("onnx"));
    ok(&[
        "golden", "write", "--model", "tiny", "--tokens", "1,2,3", "--steps", "4", "--out", &g,
    ]);
    ok(&["export", "--model", "tiny", "--out", &onnx]);
    // rewrite the golden with `edit` applied to its tensor list
    type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;
    let rewrite = |out: &str, edit: &dyn Fn(&mut Tensors)| {
        let bytes = std::fs::read(&g).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let mut owned: Tensors = st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
            .collect();
        edit(&mut owned);
        let views: Vec<(String, safetensors::tensor::TensorView)> = owned
            .iter()
            .map(|(n, d, s, b)| {
                let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
                (n.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, meta.metadata().clone(), Path::new(out)).unwrap();
    };
    let missing = p("missing.safetensors");
    rewrite(&missing, &|t| t.retain(|(n, ..)| n != "logits"));
    let wrong = p("wrong-dtype.safetensors");
    rewrite(&wrong, &|t| {
        let tokens = t.iter_mut().find(|(n, ..)| n == "tokens").unwrap();
        // I64 -> I32, keeping the values
        let ids: Vec<u8> = tokens
            .3
            .chunks(8)
            .flat_map(|c| (i64::from_le_bytes(c.try_into().unwrap()) as i32).to_le_bytes())
            .collect();
        (tokens.1, tokens.3) = (Dtype::I32, ids);
    });
    for (file, tensor) in [(&missing, "logits"), (&wrong, "tokens")] {
        for args in [
            vec!["golden", "check", file.as_str()],
            vec!["golden", "check", file.as_str(), "--onnx", &onnx],
            vec!["golden", "compare", &g, file.as_str()],
        ] {
            let run = fails(&args, &[file.as_str()]);
            assert!(run.stderr.contains(tensor), "{args:?}:\n{}", run.stderr);
        }
    }
    for ep in ["cuda", "tensorrt"] {
        let run = m2r2(&["golden", "check", &g, "--onnx", &onnx, "--ep", ep]);
        assert_eq!(run.code, Some(2), "--ep {ep}:\n{}", run.stderr);
        assert!(
            // (not a bare "OK": the temporary folder's random name may hold one)
            run.stderr.to_lowercase().contains(ep)
                && !run.stdout.contains(" OK ")
                && !run.stdout.contains("overall: OK"),
            "--ep {ep}:\n{}{}",
            run.stdout,
            run.stderr
        );
    }
}
