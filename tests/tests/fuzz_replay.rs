//! The fuzz corpora, replayed (docs/TESTING.md "Hostile inputs and fuzzing"): every target's seeds
//! must load (a fuzzer mutating an input that never loads explores nothing), and every committed
//! corpus and crash file under `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/` must give an
//! `Ok` or an `Err`, never a panic, so a fixed crash stays fixed. Fast and deterministic: no
//! fuzzing here (`scripts/fuzz.sh TARGET SECONDS` runs the fuzzer).

use m2r2_tests::hostile::{Target, run, seeds};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

#[test]
fn every_seed_loads() {
    for target in Target::ALL {
        let seeds = seeds(target);
        assert!(!seeds.is_empty(), "{}: no seeds", target.name());
        for (name, bytes) in seeds {
            assert!(
                run(target, &bytes),
                "{}: the seed {name} does not load",
                target.name()
            );
        }
    }
}

/// The committed seed files still load (they are what `seeds` made when they were written;
/// `scripts/fuzz.sh --seeds` rewrites them, e.g. after a format change).
#[test]
fn committed_seeds_load() {
    for target in Target::ALL {
        let dir = fuzz_dir().join("seeds").join(target.name());
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fuzz.sh --seeds", dir.display()));
        let mut n = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            assert!(
                run(target, &std::fs::read(&path).unwrap()),
                "{} does not load: run scripts/fuzz.sh --seeds",
                path.display()
            );
            n += 1;
        }
        assert!(n > 0, "{}: no seeds", dir.display());
    }
}

#[test]
fn corpora_and_crashes_replay_without_panics() {
    let mut replayed = 0;
    for target in Target::ALL {
        for kind in ["seeds", "corpus", "regressions"] {
            let dir = fuzz_dir().join(kind).join(target.name());
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| run(target, &bytes));
                assert!(
                    outcome.is_ok(),
                    "{} panicked on {}",
                    target.name(),
                    path.display()
                );
                replayed += 1;
            }
        }
    }
    assert!(
        replayed > 0,
        "no corpus files under {}",
        fuzz_dir().display()
    );
    eprintln!("replayed {replayed} files");
}
