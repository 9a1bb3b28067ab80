# Runs `m2r2 generate --json` in every M2R2 mode on the built-in models and SmolLM2 and prints the
# rows of docs/PERFORMANCE.md ("M2R2 modes on the reference"). Needs a release build and, for the
# random SmolLM2 adapters, `m2r2 init-m2r2 --model smollm2 --seed 1 --out /tmp/smol-rand`.
import json, subprocess, sys
B = "./target/release/m2r2"
rows = []
def run(model, m2r2, mode, extra, prompt):
    args = [B, "generate", "--model", model, "--mode", mode, "--max-new-tokens", "48", "--json"] + prompt + extra
    if m2r2: args += ["--m2r2", m2r2]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        print("FAIL", args, out.stderr[-400:], file=sys.stderr); return None
    return json.loads(out.stdout)
cases = [("tiny", None, ["--tokens", "72,105,33,32,84,104,101"]), ("tiny-moe", None, ["--tokens", "72,105,33,32,84,104,101"]),
         ("smollm2", "none", ["--prompt", "Explain what a rainbow is in two sentences.", "--chat"]),
         ("smollm2", "/tmp/smol-rand", ["--prompt", "Explain what a rainbow is in two sentences.", "--chat"])]
for model, m2r2, prompt in cases:
    g = run(model, m2r2, "greedy", [], prompt)
    modes = [("greedy", [], g),
             ("early-exit conf 0.9 exact", ["--gate", "confidence", "--threshold", "0.9"], None),
             ("early-exit arla 0.5 exact", ["--gate", "arla", "--threshold", "0.5"], None) if m2r2 != "none" else None,
             ("speculative gd=1 len=4", ["--draft-gate", "1", "--draft-len", "4"], None),
             ("speculative gd=2 len=4", ["--draft-gate", "2", "--draft-len", "4"], None),
             ("speculative gd=1 dynamic conf 0.5", ["--draft-gate", "1", "--dynamic-draft", "--gate", "confidence", "--threshold", "0.5"], None)]
    for m in modes:
        if m is None: continue
        name, extra, res = m
        mode = name.split()[0]
        res = res or run(model, m2r2, mode, extra, prompt)
        if res is None: continue
        same = res["tokens"] == g["tokens"]
        print(f"| {model} | {m2r2 or 'built-in'} | {name} | {res['tokens_per_second']:.1f} | {same} | {res['layers_per_token']:.2f} | {res.get('mean_accepted_tokens') or '':} | {res.get('exit_histogram') or ''} | {res['flops_per_token']/1e6:.2f} | {res['bytes_per_token']/1e6:.2f} |")
        sys.stdout.flush()
