//! The bridge end to end on the built-in `tiny` model: `train --bridge-rank` writes a bridged
//! weights folder that `info` describes, `generate --mode speculative` decodes like greedy with,
//! `export --check` passes and `run` decodes on ONNX Runtime like the reference; bad bridge files
//! and flags are refused with errors naming the file, the tensor or the flag.

use super::train::distill_tiny;
use super::{fails, generate_json, ok};
use std::path::Path;

/// `train` on tiny's gate 1 with a bridge at both sites, 30 steps.
fn train_bridged(dir: &Path) -> String {
    distill_tiny(dir, &[("p.jsonl", "p", 6, "data")]);
    let out = dir.join("bridged").display().to_string();
    let data = dir.join("data").display().to_string();
    ok(&[
        "train",
        "--model",
        "tiny",
        "--data",
        &data,
        "--train-gates",
        "1",
        "--rank",
        "4",
        "--steps",
        "30",
        "--bridge-rank",
        "8",
        "--bridge-sites",
        "entry,gate",
        "--out",
        &out,
    ]);
    out
}

#[test]
fn trained_bridge_decodes_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let w = train_bridged(dir.path());
    assert!(Path::new(&w).join("bridge.safetensors").is_file());
    let info = ok(&["info", "--model", "tiny", "--m2r2", &w, "--json"]).json();
    let bridge = &info["m2r2"]["bridge"];
    assert_eq!(bridge["rank"], 8);
    assert_eq!(bridge["sites"], serde_json::json!(["entry", "gate"]));
    let text = ok(&["info", "--model", "tiny", "--m2r2", &w]).stdout;
    assert!(
        text.contains("bridge        gate 1, rank 8 at entry, gate"),
        "{text}"
    );

    let prompt = [
        "--model",
        "tiny",
        "--tokens",
        "5,9,14,3",
        "--max-new-tokens",
        "16",
    ];
    let greedy = generate_json(&[&prompt[..], &["--mode", "greedy"]].concat());
    let spec = generate_json(
        &[
            &prompt[..],
            &["--mode", "speculative", "--m2r2", &w, "--draft-len", "3"],
        ]
        .concat(),
    );
    assert_eq!(spec["tokens"], greedy["tokens"], "lossless with the bridge");

    let export = dir.path().join("export").display().to_string();
    let checked = ok(&[
        "export", "--model", "tiny", "--m2r2", &w, "--out", &export, "--check",
    ]);
    assert!(!checked.stdout.contains("NOT OK"), "{}", checked.stdout);
    assert!(checked.stdout.contains("exit_states"), "{}", checked.stdout);
    let run = ok(&[
        "run",
        "--onnx",
        &export,
        "--tokens",
        "5,9,14,3",
        "--max-new-tokens",
        "16",
        "--mode",
        "speculative",
        "--draft-len",
        "3",
        "--json",
    ])
    .json();
    assert_eq!(run["tokens"], greedy["tokens"]);
    assert_eq!(
        run["rounds"], spec["rounds"],
        "same rounds as the reference"
    );

    // tune-drafting prices the bridged drafts on both engines (its timing loops roll back before
    // the last verified chunk) and traces gate 1 a round deep
    let data = dir.path().join("data").display().to_string();
    let tuned = ok(&[
        "tune-drafting",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--data",
        &data,
        "--limit",
        "2",
        "--max-draft",
        "3",
        "--thresholds",
        "0.5",
        "--onnx",
        &export,
        "--repeats",
        "1",
        "--json",
    ])
    .json();
    let traces = tuned["traces"].as_array().unwrap();
    assert_eq!(traces[0]["gate"], 1);
    assert_eq!(
        traces[0]["depth"], 3,
        "gate 1 reads the bridge: traced 3 deep"
    );
    assert_eq!(traces[1]["depth"], 1, "gate 2 does not");
}

#[test]
fn bad_bridges_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let w = train_bridged(dir.path());
    let copy = |name: &str| {
        let to = dir.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&w).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
        to
    };
    let generate = |folder: &Path| {
        vec![
            "generate".to_string(),
            "--model".into(),
            "tiny".into(),
            "--tokens".into(),
            "1,2".into(),
            "--mode".into(),
            "speculative".into(),
            "--m2r2".into(),
            folder.display().to_string(),
        ]
    };
    let run_fails = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needles);
    };
    // the config names a bridge, the file is gone
    let missing = copy("missing");
    std::fs::remove_file(missing.join("bridge.safetensors")).unwrap();
    run_fails(
        generate(&missing),
        &["m2r2_config.json", "bridge.safetensors", "does not exist"],
    );
    // a file without the config entry
    let stray = copy("stray");
    let cfg = stray.join("m2r2_config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("bridge");
    std::fs::write(&cfg, json.to_string()).unwrap();
    run_fails(generate(&stray), &["m2r2_config.json", "names no bridge"]);
    // a tensor of the wrong shape: the config's rank disagrees with the file's
    let shape = copy("shape");
    let cfg = shape.join("m2r2_config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    json["bridge"]["rank"] = 4.into();
    std::fs::write(&cfg, json.to_string()).unwrap();
    run_fails(
        generate(&shape),
        &[
            "bridge.safetensors",
            "bridge.entry.lora_A.weight",
            "[4, 64]",
        ],
    );
    // a truncated file
    let cut = copy("cut");
    let bytes = std::fs::read(cut.join("bridge.safetensors")).unwrap();
    std::fs::write(cut.join("bridge.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    run_fails(generate(&cut), &["bridge.safetensors"]);
    // flags: an unknown site, training only a bridge that is not there
    let data = dir.path().join("data").display().to_string();
    let out = dir.path().join("o").display().to_string();
    let train = |extra: &[&str], needles: &[&str]| {
        let mut args = vec![
            "train", "--model", "tiny", "--data", &data, "--steps", "2", "--out", &out,
        ];
        args.extend_from_slice(extra);
        fails(&args, needles);
    };
    train(
        &["--bridge-rank", "4", "--bridge-sites", "middle"],
        &["--bridge-sites", "unknown bridge site `middle`"],
    );
    train(&["--bridge-only", "--train-gates", "1"], &["no bridge"]);
    train(
        &["--bridge-rank", "4", "--train-gates", "2"],
        &["add gate 1 to --train-gates"],
    );
}
