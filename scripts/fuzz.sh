#!/usr/bin/env bash
# Fuzz one loader with cargo-fuzz / libFuzzer (docs/TESTING.md "Hostile inputs and fuzzing"):
#
#   scripts/fuzz.sh TARGET SECONDS [RUNS]   fuzz TARGET for SECONDS (or RUNS executions, if given
#                                           and reached first) under a 2 GB RSS / 1 GB single-
#                                           allocation limit; corpus in fuzz/work/TARGET, crashes in
#                                           fuzz/artifacts/TARGET
#   scripts/fuzz.sh --seeds                 rewrite fuzz/seeds/ from the project's fixtures
#   scripts/fuzz.sh --list                  the targets
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on the stable toolchain without a sanitizer
# (`-s none`: libFuzzer's coverage only, no ASan, which would need nightly). CI never fuzzes: it
# replays fuzz/seeds, fuzz/corpus and fuzz/regressions (tests/tests/fuzz_replay.rs). A crash found
# here: copy it into fuzz/regressions/TARGET/, fix it, add a test naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

targets() { sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^m2r2-fuzz$'; }

case "${1:-}" in
    --seeds)
        exec cargo run --quiet -p m2r2-tests --bin fuzz-seeds -- fuzz/seeds ;;
    --list)
        targets; exit 0 ;;
    ""|-h|--help)
        sed -n '2,15p' "$0"; exit 2 ;;
esac
target=$1
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS [RUNS]}
runs=${3:--1}
if ! targets | grep -qx "$target"; then
    echo "scripts/fuzz.sh: unknown target '$target'; targets: $(targets | tr '\n' ' ')" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh: cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 1
fi
mkdir -p "fuzz/work/$target" "fuzz/artifacts/$target"
corpora=("fuzz/work/$target" "fuzz/seeds/$target")
for extra in corpus regressions; do
    [ -d "fuzz/$extra/$target" ] && corpora+=("fuzz/$extra/$target")
done
cd fuzz
exec cargo +stable fuzz run -s none "$target" "${corpora[@]/#fuzz\//}" -- \
    -max_total_time="$seconds" -runs="$runs" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -timeout=10 -max_len=1048576 -print_final_stats=1 \
    -artifact_prefix="artifacts/$target/"
