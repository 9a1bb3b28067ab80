# Summarise ONNX Runtime profiles (`--ort-profile PREFIX`): per file, the median model_run time and
# the host time of the nodes by operator and execution provider (docs/GPU.md).
# Usage: python3 ort_profile_summary.py PREFIX
import glob, json, sys, collections
for path in sorted(glob.glob(sys.argv[1] + '*')):
    try:
        ev = json.load(open(path))
    except Exception as e:
        print(path, 'unreadable', e); continue
    runs = [e['dur'] for e in ev if e.get('cat') == 'Session' and e.get('name') == 'model_run']
    nodes = [e for e in ev if e.get('cat') == 'Node' and e.get('name', '').endswith('_kernel_time')]
    by = collections.Counter(); cnt = collections.Counter(); prov = collections.Counter()
    for e in nodes:
        a = e.get('args', {}); k = (a.get('op_name'), a.get('provider'))
        by[k] += e['dur']; cnt[k] += 1; prov[a.get('provider')] += e['dur']
    n = max(len(runs), 1)
    print(f"== {path}: {len(runs)} runs, model_run median {sorted(runs)[len(runs)//2] if runs else 0} us, "
          f"nodes per run {len(nodes)/n:.0f}, node host time per run {sum(by.values())/n:.0f} us")
    print('   by provider (us/run):', {p: round(v / n) for p, v in prov.items()})
    for k, v in by.most_common(12):
        print(f'   {k[0]:<24} {k[1]:<26} {v/n:8.0f} us/run {cnt[k]/n:6.1f} nodes/run')
