//! `info` and `bench`: the model description and the bench reports (shapes only, no timing asserted).

use super::{fails, ok};
use reference::io::builtin::tiny_config;
use serde_json::Value;

#[test]
fn info_json_describes_the_model() {
    let info = ok(&["info", "--json"]).json();
    assert_eq!(info["parameter_count"], tiny_config().parameter_count());
    assert_eq!(info["layers"].as_array().unwrap().len(), 8);
    assert_eq!(info["context_length"], 512);
    assert_eq!(info["tokenizer"]["vocab_size"], 320);
    let moe = ok(&["info", "--model", "tiny-moe", "--json"]).json();
    assert_eq!(moe["layers"][0]["ffn"]["kind"], "moe");
    let text = ok(&["info"]).stdout;
    assert!(
        text.contains("parameters") && text.contains("dense SwiGLU"),
        "{text}"
    );
    // The M2R2 weights decoding uses: tiny's seeded ones, gates after layers 2, 4, 6 of 8.
    let m2r2 = &info["m2r2"];
    assert_eq!(m2r2["source"], "builtin (seeded random)");
    let after: Vec<&Value> = m2r2["gates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["after_layer"])
        .collect();
    assert_eq!(after, [2, 4, 6]);
    assert!(
        text.contains("M2R2 weights") && text.contains("drafting"),
        "{text}"
    );
    fails(
        &["info", "--m2r2", "/nonexistent/m2r2"],
        &["cannot load the M2R2 weights folder `/nonexistent/m2r2` (--m2r2)"],
    );
}

#[test]
fn bench_reports_bandwidth() {
    let b = ok(&[
        "bench",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
        "--json",
    ])
    .json();
    for key in [
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
        "memory_read_bytes_per_second",
        "achieved_fraction",
    ] {
        assert!(b[key].as_f64().unwrap() > 0.0, "{key}: {b}");
    }
    assert!(b["threads"].as_u64().unwrap() >= 1);
    assert!(b["bytes_per_token"].as_u64().unwrap() > 4 * 320 * 64);
}

/// `bench --cost-shape --json`: every step kind and verify size, ratios against the greedy step,
/// the bandwidth, batched decoding at B = 1, 4, 16 and training rows/s (no timing is asserted,
/// only the shape).
#[test]
fn bench_cost_shape_reports_every_step() {
    let b = ok(&[
        "bench",
        "--cost-shape",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
        "--json",
    ])
    .json();
    let engines = b["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1, "{b}");
    let e = &engines[0];
    assert_eq!(e["engine"], "reference");
    for key in [
        "greedy_step_ms",
        "draft_step_ms",
        "feed_step_ms",
        "achieved_fraction",
    ] {
        assert!(e[key].as_f64().unwrap() > 0.0, "{key}: {b}");
    }
    let rows: Vec<u64> = e["verify_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    assert_eq!(rows, [1, 2, 5, 9, 16]);
    let batches: Vec<u64> = b["batched_decoding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 4, 16]);
    let t = &b["training"];
    assert_eq!(b["training_skipped"], Value::Null, "{b}");
    assert_eq!(t["rows_per_step"], 64, "{b}");
    assert_eq!(t["gate"], b["draft_gate"], "{b}");
    assert!(t["rows_per_second"].as_f64().unwrap() > 0.0, "{b}");
    assert!(b["memory_read_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(["portable", "avx2", "avx512", "neon"].contains(&b["kernel"].as_str().unwrap()));
    fails(
        &["bench", "--cost-shape", "--speculative"],
        &["--cost-shape", "--speculative"],
    );
}

/// `bench --cost-shape` on an MoE model, whose adapters the trainer cannot train: the table is
/// printed, the training row left out with a note saying why; --json says so in
/// `training_skipped` (with `training` null) instead of omitting it.
#[test]
fn bench_cost_shape_leaves_out_training_the_trainer_refuses() {
    let args = [
        "bench",
        "--model",
        "tiny-moe",
        "--cost-shape",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
    ];
    let text = ok(&args).stdout;
    assert!(
        text.contains("greedy step") && text.contains("verify 16"),
        "{text}"
    );
    assert!(
        text.contains("training gate 1: not measured, tiny-moe's adapters cannot be trained")
            && text.contains("sparse MoE block"),
        "{text}"
    );
    let b = ok(&[&args[..], &["--json"]].concat()).json();
    assert_eq!(b["engines"].as_array().unwrap().len(), 1, "{b}");
    assert_eq!(b["training"], Value::Null, "{b}");
    let why = b["training_skipped"].as_str().unwrap();
    assert!(why.contains("sparse MoE block"), "{b}");
}

/// `bench --cost-shape` refuses sizes that do not fit the context before measuring anything,
/// naming the flag at fault, the positions needed and the context; a huge --repeats saturates
/// instead of wrapping around.
#[test]
fn bench_cost_shape_names_the_size_that_does_not_fit() {
    let bench = |prompt: &str, decode: &str, repeats: &str| {
        [
            "bench",
            "--cost-shape",
            "--prompt-len",
            prompt,
            "--decode-tokens",
            decode,
            "--repeats",
            repeats,
            "--bandwidth-mib",
            "8",
        ]
        .map(String::from)
    };
    let fails_with = |args: [String; 10], needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needles)
    };
    // 2 + 600 + 1 positions for the greedy rounds
    let run = fails_with(
        bench("2", "2", "600"),
        &[
            "--repeats 600 does not fit with --prompt-len 2",
            "need 603 positions",
            "context of tiny (512)",
            "--repeats must be at most 509",
        ],
    );
    assert!(!run.stderr.contains("leaves no room"), "{}", run.stderr);
    fails_with(
        bench("2", "2", &usize::MAX.to_string()),
        &[
            &format!("--repeats {} does not fit", usize::MAX),
            "context of tiny (512)",
        ],
    );
    // the largest --repeats that fits is accepted by the check (the run itself is not started:
    // --decode-tokens does not fit)
    fails_with(
        bench("2", "600", "509"),
        &["--prompt-len 2 and --decode-tokens 600 need 601 positions"],
    );
    fails_with(
        bench("500", "2", "1"),
        &[
            "--prompt-len 500 leaves no room for the verify chunk of 16 rows",
            "need 517 positions",
            "context of tiny (512)",
            "--prompt-len must be at most 495",
        ],
    );
    fails_with(
        bench("400", "200", "1"),
        &[
            "--prompt-len 400 and --decode-tokens 200 need 599 positions",
            "context of tiny (512)",
        ],
    );
}

/// `info --onnx` reports what the graphs contradict, and exits non-zero: an empty graph file, a
/// manifest whose static cache length is not the graphs' buffers, an external data file shorter
/// than its graph's initializers reach. A sound export has no problem.
#[test]
fn info_onnx_reports_what_the_graphs_contradict() {
    let dir = tempfile::tempdir().unwrap();
    let sound = dir.path().join("sound");
    let s = sound.to_str().unwrap();
    ok(&[
        "export",
        "--model",
        "tiny",
        "--static-cache",
        "16",
        "--external-data",
        "--out",
        s,
    ]);
    let info = ok(&["info", "--onnx", s, "--json"]).json();
    assert_eq!(info["problems"], serde_json::json!([]), "{info}");
    // a copy of the sound export, broken by `edit`
    let broken = |name: &str, edit: &dyn Fn(&std::path::Path)| {
        let out = dir.path().join(name);
        std::fs::create_dir(&out).unwrap();
        for entry in std::fs::read_dir(&sound).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
        }
        edit(&out);
        out.display().to_string()
    };
    let empty = broken("empty", &|d| {
        std::fs::write(d.join("verifier.onnx"), b"").unwrap()
    });
    let run = fails(
        &["info", "--onnx", &empty],
        &["verifier.onnx holds no graph (0 bytes"],
    );
    assert!(run.stdout.contains("problem"), "{}", run.stdout);
    let longer = broken("longer", &|d| {
        let path = d.join("m2r2_export.json");
        let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        m["static_cache"]["l_max"] = 64.into();
        std::fs::write(&path, m.to_string()).unwrap();
    });
    let run = fails(
        &["info", "--onnx", &longer, "--json"],
        &["says static_cache.l_max = 64", "holds 16 positions"],
    );
    assert_eq!(run.json()["problems"].as_array().unwrap().len(), 4);
    let truncated = broken("truncated", &|d| {
        let data = std::fs::OpenOptions::new()
            .write(true)
            .open(d.join("model.onnx.data"))
            .unwrap();
        data.set_len(4096).unwrap();
    });
    fails(
        &["info", "--onnx", &truncated],
        &[
            "model.onnx.data holds 4096 bytes",
            "model.onnx's initializers reach byte",
        ],
    );
}

/// `bench --onnx` refuses an export of other M2R2 weights than the reference's, naming the folder
/// and --m2r2; with the export's weights it runs.
#[test]
fn bench_onnx_refuses_an_export_of_other_m2r2_weights() {
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("none");
    let n = none.to_str().unwrap();
    ok(&["export", "--model", "tiny", "--m2r2", "none", "--out", n]);
    let sizes = [
        "--prompt-len",
        "4",
        "--decode-tokens",
        "4",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "8",
    ];
    let bench = |extra: &[&'static str]| {
        [
            &["bench", "--model", "tiny", "--onnx", n][..],
            extra,
            &sizes,
        ]
        .concat()
    };
    fails(
        &bench(&[]),
        &[
            &format!("the export {n} holds other M2R2 weights"),
            "builtin (seeded random)",
            "--m2r2",
        ],
    );
    fails(&bench(&["--cost-shape"]), &["holds other M2R2 weights"]);
    let report = ok(&bench(&["--m2r2", "none", "--json"])).json();
    assert_eq!(report["tokens_equal_reference"], true, "{report}");
}
