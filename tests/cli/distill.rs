//! `distill-data` and `distill-prompts` refusals on the built-in `tiny` model: resumes identify
//! the prompts by content, duplicate ids and prompts too long for the context are refused before
//! any work, finished folders are not overwritten without `--force`, `--resume` needs a run,
//! every flag is checked before a file is written, and data folders whose meta disagrees with
//! their samples are refused.

use super::{Run, fails, m2r2, ok};
use serde_json::Value;
use std::path::Path;

/// `n` prompts with ids `{prefix}{i}`.
fn write_prompts(path: &Path, prefix: &str, n: usize) {
    let lines: Vec<String> = (0..n)
        .map(|i| format!("{{\"id\": \"{prefix}{i}\", \"prompt\": \"{prefix}: count to {i}.\"}}"))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// `distill-data` on `tiny` with 8 new tokens, `prompts` into `out`, and `extra` flags.
fn distill_args<'a>(prompts: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        prompts,
        "--out",
        out,
        "--max-new-tokens",
        "8",
    ];
    args.extend_from_slice(extra);
    args
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn sample_lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("samples.jsonl"))
        .unwrap()
        .lines()
        .count()
}

/// Turn a finished data folder into one stopped after its first `keep` samples.
fn stop_after(dir: &Path, keep: usize) {
    let text = std::fs::read_to_string(dir.join("samples.jsonl")).unwrap();
    let kept: String = text.lines().take(keep).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("samples.jsonl"), kept).unwrap();
    std::fs::rename(dir.join("meta.json"), dir.join("progress.json")).unwrap();
}

/// Finding 1: a resume compares the prompts' contents (a changed file is refused, naming
/// `prompts`; the same file under another spelling is accepted); a folder from before the digest
/// is matched by path.
#[test]
fn distill_resume_identifies_prompts_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p.jsonl"), "t", 6);
    let (prompts, out) = (p("p.jsonl"), p("d"));
    let first = ok(&distill_args(&prompts, &out, &[]));
    assert!(first.stdout.contains("wrote 6 samples"), "{}", first.stdout);
    let meta = json(&dir.path().join("d/meta.json"));
    assert_eq!(meta["prompts_sha256"].as_str().map(str::len), Some(64));
    let tiny = reference::io::builtin::tiny_config().hash();
    assert_eq!(meta["config_hash"].as_str(), Some(tiny.as_str()));
    let whole = std::fs::read(dir.path().join("d/samples.jsonl")).unwrap();

    // the same file as `DIR/./p.jsonl`: the same prompts
    let spelled = format!("{}/./p.jsonl", dir.path().display());
    stop_after(&dir.path().join("d"), 2);
    let resumed = ok(&distill_args(&spelled, &out, &["--resume"]));
    assert!(
        resumed.stderr.contains("2 of 6 samples already written")
            && resumed.stdout.contains("wrote 6 samples"),
        "{}{}",
        resumed.stderr,
        resumed.stdout
    );
    assert_eq!(
        std::fs::read(dir.path().join("d/samples.jsonl")).unwrap(),
        whole
    );

    // the file's contents changed: refused, nothing mixed in, the folder left as it was
    stop_after(&dir.path().join("d"), 3);
    write_prompts(&dir.path().join("p.jsonl"), "u", 5);
    fails(
        &distill_args(&prompts, &out, &["--resume"]),
        &[
            "progress.json",
            "--resume",
            "`prompts`",
            "its prompts differ",
            "the file changed since",
        ],
    );
    assert_eq!(sample_lines(&dir.path().join("d")), 3);
    assert!(dir.path().join("d/progress.json").exists());
    // the original contents again: it resumes
    write_prompts(&dir.path().join("p.jsonl"), "t", 6);
    ok(&distill_args(&prompts, &out, &["--resume"]));

    // a folder written before the digest: matched by the file's path, any spelling of it
    let mut legacy = json(&dir.path().join("d/meta.json"));
    legacy.as_object_mut().unwrap().remove("prompts_sha256");
    std::fs::write(dir.path().join("d/meta.json"), legacy.to_string()).unwrap();
    stop_after(&dir.path().join("d"), 4);
    ok(&distill_args(&spelled, &out, &["--resume"]));
    assert_eq!(
        std::fs::read(dir.path().join("d/samples.jsonl")).unwrap(),
        whole
    );
    let mut legacy = json(&dir.path().join("d/meta.json"));
    legacy.as_object_mut().unwrap().remove("prompts_sha256");
    std::fs::write(dir.path().join("d/meta.json"), legacy.to_string()).unwrap();
    stop_after(&dir.path().join("d"), 4);
    write_prompts(&dir.path().join("q.jsonl"), "t", 6);
    let other = p("q.jsonl");
    fails(
        &distill_args(&other, &out, &["--resume"]),
        &["`prompts`", "predates the prompts' digest", "q.jsonl now"],
    );
    // ... and a kept sample of another prompt is refused by its tokens, naming its line
    std::fs::write(
        dir.path().join("p.jsonl"),
        std::fs::read_to_string(dir.path().join("p.jsonl"))
            .unwrap()
            .replace("count to 0.", "count to zero."),
    )
    .unwrap();
    fails(
        &distill_args(&prompts, &out, &["--resume"]),
        &["line 1 (prompt `t0`, sample 0)", "prompt tokens"],
    );
    // other settings are named each
    write_prompts(&dir.path().join("p.jsonl"), "t", 6);
    fails(
        &distill_args(
            &prompts,
            &out,
            &["--resume", "--seed", "4", "--temperature", "0.5"],
        ),
        &[
            "`temperature` (--temperature: greedy there, 0.5 now)",
            "`seed` (--seed: 0 there, 4 now)",
        ],
    );
}

/// Finding 2: a prompt id given twice is refused, naming the id and both lines.
#[test]
fn distill_refuses_duplicate_prompt_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dup.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"prompt\": \"one\"}\n{\"id\": \"b\", \"prompt\": \"two\"}\n\n\
         {\"id\": \"a\", \"prompt\": \"three\"}\n",
    )
    .unwrap();
    let (prompts, out) = (
        path.display().to_string(),
        dir.path().join("d").display().to_string(),
    );
    fails(
        &distill_args(&prompts, &out, &[]),
        &["dup.jsonl", "line 4", "`a`", "line 1", "unique"],
    );
    assert!(!dir.path().join("d").exists());
}

/// Finding 3: prompts too long for the context with --max-new-tokens are refused before any
/// generation, by id and line, with the largest --max-new-tokens that fits; distill-prompts bounds
/// --max-prompt-tokens by the context.
#[test]
fn distill_refuses_prompts_too_long_for_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let mut text = String::new();
    for i in 0..3 {
        text += &format!("{{\"id\": \"short{i}\", \"prompt\": \"count to {i}\"}}\n");
    }
    text += &format!(
        "{{\"id\": \"long\", \"prompt\": \"{}\"}}\n",
        "x".repeat(300)
    );
    std::fs::write(dir.path().join("p.jsonl"), &text).unwrap();
    let (prompts, out) = (p("p.jsonl"), p("d"));
    let mut args = distill_args(&prompts, &out, &[]);
    args.retain(|a| *a != "--max-new-tokens" && *a != "8");
    args.extend(["--max-new-tokens", "256"]);
    fails(
        &args,
        &[
            "p.jsonl: prompt `long` (line 4, 316 tokens) does not fit tiny's context of 512",
            "--max-new-tokens 256",
            "lower --max-new-tokens to at most 196",
        ],
    );
    assert!(!dir.path().join("d").exists());
    // a prompt that fills the context alone must be left out
    text += &format!(
        "{{\"id\": \"huge\", \"prompt\": \"{}\"}}\n",
        "x".repeat(600)
    );
    std::fs::write(dir.path().join("p.jsonl"), &text).unwrap();
    fails(
        &args,
        &[
            "2 of the 5 prompts, `long` (line 4, 316 tokens), `huge` (line 5, 616 tokens)",
            "leave `huge` out",
            "at most 196",
        ],
    );
    assert!(!dir.path().join("d").exists());
    // fitting: it runs
    let fit = distill_args(&prompts, &out, &["--limit", "4", "--batch", "4"]);
    let run = ok(&fit);
    assert!(run.stdout.contains("wrote 4 samples"), "{}", run.stdout);

    let mp = p("mp");
    fails(
        &[
            "distill-prompts",
            "--out",
            &mp,
            "--count",
            "2",
            "--max-prompt-tokens",
            "100000",
        ],
        &[
            "--max-prompt-tokens 100000 does not fit tiny's context of 512",
            "give at most",
        ],
    );
    assert!(!dir.path().join("mp").exists());
}

/// Finding 4 (and 8): every distill-prompts and distill-data setting is checked before a file is
/// written; a resume with other settings names each differing flag.
#[test]
fn distill_checks_settings_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let mpx = p("mpx");
    let prompts_run = |extra: &[&str]| -> Run {
        let mut args = vec![
            "distill-prompts",
            "--out",
            mpx.as_str(),
            "--count",
            "3",
            "--max-prompt-tokens",
            "6",
        ];
        args.extend_from_slice(extra);
        m2r2(&args)
    };
    for (extra, needle) in [
        (&["--top-p", "0"][..], "--top-p must be in (0, 1], got 0"),
        (&["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (
            &["--min-chars", "100", "--max-chars", "10"],
            "--min-chars 100 is above --max-chars 10",
        ),
        (&["--temperature", "0"], "--temperature must be positive"),
        // seeds 2^64 - 2, 2^64 - 1 and then 0: another run's
        (
            &["--seed", "18446744073709551614"],
            "--seed 18446744073709551614: the 3 candidates of this run take seeds \
             18446744073709551614 + i, which pass 2^64 - 1",
        ),
        (
            &[
                "--model",
                concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/mixtral"),
            ],
            "distill-prompts samples user messages with the model's chat template: ",
        ),
        (
            &["--exclude", "/nonexistent/x.jsonl"],
            "/nonexistent/x.jsonl",
        ),
    ] {
        let run = prompts_run(extra);
        assert!(
            run.code == Some(1) && run.stderr.contains(needle),
            "{extra:?}: {}",
            run.stderr
        );
        assert!(!dir.path().join("mpx").exists(), "{extra:?} wrote mpx");
    }
    // an unfinished run with other settings: each differing flag named, not the settings' JSON
    let run = prompts_run(&[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr); // tiny keeps no prompt (finding 7)
    let meta = json(&dir.path().join("mpx/meta.json"));
    std::fs::write(
        dir.path().join("mpx/progress.json"),
        meta["settings"].to_string(),
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("mpx/meta.json")).unwrap();
    let run = prompts_run(&["--resume", "--temperature", "0.5", "--seed", "2"]);
    assert_eq!(run.code, Some(1));
    for needle in [
        "other settings: --seed (0 there, 2 now), --temperature (1 there, 0.5 now)",
        "give the same flags",
    ] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
    assert!(!run.stderr.contains("\"max_chars\""), "{}", run.stderr);

    write_prompts(&dir.path().join("p.jsonl"), "t", 2);
    let (prompts, out) = (p("p.jsonl"), p("d"));
    for (extra, needle) in [
        (
            &["--temperature", "0"][..],
            "--temperature must be a finite number > 0",
        ),
        (
            &["--temperature", "-1"],
            "--temperature must be a finite number > 0",
        ),
        (&["--batch", "0"], "--batch must be at least 1"),
        (&["--limit", "0"], "--limit must be at least 1"),
        (&["--samples-per-prompt", "0"], "--samples-per-prompt"),
        (
            &["--seed", "18446744073709551615", "--temperature", "1"],
            "give a --seed of at most 18446744073709551614",
        ),
    ] {
        fails(&distill_args(&prompts, &out, extra), &[needle]);
        assert!(!dir.path().join("d").exists(), "{extra:?} wrote d");
    }
}

/// Finding 5: a finished (or unfinished, or foreign) folder is not overwritten without --force.
#[test]
fn distill_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p6.jsonl"), "t", 6);
    write_prompts(&dir.path().join("p4.jsonl"), "t", 4);
    let (p6, p4, out) = (p("p6.jsonl"), p("p4.jsonl"), p("d1"));
    ok(&distill_args(&p6, &out, &[]));
    let before = std::fs::read(dir.path().join("d1/samples.jsonl")).unwrap();
    fails(
        &distill_args(&p4, &out, &[]),
        &[
            "--out",
            "d1 holds a finished distill-data run (6 samples)",
            "--force",
        ],
    );
    assert_eq!(
        std::fs::read(dir.path().join("d1/samples.jsonl")).unwrap(),
        before
    );
    let forced = ok(&distill_args(&p4, &out, &["--force"]));
    assert!(
        forced.stdout.contains("wrote 4 samples"),
        "{}",
        forced.stdout
    );
    assert_eq!(sample_lines(&dir.path().join("d1")), 4);
    fails(
        &distill_args(&p4, &out, &["--force", "--resume"]),
        &["--resume", "--force"],
    );
    // an unfinished run: --resume or --force
    stop_after(&dir.path().join("d1"), 2);
    fails(
        &distill_args(&p4, &out, &[]),
        &["unfinished distill-data run", "--resume", "--force"],
    );
    assert_eq!(sample_lines(&dir.path().join("d1")), 2);
    // a folder of something else
    std::fs::create_dir(dir.path().join("other")).unwrap();
    std::fs::write(dir.path().join("other/notes.txt"), "x").unwrap();
    let other = p("other");
    fails(
        &distill_args(&p4, &other, &[]),
        &["is not empty and holds no distill-data run", "--force"],
    );

    // distill-prompts: a finished run likewise
    let mp = p("mp");
    let prompts_run = |extra: &[&str]| -> Run {
        let mut args = vec![
            "distill-prompts",
            "--out",
            mp.as_str(),
            "--count",
            "2",
            "--max-prompt-tokens",
            "6",
        ];
        args.extend_from_slice(extra);
        m2r2(&args)
    };
    prompts_run(&[]);
    assert!(dir.path().join("mp/meta.json").exists());
    let again = prompts_run(&[]);
    assert!(
        again.code == Some(1)
            && again
                .stderr
                .contains("holds a finished distill-prompts run: pass --force"),
        "{}",
        again.stderr
    );
    let forced = prompts_run(&["--force"]);
    assert!(
        forced.stdout.contains("wrote 0 prompts of 2 candidates"),
        "{}",
        forced.stderr
    );
}

/// Finding 6: --resume of a missing folder, or of one that holds no run, is refused by name.
#[test]
fn distill_resume_needs_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p.jsonl"), "t", 2);
    let (prompts, missing) = (p("p.jsonl"), p("newdir"));
    fails(
        &distill_args(&prompts, &missing, &["--resume"]),
        &["--resume", "newdir does not exist", "no run to continue"],
    );
    assert!(!dir.path().join("newdir").exists());
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let empty = p("empty");
    fails(
        &distill_args(&prompts, &empty, &["--resume"]),
        &["--resume", "empty holds no distill-data run"],
    );
    let mp = p("mp");
    fails(
        &["distill-prompts", "--out", &mp, "--count", "2", "--resume"],
        &["--resume", "mp does not exist"],
    );
    assert!(!dir.path().join("mp").exists());
}

/// Finding 7: a run that keeps no prompt writes its folder, then fails, counting each filter.
#[test]
fn distill_prompts_keeping_nothing_fails() {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mp").display().to_string();
    let run = m2r2(&[
        "distill-prompts",
        "--out",
        &mp,
        "--count",
        "3",
        "--max-prompt-tokens",
        "6",
    ]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stdout.contains("wrote 0 prompts of 3 candidates"),
        "{}",
        run.stdout
    );
    for needle in [
        "no prompt passed the filters: of 3 candidates, 3 unfinished",
        "--max-prompt-tokens 6",
        "mp holds the candidates",
    ] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
    let meta = json(&dir.path().join("mp/meta.json"));
    assert_eq!(meta["prompts"], 0);
    assert!(!dir.path().join("mp/progress.json").exists());
}

/// Finding 9: a data folder's meta.json with an unknown field, counts that disagree with
/// samples.jsonl, or a progress.json beside it is refused where the data is read.
#[test]
fn distill_data_meta_is_checked_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p.jsonl"), "t", 4);
    let (prompts, data) = (p("p.jsonl"), p("d"));
    ok(&distill_args(&prompts, &data, &[]));
    let meta_path = dir.path().join("d/meta.json");
    let good = json(&meta_path);
    let (out, refused) = (p("o"), p("refused"));
    ok(&[
        "train", "--model", "tiny", "--data", &data, "--steps", "1", "--out", &out,
    ]);
    let train = [
        "train", "--model", "tiny", "--data", &data, "--steps", "1", "--out", &refused,
    ];
    let mut bad = good.clone();
    bad["comment"] = Value::from("x");
    std::fs::write(&meta_path, bad.to_string()).unwrap();
    fails(&train, &["meta.json", "unknown field `comment`"]);
    let mut bad = good.clone();
    bad["samples"] = Value::from(999);
    std::fs::write(&meta_path, bad.to_string()).unwrap();
    fails(
        &train,
        &[
            "meta.json counts 999 samples",
            "samples.jsonl holds 4",
            "--force",
        ],
    );
    std::fs::write(&meta_path, good.to_string()).unwrap();
    let text = std::fs::read_to_string(dir.path().join("d/samples.jsonl")).unwrap();
    let cut: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.path().join("d/samples.jsonl"), cut).unwrap();
    fails(&train, &["counts 4 samples", "holds 3"]);
    std::fs::write(dir.path().join("d/samples.jsonl"), text).unwrap();
    std::fs::write(dir.path().join("d/progress.json"), good.to_string()).unwrap();
    fails(&train, &["an unfinished distill-data run", "--resume"]);
}

/// Counts that overflow or cannot be planned are refused before anything is written (no
/// `progress.json` left behind), and so are several greedy samples per prompt (all the same) and
/// prompts with an empty id or prompt (naming the line); a `--batch` beyond the samples is capped
/// (responses do not depend on it), and a `--limit` beyond the prompts noted.
#[test]
fn distill_data_bounds_its_counts_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p.jsonl"), "t", 2);
    let (prompts, out) = (p("p.jsonl"), p("d"));
    for (extra, needles) in [
        (
            &[
                "--samples-per-prompt",
                "4000000000000000000",
                "--temperature",
                "1",
            ][..],
            &[
                "2 prompts x --samples-per-prompt 4000000000000000000",
                "samples one run makes",
            ][..],
        ),
        (
            &[
                "--samples-per-prompt",
                "18446744073709551615",
                "--temperature",
                "1",
            ],
            &["--samples-per-prompt 18446744073709551615"],
        ),
        (
            &["--samples-per-prompt", "3"],
            &[
                "--samples-per-prompt 3 without --temperature",
                "deterministic",
            ],
        ),
    ] {
        fails(&distill_args(&prompts, &out, extra), needles);
        assert!(!dir.path().join("d").exists(), "{extra:?} wrote d");
    }
    for (name, text, needles) in [
        (
            "empty-id.jsonl",
            "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"\", \"prompt\": \"y\"}\n",
            &["empty-id.jsonl line 2", "empty `id`"],
        ),
        (
            "empty-prompt.jsonl",
            "{\"id\": \"a\", \"prompt\": \" \"}\n",
            &["empty-prompt.jsonl line 1", "empty `prompt`"],
        ),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
        fails(&distill_args(&p(name), &out, &[]), needles);
        assert!(!dir.path().join("d").exists(), "{name} wrote d");
    }
    for batch in ["18446744073709551615", "100000000000"] {
        let run = ok(&distill_args(
            &prompts,
            &out,
            &["--batch", batch, "--force"],
        ));
        assert!(run.stdout.contains("wrote 2 samples"), "{}", run.stdout);
        assert!(
            run.stderr
                .contains(&format!("--batch {batch} is more than the 2 samples")),
            "{}",
            run.stderr
        );
    }
    let run = ok(&distill_args(&prompts, &out, &["--limit", "10", "--force"]));
    assert!(
        run.stderr
            .contains("--limit 10 is more than the 2 prompts of"),
        "{}",
        run.stderr
    );
}

/// After `--resume` the closing line counts the folder's samples and tokens as meta.json does,
/// and says apart what this run made.
#[test]
fn distill_data_summary_after_resume_counts_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("p.jsonl"), "t", 4);
    let (prompts, out) = (p("p.jsonl"), p("d"));
    ok(&distill_args(&prompts, &out, &[]));
    stop_after(&dir.path().join("d"), 1);
    let run = ok(&distill_args(&prompts, &out, &["--resume"]));
    let meta = json(&dir.path().join("d/meta.json"));
    let samples: Vec<Value> = std::fs::read_to_string(dir.path().join("d/samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let responses: u64 = samples
        .iter()
        .map(|s| s["tokens"].as_array().unwrap().len() as u64 - s["prompt_len"].as_u64().unwrap())
        .sum();
    let want = format!(
        "wrote 4 samples ({responses} response tokens, {} tokens in all)",
        meta["tokens"]
    );
    assert!(run.stdout.contains(&want), "{want}: {}", run.stdout);
    assert!(
        run.stdout
            .contains("(1 from the earlier run; this run made 3 of them"),
        "{}",
        run.stdout
    );
}

/// `distill-prompts --resume` compares `--exclude` by its prompts, not by the path's spelling
/// (another spelling of the same file resumes; other prompts are refused); a `--batch` beyond the
/// candidates is capped, a `--count` beyond what one run plans refused.
#[test]
fn distill_prompts_resume_compares_exclude_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        dir.path().join("ex.jsonl"),
        "{\"id\": \"x\", \"prompt\": \"Unrelated.\"}\n",
    )
    .unwrap();
    let mp = p("mp");
    let run = |exclude: &str, extra: &[&str]| -> Run {
        let mut args = vec![
            "distill-prompts",
            "--out",
            mp.as_str(),
            "--count",
            "3",
            "--max-prompt-tokens",
            "6",
            "--exclude",
            exclude,
        ];
        args.extend_from_slice(extra);
        m2r2(&args)
    };
    let first = run(&p("ex.jsonl"), &["--batch", "18446744073709551615"]);
    assert_eq!(first.code, Some(1), "{}", first.stderr); // tiny keeps no prompt
    assert!(first.stdout.contains("of 3 candidates"), "{}", first.stdout);
    // stopped after its first candidate
    let meta = json(&dir.path().join("mp/meta.json"));
    std::fs::write(
        dir.path().join("mp/progress.json"),
        meta["settings"].to_string(),
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("mp/meta.json")).unwrap();
    let candidates = std::fs::read_to_string(dir.path().join("mp/candidates.jsonl")).unwrap();
    let first_line = candidates.lines().next().unwrap().to_string() + "\n";
    std::fs::write(dir.path().join("mp/candidates.jsonl"), &first_line).unwrap();
    let spelled = format!("{}/./ex.jsonl", dir.path().display());
    let resumed = run(&spelled, &["--resume"]);
    assert_eq!(resumed.code, Some(1), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains("1 of 3 candidates already sampled"),
        "{}",
        resumed.stderr
    );
    // the run keeps its own record of the spelling
    let meta = json(&dir.path().join("mp/meta.json"));
    assert_eq!(
        meta["settings"]["exclude"].as_str(),
        Some(p("ex.jsonl").as_str())
    );

    std::fs::write(
        dir.path().join("mp/progress.json"),
        meta["settings"].to_string(),
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("mp/meta.json")).unwrap();
    std::fs::write(dir.path().join("mp/candidates.jsonl"), &first_line).unwrap();
    std::fs::write(
        dir.path().join("other.jsonl"),
        "{\"id\": \"x\", \"prompt\": \"Something else.\"}\n",
    )
    .unwrap();
    let refused = run(&p("other.jsonl"), &["--resume"]);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("excluding other prompts"),
        "{}",
        refused.stderr
    );

    let big = m2r2(&[
        "distill-prompts",
        "--out",
        &p("big"),
        "--count",
        "18446744073709551615",
    ]);
    assert_eq!(big.code, Some(1), "{}", big.stderr);
    assert!(
        big.stderr
            .contains("--count 18446744073709551615 is more than"),
        "{}",
        big.stderr
    );
    assert!(!dir.path().join("big").exists());
}
