# Summarise Nsight Compute's per-kernel times of a decode: which kernels a step spends its GPU time
# in (docs/GPU.md, run 10).
#
#   ncu --csv --metrics gpu__time_duration.sum --launch-skip S --launch-count C PROGRAM ... > ncu.csv
#   python3 scripts/gpu/ncu_kernels.py ncu.csv [--steps N] [--top K] [--last N]
#
# ncu's CSV has one row per (kernel launch, metric); this sums `gpu__time_duration.sum` by kernel
# name (templates cut at the first '<' or '(' so one cuBLAS kernel family is one row) and prints
# launches, total microseconds and share, largest first. `--steps N`: the profiled launches span N
# decode steps, so the table also gives launches and microseconds per step.
import argparse, csv, io, re, sys
from collections import defaultdict


def rows(text):
    # ncu prints its own lines (==PROF== ...) and the program's output around the CSV
    start = text.find('"ID"')
    if start < 0:
        sys.exit("no ncu CSV found (a line starting with \"ID\")")
    return csv.DictReader(io.StringIO(text[start:]))


def short(name):
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--last", type=int, default=0,
                    help="also print the last N results as they are (with --graph-profiling graph, a replayed CUDA graph is one result)")
    a = ap.parse_args()
    launches, micros = defaultdict(int), defaultdict(float)
    results = []
    for r in rows(open(a.csv, errors="replace").read()):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        name = short(r["Kernel Name"])
        results.append((r["Kernel Name"], value * scale))
        launches[name] += 1
        micros[name] += value * scale
    total = sum(micros.values())
    count = sum(launches.values())
    if not count:
        sys.exit("the CSV holds no gpu__time_duration.sum rows")
    per = a.steps if a.steps > 0 else None
    print(f"{count} kernel launches, {total:.0f} us of GPU time" +
          (f"; per step ({a.steps:g} steps): {count / per:.0f} launches, {total / per:.0f} us" if per else ""))
    head = f"{'kernel':<60} {'launches':>9} {'us':>10} {'share':>6}" + (f" {'per step':>9} {'us/step':>8}" if per else "")
    print(head)
    for name in sorted(micros, key=micros.get, reverse=True)[: a.top]:
        line = f"{name[:60]:<60} {launches[name]:>9} {micros[name]:>10.1f} {micros[name] / total:>6.1%}"
        if per:
            line += f" {launches[name] / per:>9.1f} {micros[name] / per:>8.1f}"
        print(line)
    for name, us in results[-a.last:] if a.last else []:
        print(f"{us:>10.1f} us  {name[:100]}")


if __name__ == "__main__":
    main()
