//! Magpie selection, sampling and the run folder, on the built-in tiny model.

use super::*;
use reference::base::generate::generate;
use reference::io::builtin::{random_model, tiny_config};
use std::io::Write;

fn settings() -> MagpieSettings {
    MagpieSettings {
        model: "tiny".into(),
        count: 6,
        seed: 40,
        temperature: 1.0,
        top_p: None,
        max_prompt_tokens: 8,
        min_chars: 10,
        max_chars: 40,
        min_ascii_letters: 0.9,
        exclude: None,
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
    let s = settings();
    let c = Candidate {
        seed: 40,
        tokens: vec![1, 2],
        ended: true,
    };
    {
        let (mut log, earlier) = CandidateLog::open(&dir, &s, Start::Fresh).unwrap();
        assert!(earlier.is_empty());
        log.append(&c).unwrap();
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(CANDIDATES_FILE))
        .unwrap();
    write!(f, "{{\"seed\": 41, \"tok").unwrap();
    let (_, earlier) = CandidateLog::open(&dir, &s, Start::Resume).unwrap();
    assert_eq!(earlier, std::slice::from_ref(&c));
    let other = MagpieSettings {
        temperature: 0.7,
        top_p: Some(0.9),
        ..s.clone()
    };
    let e = CandidateLog::open(&dir, &other, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(
            "other settings: --temperature (1 there, 0.7 now), --top-p (none there, 0.9 now);"
        ),
        "{e}"
    );
    let e = CandidateLog::open(&dir, &s, Start::Fresh)
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
    let e = CandidateLog::open(&dir, &s, Start::Fresh)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("finished") && e.contains("--force"), "{e}");
    let e = CandidateLog::open(&dir, &s, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not an unfinished distill-prompts run"), "{e}");
    let (_, earlier) = CandidateLog::open(&dir, &s, Start::Force).unwrap();
    assert!(earlier.is_empty());
    let e = CandidateLog::open(&dir.join("missing"), &s, Start::Resume)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing does not exist"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
