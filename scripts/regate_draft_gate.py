"""Put a newly trained shallow draft gate in front of an M2R2 folder's deeper gates.

usage: python3 scripts/regate_draft_gate.py SHALLOW DEEP OUT

SHALLOW: a `m2r2 train --gates G,E1,E2,... --train-gates 1` output (gate 1 after G layers, its
adapters on code layers 0..G trained, usually with a bridge); DEEP: a folder whose gates are
E1,E2,... (the same rank, alpha and targets), or G,E1,E2,..., whose gate 1 is then replaced. OUT gets SHALLOW's config (its gates, bridge and
drafting settings), its adapters on layers 0..G and bridge, and DEEP's adapters on layers G..,
all tensors in f16. DEEP's adapters on layers G..E1 were trained for an interval that started at
layer 0, so early exit at gate 2 reads them from a slow state they were not trained on; retrain
ARLA (`m2r2 train-arla`) and the pruned head (`m2r2 draft-head`) on OUT, as after `train --init`.

Needs numpy and safetensors (the test environment has both).
"""

import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def layer(name):
    return int(name.split(".layers.")[1].split(".")[0])


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    shallow, deep, out = sys.argv[1:4]
    config = json.load(open(os.path.join(shallow, "m2r2_config.json")))
    deep_config = json.load(open(os.path.join(deep, "m2r2_config.json")))
    g = config["gates"][0]
    # DEEP without the shallow gate (it goes in front), or with it (its gate 1 is replaced)
    if deep_config["gates"] not in (config["gates"][1:], config["gates"]):
        sys.exit(f"{shallow} has gates {config['gates']}: expected {g} followed by the gates "
                 f"of {deep}, {deep_config['gates']} (or the same gates)")
    for key in ["rank", "alpha", "targets"]:
        if config[key] != deep_config[key]:
            sys.exit(f"`{key}` differs: {config[key]} in {shallow}, {deep_config[key]} in {deep}")
    os.makedirs(out, exist_ok=True)
    a = load_file(os.path.join(shallow, "adapter_model.safetensors"))
    b = load_file(os.path.join(deep, "adapter_model.safetensors"))
    merged = {k: v for k, v in a.items() if layer(k) < g}
    merged.update({k: v for k, v in b.items() if layer(k) >= g})
    f16 = {k: v.astype(np.float16) for k, v in merged.items()}
    save_file(f16, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    peft = json.load(open(os.path.join(deep, "adapter_config.json")))
    peft["layers_to_transform"] = sorted({layer(k) for k in merged})
    json.dump(peft, open(os.path.join(out, "adapter_config.json"), "w"), indent=2)
    bridge = os.path.join(shallow, "bridge.safetensors")
    if os.path.exists(bridge):
        f16 = {k: v.astype(np.float16) for k, v in load_file(bridge).items()}
        save_file(f16, os.path.join(out, "bridge.safetensors"), metadata={"format": "pt"})
    json.dump(config, open(os.path.join(out, "m2r2_config.json"), "w"), indent=2)
    print(f"gate 1 after {g} layers, then {deep_config['gates']}: {len(merged)} adapter tensors "
          f"-> {out}")


if __name__ == "__main__":
    try:
        main()
    except (OSError, KeyError, ValueError) as e:  # a missing or malformed folder: say which
        sys.exit(f"regate_draft_gate.py: {e}")
