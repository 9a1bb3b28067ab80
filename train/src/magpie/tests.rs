//! Magpie selection, sampling and the run folder, on the built-in tiny model.

use super::*;
use reference::base::generate::generate;
use reference::io::builtin::{random_model, tiny_config};
use std::io::Write;

fn settings() -> MagpieSettings {
    MagpieSettings {
        model: "tiny".into(),
        config_hash: None,
        count: 6,
        seed: 40,
        temperature: 1.0,
        top_p: None,
        max_prompt_tokens: 8,
        min_chars: 10,
        max_chars: 40,
        min_ascii_letters: 0.9,
        exclude: None,
        exclude_sha256: None,
    }
}

/// Each check by hand, and duplicates / exclusions after normalisation, first one kept.
#[test]
fn selection_by_hand() {
    let s = settings();
    let texts: Vec<(String, bool)> = [
        ("Write a poem about the sea.", true),
        ("write a poem   about the SEA", true),
        ("Write a poem about the sea.", false),
        ("Hi there", true),
        (
            "Tell me a story about dragons, knights and a very long road.",
            true,
        ),
        ("<|im_start|>assistant hello", true),
        ("Пожалуйста, напиши стихотворение", true),
        ("List three prime numbers!", true),
        ("1234567890 !!", true),
    ]
    .iter()
    .map(|(t, e)| (t.to_string(), *e))
    .collect();
    let exclude: HashSet<String> = [normalise("  List three PRIME numbers ")].into();
    let got = select(&texts, &s, &exclude);
    use Verdict::*;
    assert_eq!(
        got,
        [
            Kept, Duplicate, Unfinished, TooShort, TooLong, Template, NotEnglish, Excluded,
            NotEnglish
        ]
    );
    assert_eq!(tally(&got)[&NotEnglish], 2);
    assert_eq!(normalise(" Hello,\n  World! "), "hello, world");
}

/// Batched sampling gives each candidate what decoding it alone gives, with its own seed, and
/// skips the seeds already done.
#[test]
fn candidates_equal_decoding_alone() {
    let model = random_model(tiny_config(), 3).unwrap();
    let prefix = [5u32, 9, 2, 7];
    let stop = [11u32];
    let s = settings();
    let done: HashSet<u64> = [41, 44].into();
    let mut got = Vec::new();
    sample_candidates(&model, &prefix, &s, &stop, 3, &done, &mut |c| {
        got.push(c.clone())
    })
    .unwrap();
    got.sort_by_key(|c| c.seed);
    assert_eq!(
        got.iter().map(|c| c.seed).collect::<Vec<_>>(),
        [40, 42, 43, 45]
    );
    for c in &got {
        let options = GenerateOptions {
            max_new_tokens: s.max_prompt_tokens,
            stop_tokens: stop.to_vec(),
            sampling: Some(SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: None,
                seed: c.seed,
            }),
        };
        let alone = generate(&model, &prefix, &options, &mut |_, _| {}).unwrap();
        let mut want = c.tokens.clone();
        if c.ended {
            want.push(stop[0]);
        }
        assert_eq!(alone.tokens, want, "seed {}", c.seed);
    }
}

/// A log resumes with its candidates (a partial last line dropped), refuses other settings,
/// and a fresh run refuses a folder holding something else.
#[test]
fn log_resume_and_refusals() {
    let dir = std::env::temp_dir().join(format!("m2r2-magpie-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = settings();
    let c = Candidate {
        seed: 40,
        tokens: vec![1, 2],
        ended: true,
    };
    {
        let (mut log, earlier) = CandidateLog::open(&dir, &mut s, Start::Fresh).unwrap();
        assert!(earlier.is_empty());
        log.append(&c).unwrap();
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(CANDIDATES_FILE))
        .unwrap();
    write!(f, "{{\"seed\": 41, \"tok").unwrap();
    let (_, earlier) = CandidateLog::open(&dir, &mut s, Start::Resume).unwrap();
    assert_eq!(earlier, std::slice::from_ref(&c));
    let mut other = MagpieSettings {
        temperature: 0.7,
        top_p: Some(0.9),
        ..s.clone()
    };
    let e = CandidateLog::open(&dir, &mut other, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(
            "other settings: --temperature (1 there, 0.7 now), --top-p (none there, 0.9 now);"
        ),
        "{e}"
    );
    let e = CandidateLog::open(&dir, &mut s, Start::Fresh)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--resume"), "{e}");
    finish(
        &dir,
        &[],
        &MagpieMeta {
            settings: s.clone(),
            verdicts: BTreeMap::new(),
            prompts: 0,
        },
    )
    .unwrap();
    // a finished run is replaced only when forced, and is not resumed
    let e = CandidateLog::open(&dir, &mut s, Start::Fresh)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("finished") && e.contains("--force"), "{e}");
    let e = CandidateLog::open(&dir, &mut s, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not an unfinished distill-prompts run"), "{e}");
    let (_, earlier) = CandidateLog::open(&dir, &mut s, Start::Force).unwrap();
    assert!(earlier.is_empty());
    let e = CandidateLog::open(&dir.join("missing"), &mut s, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing does not exist"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--resume` refuses candidates the run would not sample (seed outside `seed..seed + count`,
/// a seed twice, more tokens than `max_prompt_tokens`), naming the line, and changes nothing.
#[test]
fn resume_refuses_candidates_of_another_run() {
    let s = settings(); // seeds 40..46, at most 8 tokens
    let ok = Candidate {
        seed: 45,
        tokens: vec![1; 8],
        ended: true,
    };
    let cases = [
        (
            46,
            2,
            "its seed is not one of the run's 6 seeds from --seed 40",
        ),
        (
            39,
            2,
            "its seed is not one of the run's 6 seeds from --seed 40",
        ),
        (45, 2, "the same seed is on an earlier line"),
        (41, 9, "it has 9 tokens, more than --max-prompt-tokens 8"),
    ];
    for (seed, len, why) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut s = s.clone();
        {
            let (mut log, _) = CandidateLog::open(dir.path(), &mut s, Start::Fresh).unwrap();
            log.append(&ok).unwrap();
            let bad = Candidate {
                seed,
                tokens: vec![1; len],
                ended: true,
            };
            log.append(&bad).unwrap();
        }
        let path = dir.path().join(CANDIDATES_FILE);
        let before = std::fs::read(&path).unwrap();
        let e = CandidateLog::open(dir.path(), &mut s, Start::Resume)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("line 2 (seed {seed}): --resume: {why};")),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}

/// `--resume` compares the model by config hash and `--exclude` by its prompts: other spellings
/// of the same are no difference, other contents are; a run from before the hash and digest were
/// recorded is compared by the names.
#[test]
fn resume_compares_model_and_exclude_by_content() {
    let excluded: std::collections::BTreeSet<String> = ["a prompt".to_string()].into();
    let of = |model: &str, hash: &str, exclude: &str, prompts| MagpieSettings {
        model: model.into(),
        config_hash: Some(hash.into()),
        exclude: Some(exclude.into()),
        exclude_sha256: exclude_digest(prompts),
        ..settings()
    };
    let was = of("smollm2", "abc", "ex.jsonl", &excluded);
    let same = of("/models/smollm2.gguf", "abc", "./ex.jsonl", &excluded);
    assert!(was.differing_settings(&same).is_empty());
    let d = was.differing_settings(&of("smollm2", "def", "ex.jsonl", &excluded));
    assert!(d.len() == 1 && d[0].contains("another model"), "{d:?}");
    let other: std::collections::BTreeSet<String> = ["another prompt".to_string()].into();
    let d = was.differing_settings(&of("smollm2", "abc", "ex.jsonl", &other));
    assert!(
        d.len() == 1 && d[0].contains("excluding other prompts"),
        "{d:?}"
    );
    assert_eq!(exclude_digest(&Default::default()), None);
    // a run without the record: the names
    let old = MagpieSettings {
        config_hash: None,
        exclude_sha256: None,
        ..was.clone()
    };
    let d = old.differing_settings(&same);
    assert_eq!(
        d,
        [
            "--model (smollm2 there, /models/smollm2.gguf now)",
            "--exclude (ex.jsonl there, ./ex.jsonl now)"
        ]
    );
    assert!(old.differing_settings(&was).is_empty());
}
