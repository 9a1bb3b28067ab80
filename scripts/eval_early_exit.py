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
import argparse, json, shlex, subprocess, sys

B = "./target/release/m2r2"
DATA = "data/distill/smollm2-dev"

ROWS = [
    "default (config early_exit):",
    "arla, one threshold (arla.threshold): --gate arla --threshold 1.01",
    "confidence, one threshold 0.94: --gate confidence --threshold 0.94",
    "arla, one per gate: --gate arla --threshold 0.7,1.01,0.98,0.98",
]


def prompts(n):
    with open(f"{DATA}/samples.jsonl") as f:
        rows = [json.loads(line) for line in f][:n]
    return [",".join(map(str, r["tokens"][: r["prompt_len"]])) for r in rows]


def generate(ids, new_tokens, extra):
    args = [B, "generate", "--model", "smollm2", "--tokens", ids, "--max-new-tokens", str(new_tokens), "--json"] + extra
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{out.stderr[-600:]}")
    return json.loads(out.stdout)


def same_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    global B
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bin", default=B)
    ap.add_argument("--row", action="append", help="'NAME: FLAGS' (replaces the default rows)")
    args = ap.parse_args()
    B = args.bin
    rows = [r.split(":", 1) for r in (args.row or ROWS)]
    ids = prompts(args.prompts)
    greedy = [generate(p, args.new_tokens, [])["tokens"] for p in ids]
    print("| early exit | layers before emitting, per token | exits per gate (all prompts) | tokens equal to greedy before the first difference (per prompt) | identical outputs |")
    print("|---|---|---|---|---|")
    for name, flags in rows:
        layers, decoded, hist, prefix, identical = 0.0, 0, None, [], 0
        for p, want in zip(ids, greedy):
            r = generate(p, args.new_tokens, ["--mode", "early-exit"] + shlex.split(flags))
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
