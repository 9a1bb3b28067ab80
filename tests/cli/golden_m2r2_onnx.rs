//! Speculative goldens replayed on ONNX Runtime (docs/GOLDEN.md): `golden check --onnx` runs the
//! runner's speculative loop over draft.onnx / verifier.onnx and compares tokens, drafts, accepted
//! counts and base tokens round by round; what cannot be checked there is refused by name.

use super::{fails, ok};
use reference::golden::{Golden, M2r2Golden, M2r2Record};
use serde_json::Value;
use std::path::Path;

/// Fresh M2R2 weights for tiny (`init-m2r2 --seed SEED`) in `m2r2`, exported to `onnx`: the
/// "other adapters" a golden must refuse.
fn other_weights_exported(seed: &str, m2r2: &str, onnx: &str) {
    ok(&[
        "init-m2r2",
        "--model",
        "tiny",
        "--seed",
        seed,
        "--out",
        m2r2,
    ]);
    ok(&["export", "--model", "tiny", "--m2r2", m2r2, "--out", onnx]);
}

#[test]
fn speculative_goldens_on_onnx_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let onnx = p("onnx");
    ok(&["export", "--model", "tiny", "--out", &onnx]);
    let write = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "golden", "write", "--model", "tiny", "--tokens", "1,2,3", "--steps", "12", "--out",
            out,
        ];
        args.extend_from_slice(extra);
        ok(&args);
    };

    // fixed and dynamic (ARLA-scored) drafting: every round as the reference recorded it
    let (fixed, dynamic) = (p("fixed.safetensors"), p("dynamic.safetensors"));
    write(&fixed, &["--mode", "speculative", "--draft-len", "3"]);
    write(&dynamic, &["--mode", "speculative", "--dynamic-draft"]);
    for file in [&fixed, &dynamic] {
        let run = ok(&["golden", "check", file, "--onnx", &onnx, "--json"]);
        let report: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(report["ok"], true, "{report}");
        let names: Vec<&str> = report["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "tokens",
                "rounds",
                "logits",
                "verify_logits",
                "draft_logits",
                "round_scores"
            ]
        );
        // each line names the graph that recomputed it
        let graphs: Vec<&str> = report["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["graph"].as_str().unwrap())
            .collect();
        assert_eq!(
            graphs,
            [
                "feed+draft+verifier.onnx",
                "feed+draft+verifier.onnx",
                "model.onnx",
                "verifier.onnx",
                "draft.onnx",
                "draft.onnx"
            ]
        );
        assert_eq!(report["execution_provider"], "cpu", "{report}");
    }

    // a golden whose third round was edited: reported at that round, the rest OK
    let mut tampered = Golden::read(Path::new(&fixed)).unwrap();
    let Some(M2r2Golden {
        record: M2r2Record::Speculative { rounds, .. },
        ..
    }) = &mut tampered.m2r2
    else {
        unreachable!("a speculative golden")
    };
    assert!(rounds.accepted.len() >= 3, "{rounds:?}");
    rounds.base_token[2] += 1;
    tampered
        .write(Path::new(&p("tampered.safetensors")))
        .unwrap();
    let run = fails(
        &[
            "golden",
            "check",
            &p("tampered.safetensors"),
            "--onnx",
            &onnx,
        ],
        &["feed+draft+verifier.onnx rounds NOT OK"],
    );
    assert!(
        run.stdout
            .contains("first divergence at round 2: base token golden"),
        "the round is named:\n{}",
        run.stdout
    );
    // the graphs' own outputs along the recorded rounds are untouched by the edit
    for graph in [
        "verifier.onnx            verify_logits  OK",
        "draft.onnx               draft_logits   OK",
    ] {
        assert!(run.stdout.contains(graph), "{graph}:\n{}", run.stdout);
    }

    // settings edited under the hashes (the export's manifest has the settings they cover)
    let mut edited = Golden::read(Path::new(&fixed)).unwrap();
    let settings = &mut edited.m2r2.as_mut().unwrap().config_json;
    let mut value: Value = serde_json::from_str(settings).unwrap();
    value["rank"] = serde_json::json!(4);
    *settings = value.to_string();
    edited.write(Path::new(&p("edited.safetensors"))).unwrap();
    fails(
        &["golden", "check", &p("edited.safetensors"), "--onnx", &onnx],
        &[
            "metadata `m2r2_config` differs from the M2R2 settings of export",
            "`rank` (4 vs",
        ],
    );

    // refusals, each naming what is missing
    let early = p("early.safetensors");
    write(&early, &["--mode", "early-exit"]);
    fails(
        &["golden", "check", &early, "--onnx", &onnx],
        &[
            "`early-exit` goldens cannot be checked on ONNX Runtime",
            "drop --onnx",
        ],
    );
    let gate2 = p("gate2.safetensors");
    write(&gate2, &["--mode", "speculative", "--draft-gate", "2"]);
    fails(
        &["golden", "check", &gate2, "--onnx", &onnx],
        &["drafts at gate 2", "--draft-gate 2"],
    );
    // an export of other M2R2 weights
    let onnx_other = p("onnx-other");
    other_weights_exported("7", &p("other-m2r2"), &onnx_other);
    fails(
        &["golden", "check", &fixed, "--onnx", &onnx_other],
        &["M2R2 weights", "not the ones this golden was recorded with"],
    );
    // an export written before the manifest recorded its M2R2 weights
    let manifest = Path::new(&onnx).join("m2r2_export.json");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("m2r2_hash");
    std::fs::write(&manifest, json.to_string()).unwrap();
    fails(
        &["golden", "check", &fixed, "--onnx", &onnx],
        &["does not record which M2R2 weights", "export it again"],
    );
}

/// docs/GOLDEN.md's walk-through on SmolLM2 (the real m2r2 cache, where scripts/test.sh fetched
/// it): a greedy golden, a speculative one of the chain loop and one of the default drafting (the
/// dynamic chain with a lookup branch) of the shipped weights, the f32 export, all checks OK at
/// the defaults, the report naming the engine.
#[test]
fn smollm2_walk_through() {
    let real = super::smollm2_ok;
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (greedy, spec, onnx) = (p("g.safetensors"), p("s.safetensors"), p("smollm2"));
    let prompt = [
        "--model",
        "smollm2",
        "--prompt",
        "Why is the sky blue?",
        "--chat",
    ];
    let mut args = vec!["golden", "write"];
    args.extend(prompt);
    real(&[&args[..], &["--steps", "8", "--out", &greedy]].concat());
    let chain = real(
        &[
            &args[..],
            &["--steps", "16", "--mode", "speculative", "--out", &spec],
        ]
        .concat(),
    );
    // the chain loop, not the default drafting: the note says how to record that
    assert!(
        chain
            .stderr
            .contains("add --prompt-lookup 4 to record that"),
        "{}",
        chain.stderr
    );
    // what `generate --mode speculative` runs by default on SmolLM2: the config's dynamic chain
    // with its prompt-lookup branch (a token-tree golden of format version 5), on a prompt whose
    // answer quotes it, so rounds verify and accept branches
    let lookup = p("l.safetensors");
    let written: Value = serde_json::from_str(
        &real(&[
            "golden",
            "write",
            "--model",
            "smollm2",
            "--prompt",
            "Repeat exactly: the quick brown fox jumps over the lazy dog.",
            "--chat",
            "--steps",
            "24",
            "--mode",
            "speculative",
            "--prompt-lookup",
            "4",
            "--json",
            "--out",
            &lookup,
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(written["format_version"], 5, "{written}");
    assert_eq!(written["prompt_lookup"], 4, "{written}");
    assert!(written["tree_grown"]["threshold"].is_number(), "{written}");
    let bytes = std::fs::read(&lookup).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let verified_branch = st
        .tensor("round_lookup")
        .unwrap()
        .data()
        .chunks_exact(8)
        .any(|b| i64::from_le_bytes(b.try_into().unwrap()) > 0);
    assert!(verified_branch, "no round verified a lookup branch");
    real(&["export", "--model", "smollm2", "--out", &onnx]);
    for file in [&greedy, &spec, &lookup] {
        let run = real(&["golden", "check", file, "--onnx", &onnx, "--json"]);
        let report: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(report["ok"], true, "{report}");
        assert_eq!(report["golden_model"], "smollm2", "{report}");
        assert!(
            report["atol"].as_f64().unwrap() < 3e-4,
            "the f32 default: {report}"
        );
    }
    let run = real(&["golden", "check", &spec, "--onnx", &onnx]);
    for line in [
        "feed+draft+verifier.onnx rounds         OK",
        "verifier.onnx            verify_logits  OK",
        "draft.onnx               draft_logits   OK",
        "draft.onnx               round_scores   OK",
        "overall: OK",
    ] {
        assert!(run.stdout.contains(line), "{line}:\n{}", run.stdout);
    }
    let run = real(&["golden", "check", &lookup, "--onnx", &onnx]);
    for line in [
        "a lookup branch of up to 4 tokens",
        "feed+draft+verifier.onnx rounds         OK",
        "verifier.onnx            verify_logits  OK",
        "draft.onnx               round_scores   OK",
        "overall: OK",
    ] {
        assert!(run.stdout.contains(line), "{line}:\n{}", run.stdout);
    }
}

/// A manifest that claims more layers than its graphs take (a hostile input: the runner sizes its
/// KV cache by the manifest) is refused when the graphs are loaded, naming the graph, before any
/// cache is allocated; the greedy and the speculative paths alike.
#[test]
fn manifest_layers_must_match_the_graphs() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = dir.path().join("onnx").display().to_string();
    ok(&["export", "--model", "tiny", "--out", &onnx]);
    let manifest = Path::new(&onnx).join("m2r2_export.json");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    // (both counts: the M2R2 settings' `num_layers` is checked against the config first)
    json["config"]["num_hidden_layers"] = serde_json::json!(1u64 << 40);
    json["m2r2"]["num_layers"] = serde_json::json!(1u64 << 40);
    std::fs::write(&manifest, json.to_string()).unwrap();
    fails(
        &[
            "run",
            "--onnx",
            &onnx,
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "2",
        ],
        &["model.onnx", "export the folder again"],
    );
}

/// A draft.onnx without ARLA (an export of `--m2r2 none`) under a manifest that says `has_arla` is
/// refused when the graphs load, naming the graph and the missing output.
#[test]
fn manifest_arla_must_match_the_draft_graph() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain").display().to_string();
    ok(&[
        "export", "--model", "tiny", "--m2r2", "none", "--out", &plain,
    ]);
    // (a draft.onnx copied from another export is refused by its metadata first: graph_identity.rs)
    let path = Path::new(&plain).join("m2r2_export.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["has_arla"] = true.into();
    std::fs::write(&path, manifest.to_string()).unwrap();
    fails(
        &[
            "run",
            "--onnx",
            &plain,
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "2",
            "--mode",
            "speculative",
        ],
        &["draft.onnx", "(`has_arla`)", "no `exit_prob` output"],
    );
}

/// A golden written before the drafting defaults are chosen again (here by hand, as `tune-drafting
/// --write` would) still checks on the reference and on an export made afterwards: both match it
/// by `m2r2_weights_hash`. Other adapters are still refused, naming both identities.
#[test]
fn goldens_outlive_a_new_drafting_policy() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let (w, golden, onnx) = (p("w"), p("g.safetensors"), p("onnx"));
    ok(&["init-m2r2", "--model", "tiny", "--seed", "1", "--out", &w]);
    ok(&[
        "golden",
        "write",
        "--model",
        "tiny",
        "--m2r2",
        &w,
        "--tokens",
        "1,2,3",
        "--steps",
        "10",
        "--mode",
        "speculative",
        "--draft-len",
        "2",
        "--out",
        &golden,
    ]);
    let config = dir.path().join("w").join("m2r2_config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["draft_len"] = 3.into();
    c["prompt_lookup"] = 4.into();
    c["dynamic_draft"] = serde_json::json!({"gate": "confidence", "threshold": 0.25});
    std::fs::write(&config, c.to_string()).unwrap();
    ok(&["export", "--model", "tiny", "--m2r2", &w, "--out", &onnx]);
    for engine in [&["--model", "tiny", "--m2r2", &w][..], &["--onnx", &onnx]] {
        let args = [&["golden", "check", &golden][..], engine].concat();
        let report = ok(&[&args[..], &["--json"]].concat()).json();
        assert_eq!(report["ok"], true, "{engine:?}: {report}");
    }
    // other adapters: refused on both engines
    let (other, other_onnx) = (p("other"), p("other-onnx"));
    other_weights_exported("2", &other, &other_onnx);
    for engine in [
        &["--model", "tiny", "--m2r2", &other][..],
        &["--onnx", &other_onnx],
    ] {
        let args = [&["golden", "check", &golden][..], engine].concat();
        fails(
            &args,
            &["not the ones this golden was recorded with", "weights hash"],
        );
    }
}

/// A golden and an export whose draft heads differ (one pruned, the other full, or two pruned
/// heads of other tokens): the refusal says the draft head differs and how to make them agree,
/// not only that the weights' hashes differ. With the same head each checks OK.
#[test]
fn a_draft_head_difference_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    // the weights with a pruned head of the even ids (160 of tiny's 320 tokens), and a copy with
    // the odd ones
    let (w, odd) = (p("w"), p("odd"));
    let head = |folder: &str, first: u32| {
        let tokens: Vec<u32> = (first..320).step_by(2).collect();
        let text = serde_json::json!({ "tokens": tokens }).to_string();
        std::fs::write(Path::new(folder).join("draft_head.json"), text).unwrap();
    };
    for folder in [&w, &odd] {
        ok(&["init-m2r2", "--model", "tiny", "--out", folder]);
    }
    head(&w, 0);
    head(&odd, 1);
    let (full, pruned, other) = (p("full"), p("pruned"), p("other"));
    let export = |m2r2: &str, out: &str, extra: &[&str]| {
        let args = [
            &["export", "--model", "tiny", "--m2r2", m2r2, "--out", out][..],
            extra,
        ];
        ok(&args.concat());
    };
    export(&w, &full, &["--draft-head", "off"]);
    export(&w, &pruned, &[]);
    export(&odd, &other, &[]);
    let (on, off) = (p("on.safetensors"), p("off.safetensors"));
    for (golden, choice) in [(&on, "on"), (&off, "off")] {
        ok(&[
            "golden",
            "write",
            "--model",
            "tiny",
            "--m2r2",
            &w,
            "--draft-head",
            choice,
            "--tokens",
            "1,2,3",
            "--steps",
            "12",
            "--mode",
            "speculative",
            "--out",
            golden,
        ]);
    }
    fails(
        &["golden", "check", &on, "--onnx", &full],
        &[
            "the draft head differs: the golden was recorded with a pruned draft head of 160 \
             tokens",
            &format!("export {full} has none"),
            "--draft-head on",
        ],
    );
    fails(
        &["golden", "check", &off, "--onnx", &pruned],
        &[
            "the draft head differs: the golden was recorded with the full draft head",
            "a pruned draft head of 160 tokens",
            "--draft-head off",
        ],
    );
    fails(
        &["golden", "check", &on, "--onnx", &other],
        &[
            "the draft head differs",
            "another pruned draft head, of 160 tokens",
        ],
    );
    for (golden, export) in [(&on, &pruned), (&off, &full)] {
        let report = ok(&["golden", "check", golden, "--onnx", export, "--json"]).json();
        assert_eq!(report["ok"], true, "{report}");
    }
}

/// A chain golden on a static export: the positions counted before any run include the drafts
/// its rounds write past its last token (as `run` counts them), so a golden the buffers cannot
/// hold is refused up front, the margin named; one that fits checks OK.
#[test]
fn static_exports_count_a_chain_goldens_drafts_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let onnx = p("static32");
    ok(&[
        "export",
        "--model",
        "tiny",
        "--static-cache",
        "32",
        "--out",
        &onnx,
    ]);
    let write = |out: &str, steps: &str| {
        ok(&[
            "golden",
            "write",
            "--model",
            "tiny",
            "--tokens",
            "100,200,300,50,60",
            "--steps",
            steps,
            "--mode",
            "speculative",
            "--ignore-eos",
            "--out",
            out,
        ]);
    };
    // 5 prompt tokens, 25 fed steps and 4 drafts past them: 34 positions of 32
    let (long, fits) = (p("long.safetensors"), p("fits.safetensors"));
    write(&long, "26");
    let run = fails(
        &["golden", "check", &long, "--onnx", &onnx],
        &[
            "verifier.onnx: the static cache holds 32 positions, and a golden of 5 prompt tokens \
             and 26 steps (its rounds draft up to 4 positions past its last token) needs 34",
            "check a golden of fewer steps",
        ],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    // 5 + 23 + 4 = 32
    write(&fits, "24");
    let report = ok(&["golden", "check", &fits, "--onnx", &onnx, "--json"]).json();
    assert_eq!(report["ok"], true, "{report}");
}
