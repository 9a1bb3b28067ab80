//! `m2r2 run` failures that need no real export: a folder that is not an export, an ONNX Runtime
//! library that is missing or not ONNX Runtime, and a GPU provider asked of the CPU-only library.
//! Every case exits non-zero with a message naming what to fix, never a panic.

use super::Run;
use std::path::{Path, PathBuf};

/// The CPU ONNX Runtime of the real m2r2 cache (scripts/test.sh fetches it first; fetched here
/// otherwise).
pub fn onnxruntime() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| onnx_runner::provision::fetch(false).expect("m2r2 fetch onnxruntime"))
        .clone()
}

/// `m2r2 args` with `ORT_DYLIB_PATH` set to `ort`.
fn m2r2_with_ort(args: &[&str], ort: &Path) -> Run {
    super::m2r2_env(args, &[("ORT_DYLIB_PATH", ort.as_os_str())])
}

fn fails_with(args: &[&str], ort: &Path, needles: &[&str]) {
    let run = m2r2_with_ort(args, ort);
    assert!(
        matches!(run.code, Some(c) if c != 0),
        "m2r2 {args:?} should fail:\n{}{}",
        run.stdout,
        run.stderr
    );
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "m2r2 {args:?}: stderr should contain {needle:?}:\n{}",
            run.stderr
        );
    }
}

/// A folder with a valid manifest for the built-in tiny model and a graph file that is the
/// session tests' fixture: enough to reach library loading and provider registration.
fn fake_export(dir: &Path) {
    let config = reference::io::builtin::tiny_config();
    let m2r2 = reference::m2r2::config::M2r2Config::default_for(&config);
    let manifest = serde_json::json!({
        "format_version": 1,
        "exporter_version": "test",
        "model_name": "tiny",
        "config": config,
        "draft_gate": m2r2.draft_gate,
        "draft_layers": m2r2.gates[m2r2.draft_gate - 1],
        "m2r2": m2r2,
        "has_arla": false,
        "opset": 17,
        "weights_dtype": "f32",
        "graphs": { "model": "model.onnx" },
    });
    std::fs::write(
        dir.join("m2r2_export.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx-runner/tests/fixtures/affine.onnx");
    std::fs::copy(fixture, dir.join("model.onnx")).unwrap();
}

#[test]
fn a_folder_without_a_manifest_is_not_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    fails_with(
        &["run", "--onnx", d, "--tokens", "1,2"],
        &onnxruntime(),
        &[
            "m2r2_export.json: missing",
            "is not a finished export",
            "m2r2 export --out",
        ],
    );
    let absent = dir.path().join("absent");
    fails_with(
        &["run", "--onnx", absent.to_str().unwrap(), "--tokens", "1,2"],
        &onnxruntime(),
        &["absent does not exist", "m2r2 export --out"],
    );
    // a graph file given for the folder
    let graph = dir.path().join("model.onnx");
    std::fs::write(&graph, b"not read").unwrap();
    fails_with(
        &["run", "--onnx", graph.to_str().unwrap(), "--tokens", "1,2"],
        &onnxruntime(),
        &[
            "model.onnx: a file, where an export folder (the one holding m2r2_export.json) is \
             expected: did you mean",
        ],
    );
}

#[test]
fn a_missing_or_foreign_library_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    fake_export(dir.path());
    let d = dir.path().to_str().unwrap();
    let args = [
        "run",
        "--onnx",
        d,
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "2",
    ];

    let missing = dir.path().join("libonnxruntime.so.1.31.1");
    fails_with(
        &args,
        &missing,
        &["cannot read the library", "ORT_DYLIB_PATH"],
    );

    let text = dir.path().join("not-a-library.so");
    std::fs::write(&text, "hello").unwrap();
    fails_with(&args, &text, &["is not a shared library"]);

    // A real shared library that is not ONNX Runtime: the providers' helper beside the runtime.
    let helper = onnxruntime().with_file_name("libonnxruntime_providers_shared.so");
    fails_with(
        &args,
        &helper,
        &["does not export `OrtGetApiBase`", "not ONNX Runtime"],
    );
}

/// A cached library damaged since it was fetched (here truncated) is checked against its pinned
/// SHA-256 and extracted again from the cached wheel before `run` loads it: loading it used to
/// die of SIGBUS inside ONNX Runtime, with no message.
#[test]
fn a_damaged_cached_library_is_extracted_again() {
    let real = onnxruntime();
    let wheel = onnx_runner::provision::ONNXRUNTIME_WHEEL.file_name;
    // the real cache's wheel (scripts/test.sh and `fetch onnxruntime` leave it there)
    let real_cache = real.ancestors().nth(3).unwrap();
    let cache = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cache.path().join("downloads")).unwrap();
    std::fs::copy(
        real_cache.join("downloads").join(wheel),
        cache.path().join("downloads").join(wheel),
    )
    .expect("the cached onnxruntime wheel");
    let dir = real.parent().unwrap();
    let copy = cache
        .path()
        .join("onnxruntime")
        .join(dir.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let library = copy.join(real.file_name().unwrap());
    let bytes = std::fs::read(&library).unwrap();
    std::fs::write(&library, &bytes[..1_000_000]).unwrap();

    let export = tempfile::tempdir().unwrap();
    let out = export.path().join("tiny");
    let out = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", out]);
    let run = super::m2r2_env(
        &[
            "run",
            "--onnx",
            out,
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "2",
        ],
        &[
            ("M2R2_CACHE", cache.path().as_os_str()),
            ("ORT_DYLIB_PATH", "".as_ref()),
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("(truncated or damaged): extracting it again"),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read(&library).unwrap(), bytes);
}

/// A truncated external data file is named with what to do, in plain text: ONNX Runtime's own log
/// line came in terminal colours, and its message with the C++ frame it was thrown from.
#[test]
fn a_truncated_external_data_file_is_a_plain_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let out = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", out, "--external-data"]);
    let data = dir.path().join("tiny").join("model.onnx.data");
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..1000]).unwrap();
    let run = super::fails(
        &[
            "run",
            "--onnx",
            out,
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "2",
        ],
        &[
            "model.onnx",
            "given file_length: 1000 are out of bounds",
            "a truncated copy? export the folder again",
        ],
    );
    assert!(!run.stderr.contains('\x1b'), "{}", run.stderr);
    assert!(!run.stderr.contains("std::"), "{}", run.stderr);
}

/// ONNX Runtime's own log reaches stderr from warnings up by default (a session of tiny logs
/// hundreds of verbose and info lines: graph transformers, removed initializers), `ORT_LOG` lowers
/// or raises the level, each line says its level, and an unknown level is refused by name.
#[test]
fn onnx_runtime_logs_warnings_unless_ort_log_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let out = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", out]);
    let args = [
        "run",
        "--onnx",
        out,
        "--tokens",
        "1,2",
        "--max-new-tokens",
        "2",
        "--mode",
        "speculative",
    ];
    let run = super::ok(&args);
    assert!(!run.stderr.contains("onnxruntime "), "{}", run.stderr);
    let with = |level: &str| super::m2r2_env(&args, &[("ORT_LOG", level.as_ref())]);
    let verbose = with("verbose");
    assert_eq!(verbose.code, Some(0), "{}", verbose.stderr);
    assert!(
        verbose.stderr.contains("onnxruntime verbose: "),
        "{}",
        verbose.stderr
    );
    let quiet = with("error");
    assert_eq!(quiet.code, Some(0), "{}", quiet.stderr);
    assert!(!quiet.stderr.contains("onnxruntime "), "{}", quiet.stderr);
    let bad = with("loud");
    assert_eq!(bad.code, Some(1), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("ORT_LOG=\"loud\" is not a log level"),
        "{}",
        bad.stderr
    );
}

/// An export's tokenizer.json with more tokens than the model (another model's) is refused by
/// name: within the model's vocabulary it would encode a prompt to another model's ids silently.
#[test]
fn another_models_tokenizer_in_an_export_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    super::ok(&["export", "--model", "tiny", "--out", out.to_str().unwrap()]);
    let larger = reference::io::tokenizer::Tokenizer::byte_level_builtin(512).unwrap();
    larger
        .backend()
        .save(out.join("tokenizer.json"), false)
        .unwrap();
    let args = ["run", "--onnx", out.to_str().unwrap(), "--prompt", "a"];
    super::fails(
        &args,
        &["tokenizer.json", "but the model's vocabulary has 320"],
    );
}

#[test]
fn gpu_providers_fail_fast_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    fake_export(dir.path());
    let d = dir.path().to_str().unwrap();
    for (ep, reason) in [
        (
            "cuda",
            "CUDA execution provider is not enabled in this build",
        ),
        (
            "tensorrt",
            "TensorRT execution provider is not enabled in this build",
        ),
    ] {
        fails_with(
            &["run", "--onnx", d, "--tokens", "1,2", "--ep", ep],
            &onnxruntime(),
            &[
                &format!("the {ep} execution provider is not available"),
                reason,
                "is a CPU build: point ORT_DYLIB_PATH at an onnxruntime-gpu build",
                "--ep-fallback",
            ],
        );
    }
    fails_with(
        &["run", "--onnx", d, "--tokens", "1", "--ep", "gpu"],
        &onnxruntime(),
        &["unknown execution provider `gpu`"],
    );
}

/// `m2r2 run` on an export of the built-in model prints `m2r2 generate`'s report (every key of it,
/// the same tokens and statistics) plus the provider that ran; speculative equals greedy;
/// sampling flags are refused, naming `m2r2 generate`.
#[test]
fn run_reports_like_generate_on_an_export_of_tiny() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let o = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", o]);
    let ort = onnxruntime();
    let prompt = ["--prompt", "The quick brown fox", "--max-new-tokens", "12"];
    for mode in ["greedy", "speculative"] {
        let mut generate = vec!["generate", "--json", "--model", "tiny", "--mode", mode];
        generate.extend_from_slice(&prompt);
        let want = super::ok(&generate).json();
        let mut run = vec!["run", "--json", "--onnx", o, "--mode", mode];
        run.extend_from_slice(&prompt);
        let got = m2r2_with_ort(&run, &ort);
        assert_eq!(got.code, Some(0), "{}", got.stderr);
        let got = got.json();
        for key in want.as_object().unwrap().keys() {
            assert!(got.get(key).is_some(), "{mode}: `m2r2 run` lacks `{key}`");
        }
        for key in [
            "tokens",
            "prompt_tokens",
            "text",
            "stop_reason",
            "mode",
            "sampling",
        ] {
            assert_eq!(got[key], want[key], "{mode}: {key}");
        }
        if mode == "speculative" {
            for key in [
                "rounds",
                "mean_accepted_tokens",
                "acceptance_by_position",
                "acceptance_rate",
            ] {
                assert_eq!(got[key], want[key], "{mode}: {key}");
            }
        }
        assert_eq!(got["ep"], "cpu");
        assert_eq!(got["ep_used"], "cpu");
        assert_eq!(got["flops_per_token"], serde_json::Value::Null);
    }
    // --trace prints the rounds on stderr, as generate does
    let traced = m2r2_with_ort(
        &[
            "run",
            "--onnx",
            o,
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "6",
            "--mode",
            "speculative",
            "--trace",
        ],
        &ort,
    );
    assert_eq!(traced.code, Some(0), "{}", traced.stderr);
    assert!(
        traced.stderr.contains("trace: speculative, draft at gate"),
        "{}",
        traced.stderr
    );
    assert!(
        traced.stderr.contains("round   0: drafted ["),
        "{}",
        traced.stderr
    );
    // sampling flags are refused with a pointer to the reference, for both modes
    for (flag, mode) in [
        ("--temperature", "greedy"),
        ("--top-p", "speculative"),
        ("--seed", "greedy"),
    ] {
        let args = [
            "run", "--onnx", o, "--tokens", "1,2", "--mode", mode, flag, "0.8",
        ];
        fails_with(&args, &ort, &[flag, "decodes greedily", "m2r2 generate"]);
    }
    // --temperature 0 is greedy, as on `generate`
    let zero_args = [
        "run",
        "--onnx",
        o,
        "--tokens",
        "1,2",
        "--json",
        "--temperature",
        "0",
    ];
    let greedy = m2r2_with_ort(&zero_args[..6], &ort);
    let zero = m2r2_with_ort(&zero_args, &ort);
    assert_eq!(zero.code, Some(0), "{}", zero.stderr);
    assert_eq!(zero.json()["tokens"], greedy.json()["tokens"]);
    // --ort-profile writes each session's per-node profile beside the prefix; a missing folder
    // is refused (ONNX Runtime would drop the profile silently)
    let profiles = dir.path().join("profiles");
    std::fs::create_dir(&profiles).unwrap();
    let prefix = profiles.join("run");
    let profiled = [
        &zero_args[..6],
        &["--ort-profile", prefix.to_str().unwrap()],
    ]
    .concat();
    let profiled = m2r2_with_ort(&profiled, &ort);
    assert_eq!(profiled.code, Some(0), "{}", profiled.stderr);
    let written: Vec<_> = std::fs::read_dir(&profiles)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!written.is_empty());
    for file in &written {
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("run") && name.ends_with(".json"), "{name}");
        let events: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        assert!(events.as_array().is_some_and(|e| !e.is_empty()), "{name}");
    }
    let missing = dir.path().join("no-such-folder/run");
    let refused = [
        &zero_args[..6],
        &["--ort-profile", missing.to_str().unwrap()],
    ]
    .concat();
    fails_with(
        &refused,
        &ort,
        &["--ort-profile", "no-such-folder` is not a folder"],
    );
    // --threshold is read only by dynamic drafting
    let args = [
        "run",
        "--onnx",
        o,
        "--tokens",
        "1,2",
        "--mode",
        "speculative",
        "--draft-len",
        "2",
        "--threshold",
        "0.5",
    ];
    fails_with(
        &args,
        &ort,
        &["--threshold", "a fixed 2 token(s)", "--dynamic-draft"],
    );
}

/// A folder exported without draft.onnx: speculative decoding is refused naming the graph and
/// the flag to write it, with no note about feed.onnx (so is one without verifier.onnx); greedy
/// still runs, and refuses the flags of providers that do not run.
#[test]
fn speculative_without_a_draft_graph_says_how_to_export_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model-only");
    let o = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", o, "--graphs", "model"]);
    let ort = onnxruntime();
    let args = [
        "run",
        "--onnx",
        o,
        "--tokens",
        "1,2",
        "--mode",
        "speculative",
    ];
    fails_with(
        &args,
        &ort,
        &["no draft graph (it has: model)", "`draft` in `--graphs`"],
    );
    let run = m2r2_with_ort(&args, &ort);
    assert!(!run.stderr.contains("feed.onnx"), "{}", run.stderr);
    // likewise without verifier.onnx
    let draft_only = dir.path().join("draft-only");
    let d = draft_only.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", d, "--graphs", "draft"]);
    let args = [
        "run",
        "--onnx",
        d,
        "--tokens",
        "1,2",
        "--mode",
        "speculative",
    ];
    fails_with(&args, &ort, &["no verifier graph (it has: draft)"]);
    let run = m2r2_with_ort(&args, &ort);
    assert!(!run.stderr.contains("feed.onnx"), "{}", run.stderr);
    let greedy = m2r2_with_ort(&["run", "--onnx", o, "--tokens", "1,2"], &ort);
    assert_eq!(greedy.code, Some(0), "{}", greedy.stderr);
    // a flag of another provider is refused: the one that runs would not read it
    for (flag, readers) in [
        (&["--trt-fp16"][..], "--ep tensorrt"),
        (&["--device-id", "1"], "--ep cuda or --ep tensorrt"),
        (&["--ep-fallback"], "--ep cuda or --ep tensorrt"),
    ] {
        let run = [&["run", "--onnx", o, "--tokens", "1,2"][..], flag].concat();
        fails_with(&run, &ort, &[flag[0], readers, "this run is --ep cpu"]);
    }
}

/// The demo's ONNX section (run by `golden_m2r2::demo_runs_the_m2r2_modes_without_not_ok`, so the
/// demo runs once): the export of the built-in model is equal to the reference on ONNX Runtime.
pub fn check_demo_onnx_section(stdout: &str) {
    let section = stdout
        .split("ONNX export + ONNX Runtime ==")
        .nth(1)
        .expect("an ONNX section");
    let section = section.split("\n== ").next().unwrap();
    assert!(!section.contains("NOT OK"), "{section}");
    assert_eq!(section.matches("  OK ").count(), 4, "{section}");
    assert!(section.contains("ONNX Runtime speculative"), "{section}");
}

/// `m2r2 bench --onnx` on an export of tiny: both engines measured, lossless, equal tokens (speeds
/// are printed, never asserted).
#[test]
fn bench_onnx_compares_both_engines() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let o = out.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", o]);
    let args = [
        "bench",
        "--model",
        "tiny",
        "--onnx",
        o,
        "--json",
        "--prompt-len",
        "8",
        "--decode-tokens",
        "8",
        "--repeats",
        "1",
    ];
    let report = super::ok(&args).json();
    assert_eq!(report["ep_used"], "cpu");
    assert_eq!(report["tokens_equal_reference"], true);
    let engines = report["engines"].as_array().unwrap();
    let names: Vec<&str> = engines
        .iter()
        .map(|e| e["engine"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reference", "onnxruntime-cpu"]);
    for e in engines {
        assert_eq!(e["speculative_equals_greedy"], true, "{e}");
        for key in [
            "prefill_tokens_per_second",
            "greedy_tokens_per_second",
            "speculative_tokens_per_second",
            "ms_per_draft_step",
            "ms_per_verify_step",
        ] {
            assert!(e[key].as_f64().unwrap() > 0.0, "{key}: {e}");
        }
    }
    assert_eq!(
        engines[0]["mean_accepted_length"],
        engines[1]["mean_accepted_length"]
    );
    // the export must be of the benched model
    super::fails(
        &[
            "bench",
            "--model",
            "tiny-moe",
            "--onnx",
            o,
            "--repeats",
            "1",
            "--decode-tokens",
            "2",
        ],
        &["different model", "--model"],
    );
}

/// A static export (`export --static-cache`) through `m2r2 run` (greedy and speculative, every
/// graph static: the reference's tokens), a budget past its buffers refused before any run, and
/// `bench --onnx` with a dynamic and the static export side by side (speeds printed, never
/// asserted).
#[test]
fn static_export_runs_and_benches_beside_a_dynamic_one() {
    let dir = tempfile::tempdir().unwrap();
    let (dynamic, fixed) = (dir.path().join("dynamic"), dir.path().join("static"));
    let (d, s) = (dynamic.to_str().unwrap(), fixed.to_str().unwrap());
    super::ok(&["export", "--model", "tiny", "--out", d]);
    // tiny with a static cache of 40 positions into `out`
    let static_export = |out: &str, more: &[&str]| {
        let mut args = vec![
            "export",
            "--model",
            "tiny",
            "--out",
            out,
            "--static-cache",
            "40",
        ];
        args.extend(more);
        super::ok(&args);
    };
    static_export(s, &[]);
    let want = super::generate_json(&[
        "--model",
        "tiny",
        "--tokens",
        "1,2,3",
        "--max-new-tokens",
        "12",
    ]);
    for mode in ["greedy", "speculative"] {
        let got = super::ok(&[
            "run",
            "--onnx",
            s,
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "12",
            "--mode",
            mode,
            "--json",
        ])
        .json();
        assert_eq!(got["tokens"], want["tokens"], "{mode}");
    }
    // a greedy golden of the reference, checked on the static model.onnx
    let golden = dir.path().join("g.golden.safetensors");
    let g = golden.to_str().unwrap();
    super::ok(&[
        "golden", "write", "--model", "tiny", "--tokens", "1,2,3", "--steps", "8", "--out", g,
    ]);
    let checked = super::ok(&["golden", "check", g, "--onnx", s]);
    assert!(checked.stdout.contains("overall: OK"), "{}", checked.stdout);
    // a golden longer than the buffers is refused before any run: 3 + 40 - 1 positions, and a
    // speculative golden's 4 drafts past them
    for mode in ["greedy", "speculative"] {
        super::ok(&[
            "golden",
            "write",
            "--model",
            "tiny",
            "--tokens",
            "1,2,3",
            "--steps",
            "40",
            "--mode",
            mode,
            "--ignore-eos",
            "--out",
            g,
        ]);
        let (graph, needs) = if mode == "greedy" {
            ("model.onnx", "steps needs 42")
        } else {
            (
                "verifier.onnx",
                "steps (its rounds draft up to 4 positions past its last token) needs 46",
            )
        };
        let refused = super::fails(
            &["golden", "check", g, "--onnx", s],
            &[
                graph,
                "the static cache holds 40 positions, and a golden of 3 prompt tokens and 40 ",
                needs,
                "; export with a larger --static-cache",
            ],
        );
        // the export's description is said once, in the `checking` line
        let said = format!("{}{}", refused.stdout, refused.stderr);
        assert_eq!(said.matches("on ONNX Runtime").count(), 1, "{said}");
        assert!(refused.stdout.contains("overall: NOT CHECKED"), "{said}");
    }
    // a budget past the buffers is refused before any run, with the budget that fits: greedy
    // needs 3 + N - 1 positions, a speculative round with 2 drafts 2 more
    fn budget<'a>(s: &'a str, n: &'a str, more: &[&'a str]) -> Vec<&'a str> {
        let head = [
            "run",
            "--onnx",
            s,
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            n,
        ];
        [&head[..], more].concat()
    }
    let speculative = ["--mode", "speculative", "--draft-len", "2"];
    super::ok(&budget(s, "38", &[]));
    super::ok(&budget(s, "36", &speculative));
    super::fails(
        &budget(s, "60", &[]),
        &[
            "model.onnx: the static cache holds 40 positions",
            "--max-new-tokens 60 needs 62",
            "export with a larger --static-cache, or ask for at most 38 new tokens",
        ],
    );
    super::fails(
        &budget(s, "37", &speculative),
        &[
            "verifier.onnx: the static cache holds 40 positions",
            "(its rounds draft up to 2 positions past the last token) needs 41",
            "ask for at most 36 new tokens",
        ],
    );
    // a prompt past the buffers by itself: the longest prompt that leaves room for a new token
    let long = (1..=41)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let head = [
        "run",
        "--onnx",
        s,
        "--tokens",
        &long,
        "--max-new-tokens",
        "4",
    ];
    for (more, want) in [
        (&[][..], "or shorten the prompt to at most 40 tokens"),
        (
            &speculative[..],
            "or shorten the prompt to at most 38 tokens",
        ),
        (
            &["--mode", "speculative", "--draft-len", "39"][..],
            "or shorten the prompt to 1 token",
        ),
        (
            &["--mode", "speculative", "--draft-len", "40"][..],
            "or draft fewer tokens a round (--draft-len)",
        ),
    ] {
        super::fails(
            &[&head[..], more].concat(),
            &["a prompt of 41 tokens", want],
        );
    }
    // a manifest whose L disagrees with the graphs' buffers is refused, naming both
    let edited = dir.path().join("edited");
    std::fs::create_dir(&edited).unwrap();
    for entry in std::fs::read_dir(&fixed).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, edited.join(path.file_name().unwrap())).unwrap();
    }
    let manifest = edited.join("m2r2_export.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    json["static_cache"]["l_max"] = 41.into();
    std::fs::write(&manifest, json.to_string()).unwrap();
    super::fails(
        &[
            "run",
            "--onnx",
            edited.to_str().unwrap(),
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "4",
        ],
        &[
            "model.onnx",
            "static cache length is 40, the manifest's is 41",
        ],
    );
    // bench refuses sizes the static buffers cannot hold before timing anything: 8 + 30 - 1
    // positions for greedy and tiny's 4 drafts more for a speculative round
    super::fails(
        &[
            "bench",
            "--model",
            "tiny",
            "--onnx",
            s,
            "--prompt-len",
            "8",
            "--decode-tokens",
            "30",
        ],
        &[
            "verifier.onnx: the static cache holds 40 positions, and --prompt-len 8 with \
             --decode-tokens 30 (speculative rounds of 4 drafts) needs 41",
            "lower --prompt-len or --decode-tokens",
        ],
    );
    // a second static export (merged adapters) is named by its folder in the bench table
    let merged = dir.path().join("merged");
    let m = merged.to_str().unwrap();
    static_export(m, &["--merge-adapters"]);
    let bench = [
        "bench",
        "--model",
        "tiny",
        "--onnx",
        d,
        "--onnx",
        s,
        "--onnx",
        m,
        "--prompt-len",
        "8",
        "--decode-tokens",
        "8",
        "--repeats",
        "1",
        "--bandwidth-mib",
        "16",
    ];
    let table = super::ok(&bench).stdout;
    for column in [
        "prefill tok/s",
        "greedy / first export",
        "prefill / first export",
    ] {
        assert!(table.contains(column), "{column}:\n{table}");
    }
    let report = super::ok(&[&bench[..], &["--json"]].concat()).json();
    assert_eq!(report["tokens_equal_reference"], true);
    assert!(report["memory_read_bytes_per_second"].as_f64().unwrap() > 0.0);
    let engines = report["engines"].as_array().unwrap();
    let names: Vec<&str> = engines
        .iter()
        .map(|e| e["engine"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "reference",
            "onnxruntime-cpu",
            "onnxruntime-cpu static",
            "onnxruntime-cpu static (merged)"
        ]
    );
    assert_eq!(engines[2]["static_cache"], 40);
    assert_eq!(engines[3]["static_cache"], 40);
    // one timed run: each paired ratio is that run's own quotient, so median = min = max = the
    // engine's figures divided
    let tps = |e: &serde_json::Value, key: &str| e[key].as_f64().unwrap();
    let first_greedy = tps(&engines[1], "greedy_tokens_per_second");
    let first_prefill = tps(&engines[1], "prefill_tokens_per_second");
    for (i, e) in engines.iter().enumerate() {
        assert_eq!(e["speculative_equals_greedy"], true, "{e}");
        let greedy = tps(e, "greedy_tokens_per_second");
        assert!(greedy > 0.0, "{e}");
        let spread = |s: &serde_json::Value, want: f64| {
            for key in ["median", "min", "max"] {
                let got = s[key].as_f64().unwrap();
                assert!(
                    (got - want).abs() <= 1e-9 * want,
                    "{key} {got} vs {want}: {e}"
                );
            }
        };
        let spec = tps(e, "speculative_tokens_per_second");
        spread(&e["speculative_over_greedy"], spec / greedy);
        let prefill = tps(e, "prefill_tokens_per_second");
        assert!(prefill > 0.0, "{e}");
        match i {
            0 | 1 => {
                assert!(e["greedy_over_first_export"].is_null(), "{e}");
                assert!(e["prefill_over_first_export"].is_null(), "{e}");
            }
            _ => {
                spread(&e["greedy_over_first_export"], greedy / first_greedy);
                spread(&e["prefill_over_first_export"], prefill / first_prefill);
            }
        }
    }
}

/// `--cuda-graph`: `on` where a CUDA graph cannot apply (the CPU provider, a dynamic export, a
/// fallback to the CPU, for greedy and speculative decoding) and `both` outside `bench` are errors
/// naming why, with no panic; the
/// default on the CPU is off (`"cuda_graph": null`) and gives the same tokens as `off`.
#[test]
fn cuda_graph_is_refused_where_it_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let (dynamic, fixed) = (dir.path().join("dynamic"), dir.path().join("static"));
    let (d, s) = (dynamic.to_str().unwrap(), fixed.to_str().unwrap());
    super::ok(&["export", "--model", "tiny", "--out", d]);
    let static_args = ["--out", s, "--static-cache", "24"];
    super::ok(&[&["export", "--model", "tiny"][..], &static_args].concat());
    let run = |dir: &str, more: &[&str]| -> Vec<String> {
        let base = [
            "run",
            "--onnx",
            dir,
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "6",
        ];
        [&base[..], more]
            .concat()
            .iter()
            .map(|a| a.to_string())
            .collect()
    };
    let refused = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::fails(&args, needles);
    };
    refused(
        run(s, &["--cuda-graph", "on"]),
        &[
            "--cuda-graph",
            "CUDA execution provider (--ep cuda), not cpu",
        ],
    );
    // the export is looked at before the provider is registered
    refused(
        run(d, &["--ep", "cuda", "--cuda-graph", "on"]),
        &["--cuda-graph", "dynamic export", "--static-cache L"],
    );
    refused(
        run(s, &["--mode", "speculative", "--cuda-graph", "on"]),
        &[
            "--cuda-graph",
            "CUDA execution provider (--ep cuda), not cpu",
        ],
    );
    refused(
        run(
            d,
            &[
                "--mode",
                "speculative",
                "--ep",
                "cuda",
                "--cuda-graph",
                "on",
            ],
        ),
        &["--cuda-graph", "dynamic export", "--static-cache L"],
    );
    refused(
        run(s, &["--cuda-graph", "both"]),
        &["--cuda-graph both is for `bench --onnx`"],
    );
    refused(
        run(s, &["--ort-compare", "one:threads=1"]),
        &["--ort-compare is for `m2r2 bench --cost-shape --onnx DIR`; `run` takes one set"],
    );
    // TensorRT's profiles cover a static draft's fast mask (L + rows), so an unavailable
    // TensorRT is what a speculative run meets, and --ep-fallback runs it on the CPU
    refused(
        run(s, &["--mode", "speculative", "--ep", "tensorrt"]),
        &[
            "the tensorrt execution provider is not available",
            "--ep-fallback",
        ],
    );
    super::ok(
        &run(
            s,
            &["--mode", "speculative", "--ep", "tensorrt", "--ep-fallback"],
        )
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    // an explicit `on` is not dropped when --ep-fallback falls back to the CPU (which has no
    // CUDA graphs; CUDA is not in this ONNX Runtime): refused with the provider's reason before
    // anything decodes; left unset, the fallback runs and says the graphs are off
    for mode in ["greedy", "speculative"] {
        let args = ["--mode", mode, "--ep", "cuda", "--ep-fallback", "--json"];
        let on = [&args[..], &["--cuda-graph", "on"]].concat();
        let refusal = super::fails(
            &run(s, &on).iter().map(String::as_str).collect::<Vec<_>>(),
            &[
                "--cuda-graph: CUDA graphs need the CUDA execution provider, which is not \
                 available: CUDA execution provider is not enabled in this build",
                "`--cuda-graph off`",
            ],
        );
        assert!(refusal.stdout.is_empty(), "{}", refusal.stdout);
        let unset = super::ok(&run(s, &args).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            unset
                .stderr
                .contains("running on the CPU (--ep-fallback), without CUDA graphs"),
            "{}",
            unset.stderr
        );
        let report = unset.json();
        assert_eq!(report["ep_used"], "cpu");
        assert_eq!(report["cuda_graph"], serde_json::Value::Null);
    }
    // golden check runs one set of sessions too
    let golden = dir.path().join("g.golden.safetensors");
    let golden = golden.to_str().unwrap();
    super::ok(&[
        "golden", "write", "--tokens", "1,2,3", "--steps", "2", "--out", golden,
    ]);
    for (flag, said) in [
        (
            ["--ort-compare", "one:threads=1"],
            "`golden check` takes one set of options",
        ),
        (["--cuda-graph", "both"], "`golden check` takes on or off"),
    ] {
        let args = [&["golden", "check", golden, "--onnx", s][..], &flag].concat();
        let refusal = super::fails(&args, &[said]);
        assert_eq!(refusal.code, Some(2), "{}", refusal.stderr);
    }
    super::fails(
        &[
            "golden",
            "check",
            "missing.golden.safetensors",
            "--onnx",
            s,
            "--cuda-graph",
            "maybe",
        ],
        &["invalid value 'maybe'"],
    );
    // bench --cuda-graph both: CUDA graphs need --ep cuda, and a static export to measure
    let bench = |export: &str, ep: &str, needle: &str| {
        let args = [
            "bench",
            "--model",
            "tiny",
            "--onnx",
            export,
            "--ep",
            ep,
            "--cuda-graph",
            "both",
            "--prompt-len",
            "4",
            "--decode-tokens",
            "4",
            "--repeats",
            "1",
            "--bandwidth-mib",
            "16",
        ];
        super::fails(&args, &["--cuda-graph both", needle]);
    };
    bench(s, "cpu", "need --ep cuda (this run is --ep cpu)");
    bench(d, "cuda", "every export here is dynamic");
    let json = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::ok(&args).json()
    };
    let default = json(run(s, &["--json"]));
    let off = json(run(s, &["--json", "--cuda-graph", "off"]));
    assert_eq!(default["cuda_graph"], serde_json::Value::Null);
    assert_eq!(default["tokens"], off["tokens"]);
    assert_eq!(default["ep_used"], "cpu");
}

/// Near the context, `run` on a dynamic export and `generate` count a speculative decode's
/// positions alike (the drafts past the last token included) and refuse it in the same words.
#[test]
fn speculation_meets_the_context_alike_on_both_engines() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = dir.path().join("onnx");
    let onnx = onnx.to_str().unwrap();
    super::ok(&["export", "--model", "tiny", "--out", onnx]);
    // tiny's context is 512: 505 prompt tokens, 5 new ones and 4 drafts need 513
    let prompt = vec!["5"; 505].join(",");
    for drafting in [&["--draft-len", "4"][..], &["--draft-tree", "2,1"]] {
        let tail = [
            &[
                "--tokens",
                &prompt,
                "--max-new-tokens",
                "5",
                "--mode",
                "speculative",
            ][..],
            drafting,
        ]
        .concat();
        for head in [&["generate"][..], &["run", "--onnx", onnx]] {
            super::fails(
                &[head, &tail].concat(),
                &["sequence needs 513 positions but the context holds 512"],
            );
        }
    }
    // the draft length alone is named as the cause
    super::fails(
        &[
            "run",
            "--onnx",
            onnx,
            "--tokens",
            "1",
            "--max-new-tokens",
            "2",
            "--mode",
            "speculative",
            "--draft-len",
            "600",
        ],
        &[
            "needs 602 positions",
            "rounds that draft up to 600 position(s)",
            "draft fewer tokens",
        ],
    );
}
