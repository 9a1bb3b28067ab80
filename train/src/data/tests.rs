//! Tests of the data folders: round trip and refusals, the dev-prompts and shared-prompts guards,
//! resumable runs, and several folders read as one set.

use super::*;

fn meta() -> DistillMeta {
    DistillMeta {
        model: "tiny".into(),
        config_hash: None,
        prompts: "p.jsonl".into(),
        prompts_sha256: None,
        samples_per_prompt: 1,
        max_new_tokens: 4,
        temperature: None,
        seed: 0,
        samples: 1,
        tokens: 5,
    }
}

#[test]
fn round_trip_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = DistillSample {
        prompt_id: "a".into(),
        sample: 0,
        prompt_len: 2,
        tokens: vec![1, 2, 3, 4, 5],
    };
    write(dir.path(), std::slice::from_ref(&s), &meta()).unwrap();
    let (back, m) = read(dir.path(), 10).unwrap();
    assert_eq!(back, vec![s]);
    assert_eq!(m, meta());
    assert_eq!(back[0].first_row(), 1);
    let err = read(dir.path(), 5).unwrap_err().to_string();
    assert!(err.contains("line 1") && err.contains("token 5"), "{err}");
    std::fs::write(
        dir.path().join(SAMPLES_FILE),
        "{\"prompt_id\":\"a\",\"sample\":0,\"prompt_len\":0,\"tokens\":[1]}\n",
    )
    .unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(err.contains("prompt_len 0"), "{err}");

    let missing = dir.path().join("nowhere");
    let err = read(&missing, 10).unwrap_err().to_string();
    assert!(
        err.contains("nowhere") && err.contains("no such data folder"),
        "{err}"
    );
    let err = read(&dir.path().join(SAMPLES_FILE), 10)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such data folder"), "{err}");
    let other = tempfile::tempdir().unwrap();
    let err = read(other.path(), 10).unwrap_err().to_string();
    assert!(
        err.contains("not a distillation data folder: it has no meta.json"),
        "{err}"
    );
}

/// Data made from a file named dev_prompts.jsonl (in any folder) is refused, naming the flag,
/// the folder and the prompts file; any other prompts file passes.
#[test]
fn dev_prompts_are_refused_by_their_file_name() {
    let dev = DistillMeta {
        prompts: "/x/shared/data/dev_prompts.jsonl".into(),
        ..meta()
    };
    assert!(dev.from_dev_prompts());
    let err = refuse_dev_prompts("--data", Path::new("d"), &dev, "training fits it")
        .unwrap_err()
        .to_string();
    for needle in [
        "d/meta.json",
        "--data d",
        "dev_prompts.jsonl",
        "training fits it",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    for other in [
        "p.jsonl",
        "dev_prompts.jsonl.bak",
        "my_dev_prompts.jsonl",
        "",
    ] {
        let m = DistillMeta {
            prompts: other.into(),
            ..meta()
        };
        assert!(!m.from_dev_prompts(), "{other}");
        refuse_dev_prompts("--data", Path::new("d"), &m, "x").unwrap();
    }
}

/// Held-out data sharing a prompt (the token ids up to prompt_len, whatever the responses and
/// prompt ids) with the training data is refused with the count of distinct shared prompts.
#[test]
fn shared_prompts_are_counted_by_their_tokens() {
    let s = |id: &str, prompt: &[u32], response: &[u32]| DistillSample {
        prompt_id: id.into(),
        sample: 0,
        prompt_len: prompt.len(),
        tokens: [prompt, response].concat(),
    };
    let train = [s("t0", &[1, 2], &[3]), s("t1", &[4], &[5, 6])];
    let dirs = [PathBuf::from("train")];
    // the same ids with other prompts, and a train prompt's prefix: held out
    let held = [s("t0", &[1], &[2, 3]), s("t1", &[4, 5], &[6])];
    refuse_shared_prompts(&train, &dirs, &held, "--eval-data", Path::new("dev")).unwrap();
    // one prompt shared twice (two responses), one not: 1 of 2
    let held = [
        s("d0", &[1, 2], &[9]),
        s("d0", &[1, 2], &[8, 7]),
        s("d1", &[7], &[3]),
    ];
    let err = refuse_shared_prompts(&train, &dirs, &held, "--eval-data", Path::new("dev"))
        .unwrap_err()
        .to_string();
    for needle in [
        "dev/samples.jsonl",
        "--eval-data: 1 of its 2 prompts",
        "--data train",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

fn sample(id: &str, k: usize) -> DistillSample {
    DistillSample {
        prompt_id: id.into(),
        sample: k,
        prompt_len: 1,
        tokens: vec![1, 2, k as u32],
    }
}

/// A stopped run keeps what it appended (a torn last line dropped), `--resume` continues it,
/// other settings are refused, and the finished folder is in prompt order with its counts.
#[test]
fn run_appends_resumes_and_finishes_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let planned = || DistillMeta {
        samples_per_prompt: 2,
        prompts_sha256: Some("ab".repeat(32)),
        ..meta()
    };
    let prompts = [("a".to_string(), vec![1]), ("b".to_string(), vec![1])];
    let mut run = Run::start(dir.path(), &planned(), Start::Fresh, 10, &prompts).unwrap();
    run.append(&sample("b", 0)).unwrap();
    run.append(&sample("a", 1)).unwrap();
    drop(run); // stopped
    let samples = dir.path().join(SAMPLES_FILE);
    let mut text = std::fs::read_to_string(&samples).unwrap();
    text += "{\"prompt_id\":\"a\",\"sam";
    std::fs::write(&samples, text).unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(
        err.contains("an unfinished distill-data run") && err.contains("--resume"),
        "{err}"
    );

    let other = DistillMeta {
        seed: 9,
        prompts_sha256: Some("cd".repeat(32)),
        ..planned()
    };
    let err = Run::start(dir.path(), &other, Start::Resume, 10, &prompts)
        .err()
        .unwrap()
        .to_string();
    for needle in [
        "progress.json",
        "`seed` (--seed: 0 there, 9 now)",
        "`prompts`",
        "abababababab there, cdcdcdcdcdcd now",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // a fresh run refuses the unfinished folder; a resume over other prompts names the sample
    let err = Run::start(dir.path(), &planned(), Start::Fresh, 10, &prompts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("unfinished") && err.contains("--resume"),
        "{err}"
    );
    for other in [
        vec![("a".to_string(), vec![1])],
        vec![("a".to_string(), vec![1]), ("b".to_string(), vec![2])],
    ] {
        let err = Run::start(dir.path(), &planned(), Start::Resume, 10, &other)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("line 1 (prompt `b`, sample 0)"), "{err}");
    }
    assert!(dir.path().join(PROGRESS_FILE).exists());

    let mut run = Run::start(dir.path(), &planned(), Start::Resume, 10, &prompts).unwrap();
    let done = run.done();
    assert_eq!(done.len(), 2);
    assert!(done.contains(&("b".into(), 0)) && done.contains(&("a".into(), 1)));
    run.append(&sample("a", 0)).unwrap();
    let order = ["a".to_string(), "b".to_string()];
    let all = run.finish(&order, planned()).unwrap();
    let keys: Vec<(&str, usize)> = all
        .iter()
        .map(|s| (s.prompt_id.as_str(), s.sample))
        .collect();
    assert_eq!(keys, [("a", 0), ("a", 1), ("b", 0)]);
    let (back, m) = read(dir.path(), 10).unwrap();
    assert_eq!(back, all);
    assert_eq!((m.samples, m.tokens), (3, 9));
    assert!(!dir.path().join(PROGRESS_FILE).exists());

    // A fresh start refuses the finished folder; a forced one replaces it.
    let err = Run::start(dir.path(), &planned(), Start::Fresh, 10, &prompts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("holds a finished distill-data run (3 samples)") && err.contains("--force"),
        "{err}"
    );
    assert!(dir.path().join(META_FILE).exists());
    let run = Run::start(dir.path(), &planned(), Start::Force, 10, &prompts).unwrap();
    assert!(run.samples.is_empty());
    assert!(!dir.path().join(META_FILE).exists());
}

/// `--resume` needs a run to continue; a fresh run needs an empty or missing folder.
#[test]
fn check_out_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = check_out(&missing, Start::Resume).unwrap_err().to_string();
    assert!(err.contains("missing does not exist"), "{err}");
    check_out(&missing, Start::Fresh).unwrap();
    check_out(dir.path(), Start::Fresh).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    let err = check_out(dir.path(), Start::Resume)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no distill-data run"), "{err}");
    let err = check_out(dir.path(), Start::Fresh).unwrap_err().to_string();
    assert!(
        err.contains("not empty") && err.contains("--force"),
        "{err}"
    );
    check_out(dir.path(), Start::Force).unwrap();
    let err = check_out(&dir.path().join("notes.txt"), Start::Force)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a folder"), "{err}");
}

/// The prompts are compared by digest where both runs have one, else by path (`./p.jsonl` is
/// `p.jsonl`); every differing setting is named.
#[test]
fn differing_settings_compare_prompts_by_content() {
    let hashed = |h: &str, path: &str| DistillMeta {
        prompts: path.into(),
        prompts_sha256: Some(h.repeat(64)),
        ..meta()
    };
    assert!(
        hashed("a", "p.jsonl")
            .differing_settings(&hashed("a", "elsewhere/q.jsonl"))
            .is_empty()
    );
    let d = hashed("a", "p.jsonl").differing_settings(&hashed("b", "p.jsonl"));
    assert!(d.len() == 1 && d[0].contains("--limit differs"), "{d:?}");
    let old = meta(); // no digest: the path decides
    assert!(old.differing_settings(&hashed("a", "./p.jsonl")).is_empty());
    let d = old.differing_settings(&DistillMeta {
        model: "smollm2".into(),
        temperature: Some(0.5),
        ..hashed("a", "q.jsonl")
    });
    assert_eq!(d.len(), 3, "{d:?}");
    assert!(
        d[0].contains("`model` (--model: tiny there, smollm2 now)"),
        "{d:?}"
    );
    assert!(d[1].contains("p.jsonl there, q.jsonl now"), "{d:?}");
    assert!(d[2].contains("greedy there, 0.5 now"), "{d:?}");
}

/// The model is compared by config hash where both runs have one (one model, two names, is the
/// same; two models of one name are not), else by name.
#[test]
fn the_model_is_compared_by_config_hash() {
    let hashed = |name: &str, h: &str| DistillMeta {
        model: name.into(),
        config_hash: Some(h.into()),
        ..meta()
    };
    let gguf = hashed("SmolLM2-135M-Instruct.gguf", "9fcd");
    assert!(
        gguf.differing_settings(&hashed("smollm2", "9fcd"))
            .is_empty()
    );
    let d = gguf.differing_settings(&hashed("SmolLM2-135M-Instruct.gguf", "77aa"));
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].contains("config 9fcd there") && d[0].contains("config 77aa now"),
        "{d:?}"
    );
    assert!(!gguf.from_other_model("smollm2", "9fcd"));
    assert!(gguf.from_other_model("SmolLM2-135M-Instruct.gguf", "77aa"));
    // an older folder, without the hash: by name
    let old = meta();
    assert!(!old.from_other_model("tiny", "77aa"));
    assert!(old.from_other_model("smollm2", "9fcd"));
    let d = old.differing_settings(&hashed("smollm2", "9fcd"));
    assert!(d.len() == 1 && d[0].contains("`model`"), "{d:?}");
}

/// meta.json with an unknown field, counts that disagree with samples.jsonl, or a progress.json
/// beside it is refused.
#[test]
fn read_refuses_unknown_fields_and_wrong_counts() {
    let dir = tempfile::tempdir().unwrap();
    let s = DistillSample {
        prompt_id: "a".into(),
        sample: 0,
        prompt_len: 2,
        tokens: vec![1, 2, 3, 4, 5],
    };
    write(dir.path(), std::slice::from_ref(&s), &meta()).unwrap();
    read(dir.path(), 10).unwrap();
    let path = dir.path().join(META_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen('{', "{\"extra\": 1,", 1)).unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(err.contains("unknown field `extra`"), "{err}");
    let wrong = DistillMeta {
        samples: 999,
        ..meta()
    };
    write(dir.path(), std::slice::from_ref(&s), &wrong).unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(
        err.contains("counts 999 samples of 5 tokens but samples.jsonl holds 1 of 5"),
        "{err}"
    );
    write(dir.path(), std::slice::from_ref(&s), &meta()).unwrap();
    std::fs::write(dir.path().join(PROGRESS_FILE), "{}").unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(
        err.contains("unfinished") && err.contains("--resume"),
        "{err}"
    );
}

#[test]
fn read_all_concatenates_in_order_and_names_a_bad_folder() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sample = |id: &str, tokens: Vec<u32>| DistillSample {
        prompt_id: id.into(),
        sample: 0,
        prompt_len: 1,
        tokens,
    };
    let counted = |samples, tokens| DistillMeta {
        samples,
        tokens,
        ..meta()
    };
    write(a.path(), &[sample("a", vec![1, 2])], &counted(1, 2)).unwrap();
    write(
        b.path(),
        &[sample("b", vec![3]), sample("c", vec![4, 5])],
        &counted(2, 3),
    )
    .unwrap();
    let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
    let (all, metas, counts) = read_all(&dirs, 10).unwrap();
    assert_eq!(counts, [1, 2]);
    let ids: Vec<&str> = all.iter().map(|s| s.prompt_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(metas.len(), 2);
    let missing = [a.path().to_path_buf(), a.path().join("nope")];
    let err = read_all(&missing, 10).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
}

/// Every committed data folder (data/distill, SmolLM2's vocabulary of 49152) still reads: no
/// unknown meta field, counts equal to its samples.
#[test]
fn committed_data_folders_read() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/distill");
    let mut read_any = false;
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join(META_FILE).exists() {
            let (samples, meta) = read(&dir, 49152).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(samples.len(), meta.samples, "{}", dir.display());
            read_any = true;
        }
    }
    assert!(read_any, "no data folder under {}", root.display());
}

/// A sample without tokens is named as such, not as `prompt_len 0 must be in 1..=0`.
#[test]
fn a_sample_without_tokens_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let empty = DistillSample {
        prompt_id: "a".into(),
        sample: 0,
        prompt_len: 0,
        tokens: vec![],
    };
    write(dir.path(), &[sample("b", 0), empty], &meta()).unwrap();
    let err = read(dir.path(), 10).unwrap_err().to_string();
    assert!(
        err.contains("samples.jsonl: line 2: the sample has no tokens"),
        "{err}"
    );
    assert!(!err.contains("1..=0"), "{err}");
}

/// The first sample too long for the context is named by file and line, across folders and after
/// blank lines and a cut; the positions a command adds count, and are said.
#[test]
fn samples_beyond_the_context_are_named_by_file_and_line() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let long = DistillSample {
        tokens: vec![1; 8],
        ..sample("long", 0)
    };
    write(a.path(), &[sample("a", 0)], &meta()).unwrap();
    write(b.path(), &[sample("b", 0), long.clone()], &meta()).unwrap();
    let path = b.path().join(SAMPLES_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("\n{}", text.replacen('\n', "\n\n", 1))).unwrap();
    let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
    let samples = [sample("a", 0), sample("b", 0), long];
    let need = |context, extra| ContextNeed {
        context,
        extra,
        advice: "advice",
    };
    check_context(&dirs, &samples, &need(8, None)).unwrap();
    let err = check_context(&dirs, &samples, &need(7, None))
        .unwrap_err()
        .to_string();
    let want = format!(
        "{}: line 4: the sample has 8 tokens, more than the model's context of 7 positions \
         (advice)",
        path.display()
    );
    assert_eq!(err, want);
    let err = check_context(&dirs, &samples, &need(8, Some((1, "it runs in one more"))))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 4: the sample has 8 tokens, and it runs in one more: 9 positions"),
        "{err}"
    );
    // cut before the long sample (--limit): nothing to refuse
    check_context(&dirs, &samples[..2], &need(7, None)).unwrap();
    // a folder changed since it was read: the sample is named by its place and prompt
    std::fs::write(&path, "").unwrap();
    let err = check_context(&dirs, &samples, &need(7, None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sample 3 (prompt long): the sample has 8"),
        "{err}"
    );
}
