# Self-speculative decoding on SmolLM2 over development prompts, on the reference and on ONNX
# Runtime CPU: the tables of docs/PERFORMANCE.md ("Trained adapters on development prompts").
#
# Usage (release build; exports made by `m2r2 export --model smollm2 --out DIR [--draft-head off]`):
#   python3 scripts/bench_speculative.py [--prompts N] [--new-tokens N] [--onnx-pruned DIR] [--onnx-full DIR] [--bin PATH]
#     [--extra 'NAME: FLAGS' (reference rows)] [--onnx-row 'NAME: FLAGS' (ONNX Runtime rows on --onnx-pruned)]
#     [--ep cuda (ONNX Runtime's provider for every ONNX row; docs/GPU.md)]
#
# Prompts are the first N samples of data/distill/smollm2-dev (chat template applied, token ids), so
# nothing here was trained on; `--data DIR` takes another distillation folder (choose on
# data/distill/smollm2-magpie-val, then report on the dev prompts). Every speculative run is checked token for token against greedy.
import argparse, json, subprocess, sys

B = "./target/release/m2r2"


DATA = "data/distill/smollm2-dev"


def prompts(n):
    with open(f"{DATA}/samples.jsonl") as f:
        rows = [json.loads(line) for line in f][:n]
    return [",".join(map(str, r["tokens"][: r["prompt_len"]])) for r in rows]


def run(cmd, ids, new_tokens, extra):
    model = ["--model", "smollm2"] if cmd == "generate" else []  # `run` takes the model from --onnx
    args = [B, cmd] + model + ["--tokens", ids, "--max-new-tokens", str(new_tokens), "--json"] + extra
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{out.stderr[-600:]}")
    return json.loads(out.stdout)


def main():
    global B, DATA
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--onnx-pruned")
    ap.add_argument("--onnx-full")
    ap.add_argument("--bin", default=B, help="the m2r2 binary")
    ap.add_argument("--repeat", type=int, default=1,
                    help="passes over the prompts; every pass runs each prompt's rows back to back, so a change of load on the machine moves greedy and speculative alike")
    ap.add_argument("--no-reference", action="store_true", help="skip the standard reference rows (greedy stays when --extra rows need it)")
    ap.add_argument("--extra", action="append", default=[], metavar="'NAME: FLAGS'",
                    help="another reference speculative row, e.g. 'dynamic conf 0.5: --dynamic-draft --gate confidence --threshold 0.5'")
    ap.add_argument("--onnx-extra", action="append", default=[], metavar="'NAME: DIR'",
                    help="another ONNX Runtime speculative row on export DIR (e.g. an older export), after --onnx-pruned's rows")
    ap.add_argument("--onnx-row", action="append", default=[], metavar="'NAME: FLAGS'",
                    help="another ONNX Runtime speculative row on --onnx-pruned's export with more flags, e.g. 'tree 2,1: --draft-tree 2,1'")
    ap.add_argument("--ep", default="cpu", help="ONNX Runtime's execution provider for every ONNX row (cpu | cuda)")
    ap.add_argument("--data", default=DATA, help="a distillation data folder (samples.jsonl with prompt_len): choose shapes and thresholds on held-out training data (data/distill/smollm2-magpie-val), report on the dev prompts")
    a = ap.parse_args()
    B, DATA = a.bin, a.data
    ort = f"ORT {a.ep.upper()}"
    ep = ["--ep", a.ep]
    configs = [
        ("reference", "greedy", "generate", ["--mode", "greedy"]),
        ("reference", "speculative, zero adapters", "generate", ["--mode", "speculative", "--m2r2", "none"]),
        ("reference", "speculative, full draft head", "generate", ["--mode", "speculative", "--draft-head", "off"]),
        ("reference", "speculative, pruned draft head", "generate", ["--mode", "speculative"]),
    ]
    for spec in a.extra:
        name, flags = spec.split(":", 1)
        configs.append(("reference", f"speculative, {name.strip()}", "generate", ["--mode", "speculative"] + flags.split()))
    if a.no_reference:  # keep greedy only when extra reference rows need its tokens and speed
        configs = configs[:1] + configs[4:] if a.extra else configs[4:]
    for engine, d in ((ort, a.onnx_full), (ort, a.onnx_pruned)):
        if d is None:
            continue
        head = "pruned" if d == a.onnx_pruned else "full"
        if head == "full" or a.onnx_full is None:
            configs.append((engine, "greedy", "run", ["--onnx", d, "--mode", "greedy"] + ep))
        configs.append((engine, f"speculative, {head} draft head", "run", ["--onnx", d, "--mode", "speculative"] + ep))
    for spec in a.onnx_row:
        if a.onnx_pruned is None:
            sys.exit("--onnx-row runs on --onnx-pruned's export: give --onnx-pruned DIR")
        name, flags = spec.split(":", 1)
        configs.append((ort, f"speculative, {name.strip()}", "run", ["--onnx", a.onnx_pruned, "--mode", "speculative"] + ep + flags.split()))
    for spec in a.onnx_extra:
        name, d = spec.split(":", 1)
        configs.append((ort, f"speculative, {name.strip()}", "run", ["--onnx", d.strip(), "--mode", "speculative"] + ep))
    ids = prompts(a.prompts)
    print(f"{len(ids)} prompts of {DATA}, up to {a.new_tokens} new tokens each")
    print("| engine | decoding | tokens/s | vs greedy | mean accepted | acceptance by draft position (trees: rounds reaching depth d) | identical to greedy |")
    print("|---|---|---|---|---|---|---|")
    greedy = {}
    totals = [dict(tokens=0, seconds=0.0, rounds=0, by_pos=[], same=True) for _ in configs]
    # Prompt by prompt, all rows of a prompt back to back (greedy first: the others are checked
    # against its tokens), for --repeat passes.
    for _ in range(a.repeat):
        for i, p in enumerate(ids):
            for (engine, name, cmd, extra), t in zip(configs, totals):
                r = run(cmd, p, a.new_tokens, extra)
                t["tokens"] += len(r["tokens"])
                t["seconds"] += r["timings"]["decode_seconds"]
                if name == "greedy":
                    greedy.setdefault(engine, {})[i] = r["tokens"]
                else:
                    want = greedy.get(engine, greedy.get("reference", {})).get(i)
                    t["same"] &= want is None or r["tokens"] == want
                    t["rounds"] += r["rounds"]
                    # a tree (--draft-tree) reports the rounds that reached each depth instead
                    by_pos = r.get("acceptance_by_position", r.get("acceptance_by_depth"))
                    t["by_pos"].append((r["rounds"], by_pos))
    for (engine, name, cmd, extra), t in zip(configs, totals):
        tps = t["tokens"] / t["seconds"]
        if name == "greedy":
            greedy.setdefault("tps", {})[engine] = tps
        base = greedy.get("tps", {}).get(engine)
        ratio = f"{tps / base:.2f}x" if base else ""
        mean = f"{t['tokens'] / t['rounds']:.2f}" if t["rounds"] else ""
        pos = ""
        by_pos = t["by_pos"]
        if by_pos:
            k = max(len(p) for _, p in by_pos)
            w = [sum(n * p[j] for n, p in by_pos if len(p) > j) / sum(n for n, p in by_pos if len(p) > j) for j in range(k)]
            pos = " / ".join(f"{x:.2f}" for x in w)
        print(f"| {engine} | {name} | {tps:.1f} | {ratio} | {mean} | {pos} | {'yes' if t['same'] else 'NO'} |")
        sys.stdout.flush()

if __name__ == "__main__":
    main()
