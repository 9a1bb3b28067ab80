//! Hostile inputs in CI (docs/TESTING.md "Hostile inputs and fuzzing"): every fuzz target's seeds
//! (`m2r2_tests::hostile::seeds`), mutated at random (bytes overwritten, bytes set to boundary
//! values, truncated, JSON punctuation injected) and fed to the same entry points as the libFuzzer
//! targets (`hostile::run`). Every outcome must be `Ok` or `Err`: a panic fails the case (proptest
//! shrinks it to a small mutation list and saves it in `proptest-regressions/`).
//!
//! A coverage-free smoke test: 704 cases, about 64 per target; the coverage-guided runs are
//! `scripts/fuzz.sh TARGET SECONDS` (docs/TESTING.md "Hostile inputs and fuzzing").

use m2r2_tests::hostile::{Target, run, seeds};
use proptest::prelude::*;

/// One edit of a file's bytes.
#[derive(Clone, Debug)]
enum Mutation {
    /// Overwrite the byte at `at` (modulo the length) with `value`.
    Set { at: usize, value: u8 },
    /// The same within the first 512 bytes, where headers and counts live.
    SetHead { at: usize, value: u8 },
    /// Cut the file at `at` (modulo the length, at least one byte kept).
    Truncate { at: usize },
    /// Put a JSON punctuation or digit character at `at` (modulo the first 1024 bytes).
    Json { at: usize, which: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        (
            any::<usize>(),
            prop_oneof![Just(0u8), Just(1), Just(0x7f), Just(0x80), Just(0xff)]
        )
            .prop_map(|(at, value)| Mutation::SetHead { at, value }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), any::<usize>()).prop_map(|(at, which)| Mutation::Json { at, which }),
    ]
}

fn mutate(bytes: &[u8], edits: &[Mutation]) -> Vec<u8> {
    const JSON: &[u8] = b"0123456789{}[],:\"-.e";
    let mut b = bytes.to_vec();
    for m in edits {
        let n = b.len();
        match *m {
            Mutation::Set { at, value } => b[at % n] = value,
            Mutation::SetHead { at, value } => b[at % n.min(512)] = value,
            Mutation::Truncate { at } => b.truncate((at % n).max(1)),
            Mutation::Json { at, which } => b[at % n.min(1024)] = JSON[which % JSON.len()],
        }
    }
    b
}

fn edits() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(704))]

    #[test]
    fn mutated_seeds_never_panic(target in 0..Target::ALL.len(), seed in any::<usize>(), edits in edits()) {
        let target = Target::ALL[target];
        let seeds = seeds(target);
        let (_, bytes) = &seeds[seed % seeds.len()];
        // A folder input keeps its first byte (the file it replaces).
        let (pick, file) = match target {
            Target::Gguf | Target::HfConfig | Target::ChatTemplate | Target::Golden => (vec![], &bytes[..]),
            _ => (bytes[..1].to_vec(), &bytes[1..]),
        };
        let mut input = pick;
        input.extend(mutate(file, &edits));
        run(target, &input);
    }
}
