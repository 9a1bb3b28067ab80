# Prompt lookup beside self-speculative drafting on SmolLM2 (shipped weights), on the reference: each
# row with and without `--prompt-lookup N`, side by side, prompt by prompt (all rows of a prompt back
# to back, greedy first; every speculative run is checked token for token against greedy).
#
# Usage (release build):
#   python3 scripts/bench_prompt_lookup.py --samples data/distill/smollm2-train --prompts 20 \
#       --row 'chain 1: --draft-tree 1' --row 'chain 1 + lookup 4: --prompt-lookup 4' ...
#
# Prompts: the first N samples (or every K-th with --every) of a distillation folder's samples.jsonl
# (chat template applied, token ids): smollm2-train holds the training prompt set, smollm2-dev the
# first 20 of the dev prompt set.
import argparse, json, subprocess, sys

B = "./target/release/m2r2"


def prompts(folder, n, every):
    with open(f"{folder}/samples.jsonl") as f:
        rows = [json.loads(line) for line in f][::every][:n]
    return [",".join(map(str, r["tokens"][: r["prompt_len"]])) for r in rows]


def run(ids, new_tokens, extra):
    args = [B, "generate", "--model", "smollm2", "--tokens", ids, "--max-new-tokens", str(new_tokens), "--json"] + extra
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{out.stderr[-600:]}")
    return json.loads(out.stdout)


def main():
    global B
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="data/distill/smollm2-train")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--every", type=int, default=1, help="take every K-th sample")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bin", default=B)
    ap.add_argument("--row", action="append", default=[], metavar="'NAME: FLAGS'",
                    help="a speculative row: flags after --mode speculative")
    a = ap.parse_args()
    B = a.bin
    rows = [("greedy", ["--mode", "greedy"])]
    for spec in a.row:
        name, flags = spec.split(":", 1)
        rows.append((name.strip(), ["--mode", "speculative"] + flags.split()))
    ids = prompts(a.samples, a.prompts, a.every)
    print(f"{len(ids)} prompts of {a.samples} (every {a.every}), up to {a.new_tokens} new tokens each")
    keys = ["decoded", "seconds", "rounds", "nodes", "lookup_rounds", "lookup_accepted", "flops", "bytes"]
    totals = [dict.fromkeys(keys, 0) | {"same": True} for _ in rows]
    for i, p in enumerate(ids):
        want = None
        for (name, flags), t in zip(rows, totals):
            r = run(p, a.new_tokens, flags)
            t["decoded"] += len(r["tokens"]) - 1  # the first token comes from the prefill
            t["seconds"] += r["timings"]["decode_seconds"]
            # counted work of the decoded tokens (null where the loop does not count it)
            if r.get("flops_per_token") is not None:
                t["flops"] += r["flops_per_token"] * (len(r["tokens"]) - 1)
                t["bytes"] += r["bytes_per_token"] * (len(r["tokens"]) - 1)
            if name == "greedy":
                want = r["tokens"]
                continue
            t["same"] &= r["tokens"] == want
            t["rounds"] += r["rounds"]
            t["nodes"] += r.get("mean_tree_nodes", 0) * r["rounds"]
            t["lookup_rounds"] += r.get("lookup_rounds", 0)
            t["lookup_accepted"] += r.get("lookup_accepted", 0)
        print(f"  prompt {i + 1}/{len(ids)} done", file=sys.stderr)
    print("| decoding | tokens/s | vs greedy | GFLOP per token | MB of weights per token | tokens per verification | nodes per verification | rounds with a lookup branch | lookup tokens accepted per round | identical to greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = totals[0]["decoded"] / totals[0]["seconds"]
    for (name, _), t in zip(rows, totals):
        tps = t["decoded"] / t["seconds"]
        cells = ["", "", "", ""]
        if t["rounds"]:
            r = t["rounds"]
            nodes = f"{t['nodes'] / r:.2f}" if t["nodes"] else ""
            cells = [f"{t['decoded'] / r:.2f}", nodes, f"{t['lookup_rounds'] / r:.2f}", f"{t['lookup_accepted'] / r:.2f}"]
        work = ["", ""]
        if t["flops"]:
            work = [f"{t['flops'] / t['decoded'] / 1e9:.3f}", f"{t['bytes'] / t['decoded'] / 1e6:.0f}"]
        print(f"| {name} | {tps:.1f} | {tps / base:.2f}x | {' | '.join(work)} | {' | '.join(cells)} | {'yes' if t['same'] else 'NO'} |")


main()
