# Early exit on SmolLM2 over development prompts: layers computed per token and how long the output
# stays equal to greedy, for the default early exit and named alternatives (docs/m2r2/early_exit.md,
# "Measured on SmolLM2"). Evaluation only: thresholds are calibrated on validation data by
# `m2r2 train-arla`, never here.
#
# Usage (release build):
#   python3 scripts/eval_early_exit.py [--prompts N] [--new-tokens N] [--bin PATH]
#     [--row 'NAME: FLAGS' ...]   (default rows: the shipped default and the shared thresholds)
#
# Prompts are the first N samples of data/distill/smollm2-dev (chat template applied, token ids).
import argparse, os, shlex, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_speculative as bs  # noqa: E402  (its prompt reader and `generate` runner)

ROWS = [
    "default (config early_exit):",
    "arla, one threshold (arla.threshold): --gate arla --threshold 1.01",
    "confidence, one threshold 0.94: --gate confidence --threshold 0.94",
    "arla, one per gate: --gate arla --threshold 0.7,1.01,0.98,0.98",
]

def same_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bin", default=bs.B)
    ap.add_argument("--row", action="append", help="'NAME: FLAGS' (replaces the default rows)")
    args = ap.parse_args()
    bs.B = args.bin
    rows = [r.split(":", 1) for r in (args.row or ROWS)]
    ids = bs.prompts(args.prompts)
    greedy = [bs.run("generate", p, args.new_tokens, [])["tokens"] for p in ids]
    print("| early exit | layers before emitting, per token | exits per gate (all prompts) | tokens equal to greedy before the first difference (per prompt) | identical outputs |")
    print("|---|---|---|---|---|")
    for name, flags in rows:
        layers, decoded, hist, prefix, identical = 0.0, 0, None, [], 0
        for p, want in zip(ids, greedy):
            r = bs.run("generate", p, args.new_tokens, ["--mode", "early-exit"] + shlex.split(flags))
            layers += r["layers_at_emit_per_token"] * (len(r["tokens"]) - 1)
            decoded += len(r["tokens"]) - 1
            h = r["exit_histogram"]
            hist = h if hist is None else [a + b for a, b in zip(hist, h)]
            prefix.append(same_prefix(r["tokens"], want))
            identical += r["tokens"] == want
        total = sum(hist)
        exits = " / ".join(f"{c / total:.2f}" for c in hist[:-1])
        print(f"| {name.strip()} | {layers / decoded:.2f} | {exits} | {', '.join(map(str, prefix))} | {identical}/{len(ids)} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
