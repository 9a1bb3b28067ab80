//! `distill-prompts`: the run's files, the same candidates at any batch size, resume, refusals.

use super::*;

/// Success, or a run that kept no prompt (`tiny`'s random weights never end a user turn): that
/// writes its folder, then exits 1 saying so.
fn good(r: &Run) -> bool {
    r.code == Some(0) || (r.code == Some(1) && r.stderr.contains("no prompt passed the filters"))
}

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sorted_candidates(dir: &std::path::Path) -> Vec<Value> {
    let mut c = lines(&dir.join("candidates.jsonl"));
    c.sort_by_key(|v| v["seed"].as_u64().unwrap());
    c
}

#[test]
fn distill_prompts_files_batches_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let run = |out: &str, batch: &str, extra: &[&str]| {
        let out = p(out).display().to_string();
        let mut args = vec!["distill-prompts", "--out", out.as_str(), "--count", "6"];
        args.extend(["--max-prompt-tokens", "10", "--seed", "5", "--batch", batch]);
        args.extend(extra);
        m2r2(&args)
    };
    let first = run("a", "4", &[]);
    assert!(good(&first), "{}", first.stderr);
    assert!(first.stdout.contains("of 6 candidates"), "{}", first.stdout);
    assert!(
        first.stderr.contains("user messages: 6/6 after"),
        "{}",
        first.stderr
    );
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(p("a/meta.json")).unwrap()).unwrap();
    let counted: u64 = meta["verdicts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, 6, "{meta}");
    assert_eq!(
        meta["prompts"].as_u64().unwrap() as usize,
        lines(&p("a/prompts.jsonl")).len()
    );
    assert!(!p("a/progress.json").exists());
    let candidates = sorted_candidates(&p("a"));
    let seeds: Vec<u64> = candidates
        .iter()
        .map(|c| c["seed"].as_u64().unwrap())
        .collect();
    assert_eq!(seeds, [5, 6, 7, 8, 9, 10]);

    // another batch size samples the same messages
    assert!(good(&run("b", "1", &[])));
    assert_eq!(sorted_candidates(&p("b")), candidates);

    // a run stopped after three candidates (progress.json, no meta) resumes to the same result
    std::fs::create_dir(p("c")).unwrap();
    std::fs::write(p("c/progress.json"), meta["settings"].to_string()).unwrap();
    let kept: String = candidates[..3].iter().map(|c| format!("{c}\n")).collect();
    std::fs::write(p("c/candidates.jsonl"), kept).unwrap();
    let resumed = run("c", "4", &["--resume"]);
    assert!(good(&resumed), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains("3 of 6 candidates already sampled"),
        "{}",
        resumed.stderr
    );
    assert_eq!(sorted_candidates(&p("c")), candidates);
    assert_eq!(lines(&p("c/prompts.jsonl")), lines(&p("a/prompts.jsonl")));

    // refusals: resuming a finished run, other settings, a folder of something else, bad flags
    let r = run("a", "4", &["--resume"]);
    assert!(
        !good(&r) && r.stderr.contains("not an unfinished distill-prompts run"),
        "{}",
        r.stderr
    );
    std::fs::create_dir(p("d")).unwrap();
    std::fs::write(p("d/progress.json"), meta["settings"].to_string()).unwrap();
    let r = run("d", "4", &["--resume", "--temperature", "0.5"]);
    assert!(
        !good(&r) && r.stderr.contains("other settings"),
        "{}",
        r.stderr
    );
    std::fs::create_dir(p("e")).unwrap();
    std::fs::write(p("e/notes.txt"), "x").unwrap();
    let r = run("e", "4", &[]);
    assert!(!good(&r) && r.stderr.contains("--resume"), "{}", r.stderr);
    let r = run("f", "4", &["--temperature", "0"]);
    assert!(
        !good(&r) && r.stderr.contains("--temperature must be positive"),
        "{}",
        r.stderr
    );
    // --exclude takes several files: each is read (a missing second one is named) and recorded
    std::fs::write(p("x.jsonl"), "{\"id\": \"x\", \"prompt\": \"unrelated\"}\n").unwrap();
    std::fs::write(
        p("y.jsonl"),
        "{\"id\": \"y\", \"prompt\": \"also unrelated\"}\n",
    )
    .unwrap();
    let both = format!("{},{}", p("x.jsonl").display(), p("y.jsonl").display());
    let r = run("h", "4", &["--exclude", &both]);
    assert!(good(&r), "{}", r.stderr);
    let excluding: Value =
        serde_json::from_str(&std::fs::read_to_string(p("h/meta.json")).unwrap()).unwrap();
    assert_eq!(
        excluding["settings"]["exclude"].as_str(),
        Some(both.as_str())
    );
    let r = run(
        "i",
        "4",
        &[
            "--exclude",
            &format!("{},/nonexistent/second.jsonl", p("x.jsonl").display()),
        ],
    );
    assert!(
        !good(&r) && r.stderr.contains("/nonexistent/second.jsonl"),
        "{}",
        r.stderr
    );
    let r = run("g", "4", &["--exclude", "/nonexistent/dev.jsonl"]);
    assert!(
        !good(&r) && r.stderr.contains("/nonexistent/dev.jsonl"),
        "{}",
        r.stderr
    );
}
