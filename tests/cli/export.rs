//! `m2r2 export` end to end: a full export of the built-in models checked under ONNX Runtime
//! (`--check`), the flavours (f16, external data, chosen graphs), and the failure cases: each exits
//! non-zero with a message naming what to fix, and leaves no folder that looks like an export.

use super::{fails, ok};

#[test]
fn export_with_check_passes_on_the_builtin_models() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny", "tiny-moe"] {
        let out = dir.path().join(model);
        let out_s = out.to_str().unwrap();
        // ONNX Runtime: the m2r2() helper sets ORT_DYLIB_PATH for every run
        let run = ok(&["export", "--model", model, "--out", out_s, "--check"]);
        // the summary table and the check table
        assert!(run.stdout.contains("model.onnx") && run.stdout.contains("verifier.onnx"));
        assert!(
            run.stdout.contains("MatMul"),
            "op histogram:\n{}",
            run.stdout
        );
        assert!(!run.stdout.contains("NOT OK"), "{}", run.stdout);
        assert!(run.stderr.contains("check passed"), "{}", run.stderr);
        for file in [
            "model.onnx",
            "draft.onnx",
            "verifier.onnx",
            "feed.onnx",
            "genai_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "m2r2_export.json",
        ] {
            assert!(out.join(file).is_file(), "{model}: {file}");
        }
    }
}

#[test]
fn flavours_and_graph_selection() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let out_s = out.to_str().unwrap();
    ok(&[
        "export",
        "--model",
        "tiny",
        "--m2r2",
        "none",
        "--out",
        out_s,
        "--graphs",
        "model,draft",
        "--weights-dtype",
        "f16",
        "--external-data",
        "--draft-gate",
        "2",
        "--opset",
        "18",
    ]);
    assert!(out.join("model.onnx.data").is_file());
    assert!(out.join("draft.onnx.data").is_file());
    assert!(!out.join("verifier.onnx").exists());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("m2r2_export.json")).unwrap()).unwrap();
    assert_eq!(manifest["weights_dtype"], "f16");
    assert_eq!(manifest["draft_gate"], 2);
    assert_eq!(manifest["opset"], 18);
    assert_eq!(manifest["has_arla"], false);
    assert_eq!(
        manifest["graphs"],
        serde_json::json!({"model": "model.onnx", "draft": "draft.onnx"})
    );
}

#[test]
fn failures_are_clear_and_leave_no_export() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let out_s = out.to_str().unwrap();
    fails(
        &["export", "--model", "tiny", "--out", out_s, "--opset", "13"],
        &["opset 13 is not supported", "--opset 17"],
    );
    // static graphs are always opset 24: an explicit --opset beside --static-cache is refused
    let both = ["--opset", "21", "--static-cache", "64"];
    fails(
        &[&["export", "--model", "tiny", "--out", out_s][..], &both].concat(),
        &["--opset", "cannot be used with", "--static-cache"],
    );
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            out_s,
            "--draft-gate",
            "7",
        ],
        &["--draft-gate 7 does not exist"],
    );
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            out_s,
            "--graphs",
            "model,encoder",
        ],
        &["unknown graph `encoder`"],
    );
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            out_s,
            "--weights-dtype",
            "bf16",
        ],
        &["unknown weights dtype `bf16`"],
    );
    assert!(!out.exists());
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    fails(
        &["export", "--model", "tiny", "--out", out_s],
        &["not an earlier export"],
    );
    assert!(out.join("keep.txt").is_file());
    assert!(!out.join("m2r2_export.json").exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no partial folder left"
    );
}

/// An f16 export of a checkpoint with a weight beyond f16's finite range (it would be stored as
/// inf, and the graphs would compute NaN) is refused, naming the tensor, its largest |value| and
/// 65504, and leaves nothing; the f32 export it suggests holds the weight and passes its check.
#[test]
fn f16_refuses_a_weight_beyond_its_range() {
    use reference::io::checkpoint::write_f32_safetensors;
    let dir = tempfile::tempdir().unwrap();
    let src = m2r2_tests::fixture_dir()
        .join("hf")
        .join("llama_untied_bias");
    let big = dir.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::copy(src.join("config.json"), big.join("config.json")).unwrap();
    let mut tensors = m2r2_tests::checkpoint_tensors(&src);
    let (_, shape, head) = tensors
        .iter_mut()
        .find(|(name, _, _)| name == "lm_head.weight")
        .expect("an untied checkpoint has lm_head.weight");
    let row = 5 * shape[1];
    head[row + 3] = 1e5;
    head[row + 4] = -1.5e5;
    write_f32_safetensors(&big.join("model.safetensors"), &tensors, None).unwrap();
    let (big_s, out) = (big.to_str().unwrap(), dir.path().join("e16"));
    let out_s = out.to_str().unwrap();
    let f16 = ["--weights-dtype", "f16", "--check"];
    fails(
        &[&["export", "--model", big_s, "--out", out_s][..], &f16].concat(),
        &[
            "weight `lm_head.weight` does not fit in f16",
            "its largest |value| is 150000, beyond 65504",
            "export with --weights-dtype f32",
        ],
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no partial folder left"
    );
    let run = ok(&[
        "export", "--model", big_s, "--out", out_s, "--graphs", "model", "--check",
    ]);
    assert!(run.stderr.contains("check passed"), "{}", run.stderr);
}

#[test]
fn missing_parents_are_created_and_a_file_parent_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out").join("a").join("b");
    let out_s = out.to_str().unwrap();
    ok(&["export", "--model", "tiny", "--out", out_s, "--check"]);
    assert!(out.join("m2r2_export.json").is_file());
    assert_eq!(
        std::fs::read_dir(out.parent().unwrap()).unwrap().count(),
        1,
        "no partial folder left beside the export"
    );

    // a parent that is a regular file: a clear error naming it, nothing written
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("a").join("b");
    let out_s = out.to_str().unwrap();
    let file_s = file.display().to_string();
    let run = fails(
        &["export", "--model", "tiny", "--out", out_s],
        &[
            "cannot create its parent",
            &format!("{file_s} exists and is not a folder"),
        ],
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

/// `export --static-cache L --check` on tiny and tiny-moe: the four static graphs (opset 24,
/// RMSNormalization / RotaryEmbedding / TensorScatter / Attention) checked against the reference;
/// no genai_config.json; `info --onnx` describes the folder; a merged f16 draft passes; a probe
/// longer than L is refused by name.
#[test]
fn static_cache_export_with_check() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny", "tiny-moe"] {
        let out = dir.path().join(model);
        let o = out.to_str().unwrap();
        let run = ok(&[
            "export",
            "--model",
            model,
            "--out",
            o,
            "--static-cache",
            "64",
            "--check",
        ]);
        for op in [
            "RMSNormalization",
            "RotaryEmbedding",
            "TensorScatter",
            "Attention",
        ] {
            assert!(run.stdout.contains(op), "{model}: {op}\n{}", run.stdout);
        }
        assert!(run.stdout.contains("model.onnx (static)"), "{}", run.stdout);
        assert!(!run.stdout.contains("NOT OK"), "{}", run.stdout);
        assert!(run.stderr.contains("check passed"), "{}", run.stderr);
        assert!(run.stderr.contains("static KV cache"), "{}", run.stderr);
        for graph in ["draft.onnx", "verifier.onnx", "feed.onnx"] {
            assert!(
                run.stdout.contains(&format!("{graph:<29}")),
                "{model}: {graph} checked\n{}",
                run.stdout
            );
        }
        assert!(!out.join("genai_config.json").exists());
        // info --onnx describes the folder: every graph static, with L
        let info = ok(&["info", "--onnx", o, "--json"]).json();
        assert_eq!(info["static_cache"]["l_max"], 64);
        assert_eq!(info["genai_config"], false);
        let graphs = info["graphs"].as_array().unwrap();
        assert_eq!(graphs.len(), 4);
        for g in graphs {
            assert_eq!(g["kv_cache"]["kind"], "static", "{g}");
            assert_eq!(g["kv_cache"]["l_max"], 64, "{g}");
            assert_eq!(g["opset"], 24, "{g}");
        }
        if model == "tiny" {
            // (tiny-moe's MoE layers run every expert on every row: more nodes)
            assert!(graphs[0]["nodes_per_layer"].as_f64().unwrap() <= 20.0);
        }
        let text = ok(&["info", "--onnx", o]).stdout;
        assert!(text.contains("static, L = 64"), "{text}");
    }
    // a graph listed twice is refused before anything is written
    let twice = dir.path().join("twice");
    fails(
        &[
            "export",
            "--out",
            twice.to_str().unwrap(),
            "--graphs",
            "model,draft, model",
        ],
        &["--graphs model,draft, model: `model` is listed twice (item 3)"],
    );
    assert!(!twice.exists());
    // an export describes itself: --model (or --m2r2) beside --onnx is refused, not ignored
    let tiny = dir.path().join("tiny");
    let t = tiny.to_str().unwrap();
    fails(
        &["info", "--onnx", t, "--model", "smollm2"],
        &["'--onnx <DIR>' cannot be used with '--model <MODEL>'"],
    );
    // a graph the manifest lists but the folder lost is named, once
    std::fs::remove_file(tiny.join("draft.onnx")).unwrap();
    let run = fails(
        &["info", "--onnx", tiny.to_str().unwrap()],
        &["cannot read the draft graph", "draft.onnx", "No such file"],
    );
    assert_eq!(
        run.stderr.matches("draft.onnx").count(),
        1,
        "{}",
        run.stderr
    );
    // a merged f16 draft passes, its fast outputs at their own tolerance (export::check)
    let merged = dir.path().join("merged-f16");
    let run = ok(&[
        "export",
        "--model",
        "tiny",
        "--out",
        merged.to_str().unwrap(),
        "--static-cache",
        "64",
        "--merge-adapters",
        "--weights-dtype",
        "f16",
        "--check",
    ]);
    assert!(!run.stdout.contains("NOT OK"), "{}", run.stdout);
    assert!(run.stdout.contains("2e-3"), "{}", run.stdout);
    assert!(
        run.stderr.contains("check passed") && run.stderr.contains("their tolerance column"),
        "{}",
        run.stderr
    );
    // the probe of tiny's tokenizer is 36 tokens: buffers of 16 get the first 16 of it
    let short = dir.path().join("short16");
    let run = ok(&[
        "export",
        "--model",
        "tiny",
        "--out",
        short.to_str().unwrap(),
        "--static-cache",
        "16",
        "--check",
    ]);
    assert!(
        run.stderr.contains("a probe of 16 tokens fed as 8 + 8")
            && run.stderr.contains("check passed"),
        "{}",
        run.stderr
    );
    let out = dir.path().join("short");
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            out.to_str().unwrap(),
            "--static-cache",
            "0",
        ],
        &["--static-cache 0"],
    );
    // --merge-adapters builds the static draft: refused without --static-cache, without draft in
    // --graphs, and with MoE layers below the draft gate
    let merge = |model: &str, cache: &[&str], want: &[&str]| {
        let o = out.to_str().unwrap();
        let args = [
            &["export", "--model", model, "--out", o, "--merge-adapters"][..],
            cache,
        ];
        fails(&args.concat(), want);
    };
    merge("tiny", &[], &["--merge-adapters", "--static-cache"]);
    merge(
        "tiny",
        &["--static-cache", "32", "--graphs", "model,verifier"],
        &["add draft to --graphs"],
    );
    merge(
        "tiny-moe",
        &["--static-cache", "32"],
        &["mixture of experts"],
    );
}

/// A folder is replaced only when it is an earlier export: a file named m2r2_export.json is not
/// enough (the user's files beside it survive), nor is a real manifest beside a foreign file; an
/// export with the runner's trt_cache folder is replaced.
#[test]
fn only_an_earlier_export_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("keep");
    let k = keep.to_str().unwrap();
    std::fs::create_dir(&keep).unwrap();
    std::fs::write(keep.join("notes.txt"), "notes").unwrap();
    std::fs::write(keep.join("m2r2_export.json"), "{}").unwrap();
    let export = ["export", "--model", "tiny", "--out", k, "--graphs", "model"];
    fails(
        &export,
        &[
            "not an earlier export",
            "m2r2_export.json is not this exporter's manifest",
            "remove it or choose another folder",
        ],
    );
    assert_eq!(std::fs::read(keep.join("notes.txt")).unwrap(), b"notes");
    assert_eq!(std::fs::read(keep.join("m2r2_export.json")).unwrap(), b"{}");
    assert_eq!(std::fs::read_dir(&keep).unwrap().count(), 2);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no partial folder"
    );

    // a real export with a file of the user's added: refused, naming it
    std::fs::remove_dir_all(&keep).unwrap();
    ok(&export);
    std::fs::write(keep.join("notes.txt"), "notes").unwrap();
    fails(
        &export,
        &["the file notes.txt, which an export does not write"],
    );
    assert!(keep.join("notes.txt").is_file());
    // the runner's TensorRT cache inside it is no obstacle
    std::fs::remove_file(keep.join("notes.txt")).unwrap();
    std::fs::create_dir(keep.join("trt_cache")).unwrap();
    std::fs::write(keep.join("trt_cache").join("engine"), "x").unwrap();
    ok(&export);
    assert!(keep.join("model.onnx").is_file() && !keep.join("trt_cache").exists());
}

/// A temporary folder left by an export that was stopped (Ctrl-C, `kill`) is removed by the next
/// export to the same folder, with a note; one of a live process is left alone.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_exports_partial_folder_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // no process has this id (Linux ids stay below 2^22)
    let stale = dir.path().join(".out.partial-4000000000");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("model.onnx"), "half a graph").unwrap();
    // process 1 is alive
    let live = dir.path().join(".out.partial-1");
    std::fs::create_dir(&live).unwrap();
    let export = ["export", "--model", "tiny", "--graphs", "model", "--out"];
    let run = ok(&[&export[..], &[out.to_str().unwrap()]].concat());
    assert!(
        run.stderr.contains(&format!(
            "note: removed {}, left by an export to the same folder that was stopped",
            stale.display()
        )),
        "{}",
        run.stderr
    );
    assert!(!stale.exists() && live.is_dir() && out.join("model.onnx").is_file());
}

/// `--out` a symbolic link to a folder: the export goes into that folder and the link stays.
#[cfg(unix)]
#[test]
fn a_link_out_is_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for out in [link.display().to_string(), format!("{}/", link.display())] {
        ok(&[
            "export", "--model", "tiny", "--out", &out, "--graphs", "model",
        ]);
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(meta.file_type().is_symlink(), "{out}: the link stays");
        assert!(target.join("model.onnx").is_file(), "{out}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            2,
            "{out}: no partial folder left"
        );
    }
    // a link to a folder of the user's: refused like the folder, which stays as it was
    std::fs::write(target.join("notes.txt"), "notes").unwrap();
    let l = link.to_str().unwrap();
    fails(
        &["export", "--model", "tiny", "--out", l, "--graphs", "model"],
        &["not an earlier export", "notes.txt"],
    );
    assert!(target.join("notes.txt").is_file() && target.join("model.onnx").is_file());
    // a link to nothing: named, with its target
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).unwrap();
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            dangling.to_str().unwrap(),
        ],
        &["dangling is a symbolic link to", "gone"],
    );
    assert!(!dir.path().join("gone").exists());
}

/// genai_config.json only beside model.onnx, the graph onnxruntime-genai loads; feed.onnx only
/// beside draft.onnx and verifier.onnx, the graphs it serves.
#[test]
fn genai_config_needs_model_and_feed_needs_draft_and_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("draft");
    let o = out.to_str().unwrap();
    ok(&["export", "--model", "tiny", "--out", o, "--graphs", "draft"]);
    assert!(out.join("draft.onnx").is_file());
    assert!(!out.join("genai_config.json").exists());
    assert_eq!(
        ok(&["info", "--onnx", o, "--json"]).json()["genai_config"],
        false
    );
    let text = ok(&["info", "--onnx", o]).stdout;
    assert!(!text.contains("loads model.onnx"), "{text}");
    let out = dir.path().join("feed");
    let o = out.to_str().unwrap();
    for (graphs, missing) in [
        ("feed", "add draft,verifier to --graphs"),
        ("model,feed", "feed without draft and verifier"),
        ("draft,feed", "add verifier to --graphs, or drop feed"),
    ] {
        fails(
            &["export", "--model", "tiny", "--out", o, "--graphs", graphs],
            &["only serves speculative decoding", missing],
        );
    }
    assert!(!out.exists());
}

/// Refusals that come before anything is written, with messages that say what works.
#[test]
fn static_check_and_opset_refusals_say_what_works() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x");
    let o = out.to_str().unwrap();
    fails(
        &[
            "export",
            "--model",
            "tiny",
            "--out",
            o,
            "--static-cache",
            "1",
            "--check",
        ],
        &[
            "2 positions or more (--static-cache 1)",
            "raise --static-cache, or drop --check",
        ],
    );
    fails(
        &["export", "--model", "tiny", "--out", o, "--opset", "24"],
        &["opset 17..=21 only", "opset 24 comes with --static-cache"],
    );
    let run = fails(
        &["export", "--model", "tiny", "--out", o, "--opset", "16"],
        &[
            "support opset 17..=21 only",
            "17 is the oldest",
            "--opset 17",
        ],
    );
    assert!(!run.stderr.contains("needs 15"), "{}", run.stderr);
    assert!(!out.exists());
}
