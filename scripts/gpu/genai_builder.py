# Greedy decoding speed of onnxruntime-genai's own builder graph of SmolLM2 beside m2r2's exports,
# on the same prompts, alternating prompt by prompt in one run (docs/GPU.md, run 10). For a GPU
# machine with no network: torch, transformers, onnx, onnx-ir and the CPU onnxruntime package in
# the image; onnxruntime-genai-cuda and gguf carried as wheels on PYTHONPATH; the onnxruntime-gpu
# libraries of scripts/gpu/pack.sh in ORT_GPU_DIR.
#
#   python3 scripts/gpu/genai_builder.py --gguf FILE --work DIR --ort-gpu-dir DIR --bin M2R2 \
#     --row 'NAME: ARGS' ... [--prompts 5] [--new-tokens 128] [--cuda-graph] [--ep cuda|cpu]
#
# 1. The GGUF is loaded with transformers (dequantised to f32, the weights m2r2 reads) and saved as
#    an HF folder (toolchain notes: a GGUF-loaded model refuses save_pretrained, so its state dict is
#    copied into a fresh model first).
# 2. `python3 -m onnxruntime_genai.models.builder -p fp32 -e cuda` writes its graph (its import of
#    onnxruntime.quantization uses the image's CPU onnxruntime package).
# 3. Decoding loads genai against the onnxruntime-gpu library: genai finds ONNX Runtime through the
#    `onnxruntime` package's capi folder, so a package holding only links to ORT_GPU_DIR's libraries
#    is put first on the path of a child process.
# Each prompt (the first N of data/distill/smollm2-dev, chat template applied) runs every m2r2 row
# (`m2r2 run --onnx DIR --tokens ... --json ARGS`) and then genai; tok/s = generated tokens / the
# seconds after the prompt's prefill, as in scripts/bench_speculative.py.
import argparse, glob, json, os, subprocess, sys, time

DATA = "data/distill/smollm2-dev"
HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def prompts(n):
    with open(f"{DATA}/samples.jsonl") as f:
        rows = [json.loads(line) for line in f][:n]
    return [r["tokens"][: r["prompt_len"]] for r in rows]


def hf_folder(gguf, out):
    if os.path.exists(f"{out}/config.json"):
        return
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # no network there
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    config = json.load(open(f"{out}/config.json"))
    config.pop("quantization_config", None)
    json.dump(config, open(f"{out}/config.json", "w"), indent=2)


def genai_child(a):
    """The decoding half, run in a child process with the linked onnxruntime package first."""
    import onnxruntime_genai as og
    model = og.Model(a.graph)
    out = []
    for ids in prompts(a.index + 1)[a.index:]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + a.new_tokens, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        start, tokens = time.perf_counter(), []
        while not gen.is_done() and len(tokens) < a.new_tokens:
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
        out.append({"tokens": tokens, "decode_seconds": time.perf_counter() - start})
    print(json.dumps(out))


def linked_ort(ort_dir, work):
    pkg = f"{work}/ortpkg/onnxruntime"
    os.makedirs(f"{pkg}/capi", exist_ok=True)
    open(f"{pkg}/__init__.py", "w").close()
    for lib in glob.glob(f"{ort_dir}/libonnxruntime*.so*"):
        link = f"{pkg}/capi/{os.path.basename(lib)}"
        if not os.path.exists(link):
            os.symlink(os.path.abspath(lib), link)
    return f"{work}/ortpkg"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--work")
    ap.add_argument("--ort-gpu-dir")
    ap.add_argument("--bin")
    ap.add_argument("--row", action="append", default=[], metavar="'NAME: ARGS'")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--ep", default="cuda", help="the builder's execution provider (cuda; cpu to try this script on a CPU machine)")
    ap.add_argument("--cuda-graph", action="store_true", help="also decode with genai's enable_cuda_graph")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return genai_child(a)
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t = time.time()
    hf_folder(a.gguf, f"{a.work}/hf")
    print(f"HF folder written ({time.time() - t:.0f} s)", flush=True)
    graph = f"{a.work}/genai-{a.ep}"
    if not os.path.exists(f"{graph}/genai_config.json"):
        t = time.time()
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", HF_NAME, "-i", f"{a.work}/hf",
               "-o", graph, "-p", "fp32", "-e", a.ep, "-c", f"{a.work}/cache"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"the builder failed ({r.returncode}):\n{r.stderr[-1500:]}")
        print(f"builder graph written ({time.time() - t:.0f} s)", flush=True)
    config = json.load(open(f"{graph}/genai_config.json"))
    decoder = config["model"]["decoder"]
    print("builder graph: provider options", json.dumps(decoder["session_options"].get("provider_options")),
          "; past_present_share_buffer", config["search"].get("past_present_share_buffer"), flush=True)
    graphs = [("onnxruntime-genai builder graph", graph)]
    if a.cuda_graph and a.ep == "cuda":
        g2 = f"{a.work}/genai-cuda-graph"
        os.makedirs(g2, exist_ok=True)
        for f in os.listdir(graph):
            if f != "genai_config.json" and not os.path.exists(f"{g2}/{f}"):
                os.symlink(os.path.abspath(f"{graph}/{f}"), f"{g2}/{f}")
        opts = decoder["session_options"].setdefault("provider_options", [{"cuda": {}}])
        for o in opts:
            o.setdefault("cuda", {})["enable_cuda_graph"] = "1"
        json.dump(config, open(f"{g2}/genai_config.json", "w"), indent=2)
        graphs.append(("onnxruntime-genai builder graph, enable_cuda_graph", g2))
    child_env = dict(env, PYTHONPATH=linked_ort(a.ort_gpu_dir, a.work) + os.pathsep + env.get("PYTHONPATH", ""))
    rows = [(name.strip(), args.split()) for name, args in (r.split(":", 1) for r in a.row)]
    totals = {name: [0, 0.0, True] for name, _ in rows}
    totals.update({name: [0, 0.0, True] for name, _ in graphs})
    ids_all = prompts(a.prompts)
    for i, ids in enumerate(ids_all):
        reference = None
        for name, args in rows:
            cmd = [a.bin, "run", "--tokens", ",".join(map(str, ids)), "--max-new-tokens", str(a.new_tokens), "--json"] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"FAILED: {' '.join(cmd)}\n{r.stderr[-600:]}")
            out = json.loads(r.stdout)
            reference = reference or out["tokens"]
            t = totals[name]
            t[0] += len(out["tokens"]); t[1] += out["timings"]["decode_seconds"]; t[2] &= out["tokens"] == reference
        for name, g in graphs:
            cmd = [sys.executable, __file__, "--child", "--graph", g, "--index", str(i), "--new-tokens", str(a.new_tokens)]
            r = subprocess.run(cmd, env=child_env, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: FAILED ({r.returncode}): {r.stderr[-800:]}", flush=True)
                totals.pop(name, None)
                graphs = [x for x in graphs if x[0] != name]
                continue
            out = json.loads(r.stdout.strip().splitlines()[-1])[0]
            t = totals[name]
            t[0] += len(out["tokens"]); t[1] += out["decode_seconds"]; t[2] &= reference is None or out["tokens"] == reference
    print(f"{len(ids_all)} prompts of {DATA}, up to {a.new_tokens} new tokens, greedy; rows alternate prompt by prompt")
    print("| engine | tokens/s | vs the first row | tokens identical to the first row |")
    print("|---|---|---|---|")
    first = None
    for name, (n, s, same) in totals.items():
        tps = n / s if s else 0.0
        first = first or tps
        print(f"| {name} | {tps:.1f} | {tps / first:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
