//! `distill-data` and `train` end to end on the built-in `tiny` model: data is written and read
//! back, training lowers the held-out KL, the checkpoint is an M2R2 weights folder that `generate`
//! uses (speculative output equal to greedy), `--resume` continues, `train-arla` writes a calibrated
//! ARLA the decoding modes use, bad input is refused clearly.

use super::{fails, generate_json, ok};
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// `n` prompts with ids `{prefix}{i}`; the prefix is in the text too, so that two sets share no
/// prompt (held-out data sharing one with the training data is refused).
fn write_prompts(path: &Path, prefix: &str, n: usize) {
    let lines: Vec<String> = (0..n)
        .map(|i| format!("{{\"id\": \"{prefix}{i}\", \"prompt\": \"{prefix}: count to {i}.\"}}"))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// For each `(prompts file, prompt id prefix, prompt count, data folder)`: write the prompts into
/// `dir` and `distill-data` them on `tiny` (12 new tokens) into the data folder.
pub(super) fn distill_tiny(dir: &Path, sets: &[(&str, &str, usize, &str)]) {
    for &(prompts, prefix, n, out) in sets {
        write_prompts(&dir.join(prompts), prefix, n);
        ok(&[
            "distill-data",
            "--prompts",
            &dir.join(prompts).display().to_string(),
            "--out",
            &dir.join(out).display().to_string(),
            "--max-new-tokens",
            "12",
        ]);
    }
}

#[test]
fn distill_train_resume_generate() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("train.jsonl"), "t", 8);
    write_prompts(&dir.path().join("dev.jsonl"), "d", 3);
    let out = ok(&[
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        &p("train.jsonl"),
        "--out",
        &p("data"),
        "--max-new-tokens",
        "24",
        "--temperature",
        "0.8",
        "--samples-per-prompt",
        "2",
        "--seed",
        "3",
    ]);
    assert!(out.stdout.contains("wrote 16 samples"), "{}", out.stdout);
    ok(&[
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        &p("dev.jsonl"),
        "--out",
        &p("dev"),
        "--max-new-tokens",
        "24",
    ]);
    let trained = ok(&[
        "train",
        "--model",
        "tiny",
        "--data",
        &p("data"),
        "--eval-data",
        &p("dev"),
        "--train-gates",
        "1",
        "--rank",
        "4",
        "--align",
        "cosine",
        "--steps",
        "40",
        "--batch-rows",
        "16",
        "--lr",
        "3e-3",
        "--seed",
        "1",
        "--out",
        &p("ck"),
    ]);
    // The held-out table: | gate | rows | KL before | KL after | ...
    let row = trained
        .stdout
        .lines()
        .find(|l| l.starts_with("| 1 |"))
        .expect("gate 1 row");
    let cells: Vec<f64> = row
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert!(cells[3] < cells[2], "held-out KL did not fall: {row}");
    // The checkpoint drives speculative decoding, which stays equal to greedy.
    let prompt = [
        "--tokens",
        "84,104,101",
        "--max-new-tokens",
        "16",
        "--model",
        "tiny",
    ];
    let greedy = generate_json(&prompt);
    let mut spec_args = prompt.to_vec();
    let ck = p("ck");
    spec_args.extend(["--mode", "speculative", "--m2r2", &ck]);
    let spec = generate_json(&spec_args);
    assert_eq!(spec["tokens"], greedy["tokens"]);
    // ARLA on top of the trained adapters, calibrated on the dev data; the folder drives
    // early exit and keeps speculative decoding equal to greedy.
    let arla = ok(&[
        "train-arla",
        "--model",
        "tiny",
        "--m2r2",
        &ck,
        "--data",
        &p("data"),
        "--dev-data",
        &p("dev"),
        "--limit",
        "12",
        "--dev-limit",
        "2",
        "--steps",
        "30",
        "--batch",
        "32",
        "--target-agreement",
        "0.9",
        "--f16",
        "--out",
        &p("arla"),
    ]);
    assert!(
        arla.stdout
            .contains("| threshold | agreement | layers/token"),
        "{}",
        arla.stdout
    );
    assert!(arla.stdout.contains("f16)"), "{}", arla.stdout);
    // --dev-limit 2: two samples of 24 response tokens, 25 rows each (the prompt's last row too)
    let dev_tokens: usize = format!("{}{}", arla.stdout, arla.stderr)
        .split(" training and ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the exit-state line");
    assert_eq!(dev_tokens, 50);
    fails(
        &[
            "train-arla",
            "--model",
            "tiny",
            "--m2r2",
            &ck,
            "--data",
            &p("data"),
            "--dev-data",
            &p("dev"),
            "--limit",
            "0",
            "--out",
            &p("arla0"),
        ],
        &["at least one sample"],
    );
    // flags out of range, and an --out that cannot be written, are refused before any work;
    // a diverging run writes nothing
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    let arla_args = |extra: &[&str]| {
        let base = [
            "train-arla",
            "--model",
            "tiny",
            "--m2r2",
            &ck,
            "--data",
            &p("data"),
            "--dev-data",
            &p("dev"),
            "--limit",
            "2",
            "--dev-limit",
            "1",
            "--steps",
            "3",
            "--batch",
            "8",
        ];
        [&base[..], extra]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    for (extra, needle) in [
        (
            &["--target-agreement", "2"][..],
            "--target-agreement must be in (0, 1], got 2",
        ),
        (
            &["--target-agreement", "NaN"],
            "--target-agreement must be in (0, 1]",
        ),
        (&["--lr", "0"], "--lr must be a finite number > 0"),
        (
            &["--weight-decay=-1"],
            "--weight-decay must be a finite number >= 0",
        ),
    ] {
        let args = arla_args(&[extra, &["--out", &p("arla-bad")]].concat());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = fails(&args, &[needle]);
        assert!(!run.stderr.contains("exit states"), "{}", run.stderr);
    }
    let below_a_file = p("a-file/arla");
    let args = arla_args(&["--out", &below_a_file]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = fails(&args, &["--out", "a-file` exists and is not a folder"]);
    assert!(!run.stderr.contains("exit states"), "{}", run.stderr);
    let args = arla_args(&["--lr", "1e30", "--out", &p("arla-nan")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails(&args, &["ARLA training diverged", "lower --lr"]);
    assert!(!dir.path().join("arla-nan").exists());
    let arla_dir = p("arla");
    let mut spec_args = prompt.to_vec();
    spec_args.extend([
        "--mode",
        "speculative",
        "--m2r2",
        &arla_dir,
        "--dynamic-draft",
    ]);
    assert_eq!(generate_json(&spec_args)["tokens"], greedy["tokens"]);
    let mut exit_args = prompt.to_vec();
    exit_args.extend([
        "--mode",
        "early-exit",
        "--m2r2",
        &arla_dir,
        "--gate",
        "arla",
    ]);
    generate_json(&exit_args);
    // The pruned draft head: measured, written, and the folder still loads.
    let head = ok(&[
        "draft-head",
        "--model",
        "tiny",
        "--m2r2",
        &arla_dir,
        "--data",
        &p("data"),
        "--dev-data",
        &p("dev"),
        "--sizes",
        "8,64",
        "--write",
        "64",
    ]);
    assert!(head.stdout.contains("| pruned | 64 |"), "{}", head.stdout);
    // the default sizes are those below the vocabulary (tiny's 320: 256)
    let defaults = ok(&[
        "draft-head",
        "--model",
        "tiny",
        "--m2r2",
        &arla_dir,
        "--data",
        &p("data"),
        "--dev-data",
        &p("dev"),
    ]);
    assert!(
        defaults.stdout.contains("| pruned | 256 |"),
        "{}",
        defaults.stdout
    );
    assert!(
        !defaults.stdout.contains("| pruned | 1024 |"),
        "{}",
        defaults.stdout
    );
    assert!(dir.path().join("arla/draft_head.json").is_file());
    let mut spec_args = prompt.to_vec();
    spec_args.extend(["--mode", "speculative", "--m2r2", &arla_dir]);
    assert_eq!(generate_json(&spec_args)["tokens"], greedy["tokens"]);
    // --init: start from trained weights, train another gate, keep the first gate's adapters.
    ok(&[
        "train",
        "--model",
        "tiny",
        "--data",
        &p("data"),
        "--init",
        &ck,
        "--train-gates",
        "2",
        "--steps",
        "5",
        "--batch-rows",
        "8",
        "--out",
        &p("ck-init"),
    ]);
    let config = reference::io::builtin::tiny_config();
    let load = |dir: &str| M2r2Weights::load_dir(Path::new(dir), &config).unwrap();
    let (first, second) = (load(&ck), load(&p("ck-init")));
    let gate = |w: &M2r2Weights, j: usize| -> Vec<_> {
        w.config
            .interval_layers(j)
            .map(|l| w.accelerator.layers[l].clone())
            .collect()
    };
    assert_eq!(second.config, first.config);
    assert_eq!(gate(&second, 0), gate(&first, 0), "gate 1 was not kept");
    assert!(gate(&first, 1).iter().all(Option::is_none));
    let trained = gate(&second, 1);
    assert!(
        trained.iter().all(|l| l.as_ref().is_some_and(|l| l
            .loras
            .values()
            .any(|lora| lora.b().iter().any(|&b| b != 0.0)))),
        "gate 2 was not trained"
    );
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--init",
            &ck,
            "--rank",
            "2",
            "--out",
            &p("ck-bad"),
        ],
        &["--rank 2 for gate 1", "cannot lower the rank"],
    );
    // Resume to a larger total.
    let resumed = ok(&[
        "train",
        "--model",
        "tiny",
        "--data",
        &p("data"),
        "--resume",
        &ck,
        "--steps",
        "50",
        "--out",
        &p("ck2"),
    ]);
    assert!(
        resumed.stdout.contains("trained 10 steps"),
        "{}",
        resumed.stdout
    );
    // refused before the slow stream, the longest phase
    let done = fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--resume",
            &ck,
            "--steps",
            "40",
            "--out",
            &p("ck3"),
        ],
        &["already done 40 of 40 steps"],
    );
    assert!(!done.stderr.contains("slow stream"), "{}", done.stderr);
    // a resumed run keeps its checkpoint's settings: a flag that would set one is refused
    let (data, out) = (p("data"), p("ck4"));
    for flag in [&["--lr", "0.01"][..], &["--rank", "4"], &["--seed", "3"]] {
        let args = [
            &["train", "--model", "tiny", "--data", &data][..],
            &["--resume", &ck, "--out", &out],
            flag,
        ];
        fails(
            &args.concat(),
            &["'--resume <DIR>' cannot be used with", flag[0]],
        );
    }
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--hard-label-weight",
            "-1",
            "--out",
            &p("ck-hard"),
        ],
        &["--hard-label-weight must be a finite number >= 0, got -1"],
    );
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("dev"),
            "--resume",
            &ck,
            "--steps",
            "60",
            "--out",
            &p("ck3"),
        ],
        &["trained on other data", "same --data"],
    );
}

#[test]
fn bad_training_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("nothing"),
            "--out",
            &p("o"),
        ],
        &["nothing: no such data folder"],
    );
    std::fs::write(dir.path().join("bad.jsonl"), "{\"prompt\": \"x\"}\n").unwrap();
    fails(
        &[
            "distill-data",
            "--model",
            "tiny",
            "--prompts",
            &p("bad.jsonl"),
            "--out",
            &p("d"),
        ],
        &["line 1", "`id`"],
    );
    write_prompts(&dir.path().join("ok.jsonl"), "t", 2);
    ok(&[
        "distill-data",
        "--model",
        "tiny",
        "--prompts",
        &p("ok.jsonl"),
        "--out",
        &p("data"),
        "--max-new-tokens",
        "4",
    ]);
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--train-gates",
            "7",
            "--out",
            &p("o"),
        ],
        &["gate 7 does not exist"],
    );
    fails(
        &[
            "train",
            "--model",
            "tiny-moe",
            "--data",
            &p("data"),
            "--out",
            &p("o"),
        ],
        &["sparse MoE", "dense"],
    );
    fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--align-intermediate",
            "--out",
            &p("o"),
        ],
        &["--align-intermediate", "--align <KIND>"],
    );
    // an --out that cannot be written, zero intervals and ranks wider than the model are refused
    // before the slow stream; a diverging run stops, naming the step
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    let train = |extra: &[&str]| {
        let base = [
            "train",
            "--model",
            "tiny",
            "--data",
            &p("data"),
            "--steps",
            "3",
        ];
        [&base[..], extra]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let (below_a_file, data_out, out) = (p("a-file/o"), p("data"), p("o"));
    for (extra, needle) in [
        (
            &["--out", &below_a_file][..],
            "a-file` exists and is not a folder",
        ),
        (&["--out", &data_out], "holds distillation data"),
        (
            &["--out", &out, "--log-every", "0"],
            "--log-every must be at least 1",
        ),
        (
            &["--out", &out, "--save-every", "0"],
            "--save-every must be at least 1",
        ),
        (
            &["--out", &out, "--rank", "65"],
            "--rank 65 is wider than the model's hidden size 64",
        ),
        (
            &["--out", &out, "--alpha", "0"],
            "--alpha must be a finite number > 0",
        ),
        (
            &["--out", &out, "--weight-decay=-1"],
            "--weight-decay must be a finite number >= 0, got -1",
        ),
        (
            &["--out", &out, "--warmup", "4"],
            "--warmup 4 is longer than the run (--steps 3)",
        ),
    ] {
        let args = train(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = fails(&args, &[needle]);
        assert!(!run.stderr.contains("slow stream of"), "{}", run.stderr);
    }
    let args = train(&["--out", &out, "--lr", "1e30"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    fails(&args, &["training diverged at step", "lower --lr"]);
    assert!(!dir.path().join("o").exists());
    // init-m2r2 likewise bounds the low-rank widths
    for (flag, needle) in [
        ("--rank", "--rank 65 is wider"),
        ("--arla-latent", "--arla-latent 65 is wider"),
    ] {
        let args = ["init-m2r2", "--model", "tiny", flag, "65", "--out", &out];
        fails(&args, &[needle]);
    }
    // with a kind it trains (the term is in the log's align column)
    let run = ok(&[
        "train",
        "--model",
        "tiny",
        "--data",
        &p("data"),
        "--align",
        "mse",
        "--align-intermediate",
        "--steps",
        "2",
        "--out",
        &p("aligned"),
    ]);
    assert!(
        run.stderr.contains("g1 kl") && run.stderr.contains(" align "),
        "{}",
        run.stderr
    );
}

/// `distill-data --batch` writes the same bytes at any batch size; `--resume` of a finished folder
/// keeps it as it is; `--resume` with other settings is refused naming the setting.
#[test]
fn distill_batch_sizes_agree_and_resume_checks_settings() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    write_prompts(&dir.path().join("train.jsonl"), "t", 5);
    let run = |out: &str, batch: &str, extra: &[&str]| {
        let mut args = vec!["distill-data", "--model", "tiny", "--prompts"];
        let prompts = p("train.jsonl");
        let out = p(out);
        args.extend([
            prompts.as_str(),
            "--out",
            out.as_str(),
            "--max-new-tokens",
            "12",
        ]);
        args.extend([
            "--temperature",
            "0.9",
            "--samples-per-prompt",
            "2",
            "--batch",
            batch,
        ]);
        args.extend(extra);
        ok(&args)
    };
    let one = run("one", "1", &[]);
    // stderr is a pipe here: no bar, but plain progress lines (at least the final one)
    assert!(
        one.stderr.contains("samples: 10/10 after"),
        "{}",
        one.stderr
    );
    run("many", "4", &[]);
    let samples = |d: &str| std::fs::read(dir.path().join(d).join("samples.jsonl")).unwrap();
    assert_eq!(samples("one"), samples("many"));
    let before = samples("many");
    let resumed = run("many", "3", &["--resume"]);
    assert!(
        resumed.stderr.contains("10 of 10 samples already written"),
        "{}",
        resumed.stderr
    );
    assert_eq!(samples("many"), before);
    assert!(!dir.path().join("many").join("progress.json").exists());
    fails(
        &[
            "distill-data",
            "--model",
            "tiny",
            "--prompts",
            &p("train.jsonl"),
            "--out",
            &p("many"),
            "--max-new-tokens",
            "12",
            "--resume",
        ],
        &["meta.json", "`samples_per_prompt`", "--resume"],
    );
    fails(
        &[
            "distill-data",
            "--model",
            "tiny",
            "--prompts",
            &p("train.jsonl"),
            "--out",
            &p("x"),
            "--batch",
            "0",
        ],
        &["--batch must be at least 1"],
    );
}

/// `train --val-data`: evaluations every --eval-every steps, the best weights in OUT/best, early
/// stop after --patience evaluations without improvement; data made from the development prompts
/// is refused as validation data.
#[test]
fn train_early_stopping_on_validation_data() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(
        dir.path(),
        &[
            ("train.jsonl", "t", 6, "data"),
            ("val.jsonl", "v", 2, "val"),
            ("dev_prompts.jsonl", "d", 2, "dev"),
        ],
    );
    let train = |val: &str, out: &str| {
        crate::m2r2(&[
            "train",
            "--data",
            &p("data"),
            "--val-data",
            &p(val),
            "--eval-every",
            "4",
            "--patience",
            "2",
            "--steps",
            "400",
            "--batch-rows",
            "8",
            "--lr",
            "0.05",
            "--out",
            &p(out),
        ])
    };
    let run = train("val", "out");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("validation at step 4: mean KL"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("best validation mean KL"),
        "{}",
        run.stdout
    );
    assert!(dir.path().join("out/best/adapter_config.json").exists());
    // a learning rate this high overshoots: the run stops long before its 400 steps
    assert!(run.stderr.contains("stopping early"), "{}", run.stderr);
    fails(
        &[
            "train",
            "--data",
            &p("data"),
            "--val-data",
            &p("dev"),
            "--steps",
            "4",
            "--out",
            &p("o2"),
        ],
        &["dev_prompts.jsonl", "evaluation only"],
    );
}

/// Data made from the development prompts is refused wherever a command trains or tunes on it
/// (train, train-arla, draft-head, tune-drafting), and held-out data sharing a prompt with the
/// training data is refused (train --eval-data / --val-data, --dev-data); each before any work.
#[test]
fn development_and_shared_prompts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(
        dir.path(),
        &[
            ("train.jsonl", "t", 3, "data"),
            ("dev_prompts.jsonl", "d", 2, "dev"),
        ],
    );
    ok(&["init-m2r2", "--model", "tiny", "--out", &p("m2r2")]);
    let (data, dev, m2r2, out) = (p("data"), p("dev"), p("m2r2"), p("out"));
    let own = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<String>>();
    let train = |more: &[&str]| {
        own(&[
            &["train", "--data", &data, "--steps", "1", "--out", &out],
            more,
        ]
        .concat())
    };
    let trained = |cmd: &str, data: &str, dev: &str| {
        own(&[cmd, "--m2r2", &m2r2, "--data", data, "--dev-data", dev])
    };
    let dev_meta = format!("{dev}/meta.json");
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            own(&["train", "--data", &dev, "--steps", "1", "--out", &out]),
            vec![
                &dev_meta,
                "--data",
                "dev_prompts.jsonl",
                "fits the adapters",
            ],
        ),
        (
            train(&["--val-data", &dev]),
            vec!["--val-data", "dev_prompts.jsonl", "evaluation only"],
        ),
        (
            train(&["--eval-data", &data]),
            vec!["--eval-data: 3 of its 3 prompts are also prompts of the training data"],
        ),
        (
            train(&["--val-data", &data]),
            vec!["--val-data: 3 of its 3 prompts", "held-out prompts"],
        ),
        (
            [trained("train-arla", &data, &dev), own(&["--out", &out])].concat(),
            vec![
                "--dev-data",
                "dev_prompts.jsonl",
                "calibrates its thresholds",
            ],
        ),
        (
            trained("draft-head", &dev, &data),
            vec!["--data", "dev_prompts.jsonl"],
        ),
        (
            [trained("train-arla", &data, &data), own(&["--out", &out])].concat(),
            vec!["--dev-data: 3 of its 3 prompts"],
        ),
        (
            own(&["tune-drafting", "--m2r2", &m2r2, "--data", &dev]),
            vec!["--data", "dev_prompts.jsonl", "chooses the drafting policy"],
        ),
    ];
    for (args, needles) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needles);
    }
    assert!(!dir.path().join("out").exists(), "a refused run wrote out/");
    // the development data stays usable where it is only measured on
    let args = train(&["--eval-data", &dev]);
    let run = ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run.stdout.contains("held-out"), "{}", run.stdout);
}

#[test]
fn train_slow_cache_is_written_then_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(
        dir.path(),
        &[
            ("train.jsonl", "t", 4, "data"),
            ("val.jsonl", "v", 2, "val"),
        ],
    );
    let train = |out: &str, rank: &str| {
        ok(&[
            "train",
            "--data",
            &p("data"),
            "--val-data",
            &p("val"),
            "--eval-every",
            "3",
            "--steps",
            "6",
            "--batch-rows",
            "8",
            "--rank",
            rank,
            "--slow-cache",
            &p("cache"),
            "--out",
            &p(out),
        ])
    };
    let first = train("a", "4");
    for what in ["the training data", "--val-data"] {
        assert!(
            first
                .stderr
                .contains(&format!("slow stream of {what} written to")),
            "{}",
            first.stderr
        );
    }
    let cached: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(cached.len(), 2, "{cached:?}");
    assert!(
        cached
            .iter()
            .all(|f| f.starts_with("slow-") && f.ends_with(".safetensors"))
    );
    // the same run again reads both files and trains the same adapters; another rank reads them too
    let second = train("b", "4");
    for what in ["the training data", "--val-data"] {
        assert!(
            second
                .stderr
                .contains(&format!("slow stream of {what} read from")),
            "{}",
            second.stderr
        );
    }
    let adapters =
        |out: &str| std::fs::read(dir.path().join(out).join("adapter_model.safetensors")).unwrap();
    assert_eq!(adapters("a"), adapters("b"));
    let other_rank = train("c", "2");
    assert!(
        other_rank
            .stderr
            .contains("slow stream of the training data read from"),
        "{}",
        other_rank.stderr
    );
    // Two folders as one training set: each folder's file is read (the validation folder's is
    // the one --val-data wrote: same model, gates and samples), nothing is computed.
    let both = ok(&[
        "train",
        "--data",
        &format!("{},{}", p("data"), p("val")),
        "--steps",
        "2",
        "--batch-rows",
        "8",
        "--slow-cache",
        &p("cache"),
        "--out",
        &p("d"),
    ]);
    let reads = both
        .stderr
        .matches("slow stream of the training data read from")
        .count();
    assert_eq!(reads, 2, "{}", both.stderr);
    assert!(!both.stderr.contains("written to"), "{}", both.stderr);
}

/// Rewrite `m2r2_config.json` in `dir` with `edit` applied.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("m2r2_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

/// `train --init` of a folder with ARLA drops it and resets every setting that reads its score
/// (early exit and dynamic drafting with the arla gate, its calibrated threshold), saying so, so
/// the written folder runs early exit and speculative decoding with its own defaults; confidence
/// thresholds are kept, with a note that they were chosen for the old adapters.
#[test]
fn init_resets_the_settings_that_read_arla() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(
        dir.path(),
        &[("t.jsonl", "t", 4, "data"), ("d.jsonl", "d", 2, "dev")],
    );
    let (data, dev) = (p("data"), p("dev"));
    let train = |init: &str, out: &str| {
        let mut args = vec!["train", "--model", "tiny", "--data", &data, "--steps", "3"];
        args.extend(["--batch-rows", "8", "--out", out]);
        if !init.is_empty() {
            args.extend(["--init", init]);
        }
        ok(&args)
    };
    let ck = p("ck");
    train("", &ck);
    let arla = p("arla");
    ok(&[
        "train-arla",
        "--model",
        "tiny",
        "--m2r2",
        &ck,
        "--data",
        &data,
        "--dev-data",
        &dev,
        "--steps",
        "3",
        "--batch",
        "8",
        "--out",
        &arla,
    ]);
    let arla_gate = serde_json::json!({"gate": "arla", "threshold": 0.6});
    edit_config(Path::new(&arla), |c| {
        c["arla"]["threshold"] = serde_json::json!(0.98);
        c["early_exit"] = serde_json::json!({"gate": "arla", "thresholds": [0.9, 0.9, 0.9]});
        c["dynamic_draft"] = arla_gate.clone();
        c["draft_tree"] =
            serde_json::json!({"draft_gate": 1, "widths": [2, 1], "dynamic": arla_gate});
    });
    let run = train(&arla, &p("again"));
    for needle in [
        "ARLA is dropped",
        "`early_exit` (arla gate",
        "`arla.threshold` 0.98 (now the default 0.5)",
        "`dynamic_draft` (arla gate",
        "`draft_tree.dynamic` (arla gate",
        "run `m2r2 train-arla` and `m2r2 tune-drafting` on the new weights",
    ] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
    let config = reference::io::builtin::tiny_config();
    let again = M2r2Weights::load_dir(&dir.path().join("again"), &config).unwrap();
    assert!(again.arla.is_none());
    let c = &again.config;
    assert_eq!(c.arla.threshold, 0.5);
    assert!(c.early_exit.is_none() && c.dynamic_draft.is_none());
    assert!(c.draft_tree.as_ref().is_some_and(|t| t.dynamic.is_none()));
    let again = p("again");
    for mode in ["early-exit", "speculative"] {
        generate_json(&[
            "--model",
            "tiny",
            "--m2r2",
            &again,
            "--mode",
            mode,
            "--tokens",
            "84,104,101",
            "--max-new-tokens",
            "8",
        ]);
    }
    // kept confidence thresholds are noted, nothing is reset
    edit_config(Path::new(&arla), |c| {
        c["early_exit"] = serde_json::json!({"gate": "confidence", "thresholds": [0.9, 0.8, 0.7]});
        c["arla"]["threshold"] = serde_json::json!(0.5);
        c.as_object_mut().unwrap().remove("dynamic_draft");
        c.as_object_mut().unwrap().remove("draft_tree");
    });
    let run = train(&arla, &p("kept"));
    assert!(!run.stderr.contains("ARLA is dropped"), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "these thresholds are kept, but were chosen for its adapters, not the ones trained \
             now: `early_exit` (confidence >= 0.9,0.8,0.7); run `m2r2 train-arla`"
        ),
        "{}",
        run.stderr
    );
}

/// A sample longer than the model's context is refused by `train`, `train-arla` and
/// `tune-drafting` naming its file and line, before any pass; tune-drafting says it traces one
/// position more.
#[test]
fn samples_beyond_the_context_are_refused_by_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    distill_tiny(
        dir.path(),
        &[("t.jsonl", "t", 3, "data"), ("d.jsonl", "d", 2, "dev")],
    );
    // line 2 of a copy of the data: 600 tokens (tiny's context is 512), meta.json's count kept
    std::fs::create_dir(dir.path().join("long")).unwrap();
    let text = std::fs::read_to_string(dir.path().join("data/samples.jsonl")).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let old = lines[1]["tokens"].as_array().unwrap().len();
    lines[1]["tokens"] = serde_json::json!((0..600).map(|t| t % 300).collect::<Vec<u32>>());
    let lines: Vec<String> = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(dir.path().join("long/samples.jsonl"), lines.concat()).unwrap();
    let meta = std::fs::read_to_string(dir.path().join("data/meta.json")).unwrap();
    let mut meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    meta["tokens"] = serde_json::json!(meta["tokens"].as_u64().unwrap() + 600 - old as u64);
    std::fs::write(dir.path().join("long/meta.json"), meta.to_string()).unwrap();
    let line = format!(
        "{}: line 2: the sample has 600 tokens",
        p("long/samples.jsonl")
    );
    let context = "more than the model's context of 512 positions";
    let (long, weights) = (p("long"), p("w"));
    let run = fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &long,
            "--steps",
            "2",
            "--out",
            &p("o"),
        ],
        &[&line, context, "remove the line"],
    );
    assert!(!run.stderr.contains("slow stream of"), "{}", run.stderr);
    ok(&["init-m2r2", "--model", "tiny", "--out", &weights]);
    let out = p("a");
    let arla_fails = |data: &str, dev: &str| {
        let args = ["train-arla", "--model", "tiny", "--m2r2", &weights];
        let more = [
            "--data",
            data,
            "--dev-data",
            dev,
            "--steps",
            "2",
            "--out",
            &out,
        ];
        fails(&[&args[..], &more].concat(), &[&line, context])
    };
    let dev = p("dev");
    let run = arla_fails(&long, &dev);
    assert!(!run.stderr.contains("exit states of"), "{}", run.stderr);
    // --dev-data shares no prompt with the copy: its long line is named as --dev-data's
    arla_fails(&dev, &long);
    fails(
        &[
            "tune-drafting",
            "--model",
            "tiny",
            "--m2r2",
            &weights,
            "--data",
            &long,
        ],
        &[
            &line,
            "tune-drafting traces it in one position more: 601 positions",
            context,
            "--max-new-tokens N",
        ],
    );
    // a held-out sample too long is refused by file and line too, before any work
    let run = fails(
        &[
            "train",
            "--model",
            "tiny",
            "--data",
            &dev,
            "--eval-data",
            &long,
            "--steps",
            "2",
            "--out",
            &p("o"),
        ],
        &[&line, context],
    );
    assert!(!run.stderr.contains("new tokens"), "{}", run.stderr);
    assert!(!run.stderr.contains("slow stream of"), "{}", run.stderr);
}
