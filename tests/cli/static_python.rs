//! The Python example for static exports: python/examples/onnxruntime_static.py
//! decodes `export --static-cache 64` folders of tiny and tiny-moe with ONNX Runtime's IoBinding,
//! the KV buffers updated in place (no "in-place optimization not activated" warning), to the
//! tokens of `m2r2 run --onnx`; it refuses a dynamic export, a folder without model.onnx, a
//! decode past its buffers, token ids outside the vocabulary, a provider its onnxruntime lacks, a
//! manifest whose `l_max` is not the graph's and a model.onnx ONNX Runtime cannot load, naming
//! why.
//!
//! Needs `M2R2_PYTHON` (numpy and onnxruntime; see golden_python.rs).

use super::golden_python::python;
use std::path::Path;
use std::process::{Command, Output};

/// Run the example on `folder` with `args`.
fn example(folder: &str, args: &[&str]) -> Output {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("python/examples/onnxruntime_static.py");
    Command::new(python())
        .arg(script)
        .arg(folder)
        .args(args)
        .env_remove("PYTHONPATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONNOUSERSITE", "1")
        .output()
        .expect("M2R2_PYTHON runs")
}

/// Run the example, require failure and every `needle` in its stderr.
fn refused(folder: &str, args: &[&str], needles: &[&str]) {
    let out = example(folder, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} on {folder} should fail");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    assert!(!stderr.contains("Traceback"), "{stderr}");
}

#[test]
fn static_python_example_decodes_like_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = ["--tokens", "1,2,3", "--max-new-tokens", "12"];
    for model in ["tiny", "tiny-moe"] {
        let out = dir.path().join(model);
        let s = out.to_str().unwrap();
        super::ok(&[
            "export",
            "--model",
            model,
            "--out",
            s,
            "--static-cache",
            "64",
        ]);
        let want = super::ok(&[&["run", "--onnx", s, "--json"][..], &prompt].concat()).json();

        let run = example(s, &[&prompt[..], &["--ignore-eos"]].concat());
        let (stdout, stderr) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        assert!(
            run.status.success(),
            "{model}: the example failed:\n{stderr}"
        );
        let last = stdout.lines().last().unwrap_or_default();
        let got: serde_json::Value = serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{model}: last line is not JSON ({e}):\n{stdout}"));
        assert_eq!(got, want["tokens"], "{model}");
        assert_eq!(super::ids(&got).len(), 12, "{model}");
        assert!(
            !stderr.contains("in-place optimization not activated"),
            "{model}: the KV buffers were copied, not updated in place:\n{stderr}"
        );
    }

    // a decode past the buffers: 3 + 62 - 1 = 64 positions fit, 3 + 63 - 1 do not
    let tiny = dir.path().join("tiny");
    let t = tiny.to_str().unwrap();
    let fits = example(
        t,
        &[
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "62",
            "--ignore-eos",
        ],
    );
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
    refused(
        t,
        &["--tokens", "1,2,3", "--max-new-tokens", "63"],
        &[
            "the static cache holds 64 positions and this decode needs 65",
            "export with a larger --static-cache",
        ],
    );

    // token ids outside the vocabulary: ONNX's Gather would read -1 as the last row
    for (ids, bad) in [("1,2,-1", "-1"), ("1,320", "320")] {
        refused(
            t,
            &["--tokens", ids],
            &[
                &format!("token id {bad} at position"),
                "the vocabulary of",
                "has 320 tokens",
            ],
        );
    }
    // a provider this onnxruntime lacks is refused, not replaced by the CPU with a warning
    refused(
        t,
        &["--tokens", "1,2,3", "--provider", "NoSuchExecutionProvider"],
        &[
            "--provider NoSuchExecutionProvider",
            "this onnxruntime build offers",
        ],
    );

    // a dynamic export is refused by name
    let dynamic = dir.path().join("dynamic");
    let d = dynamic.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", d]);
    refused(d, &prompt, &["not a static export", "--static-cache"]);

    // a static export without model.onnx (only the draft) is refused by name, not a KeyError
    let draft_only = dir.path().join("draft-only");
    let s = draft_only.to_str().unwrap();
    super::ok(&[
        "export",
        "--model",
        "tiny",
        "--out",
        s,
        "--static-cache",
        "64",
        "--graphs",
        "draft",
    ]);
    refused(s, &prompt, &["has no model.onnx", "--graphs model"]);

    // a manifest whose l_max is not the graph's buffers, and a truncated model.onnx: one line
    // naming the file, not ONNX Runtime's traceback
    let copy = |name: &str, edit: &dyn Fn(&Path)| {
        let out = dir.path().join(name);
        std::fs::create_dir(&out).unwrap();
        for entry in std::fs::read_dir(&tiny).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
        }
        edit(&out);
        out.display().to_string()
    };
    for l_max in [16, 128] {
        let other = copy(&format!("l{l_max}"), &|d| {
            let path = d.join("m2r2_export.json");
            let text = std::fs::read_to_string(&path).unwrap();
            let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
            m["static_cache"]["l_max"] = l_max.into();
            std::fs::write(&path, m.to_string()).unwrap();
        });
        refused(
            &other,
            &prompt,
            &[
                "model.onnx: m2r2_export.json says static_cache.l_max",
                &format!("= {l_max}, but the graph's past_key_values.0.key holds 64 positions"),
            ],
        );
    }
    let truncated = copy("truncated", &|d| {
        let model = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join("model.onnx"))
            .unwrap();
        model.set_len(1000).unwrap();
    });
    refused(
        &truncated,
        &prompt,
        &[
            "truncated/model.onnx: ONNX Runtime cannot load this graph",
            "export the folder again",
        ],
    );
}
