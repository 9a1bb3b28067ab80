"""Check ONNX graphs the way the exporter's tests require (export/tests/files.rs):
onnx.checker.check_model(full_check=True) and strict shape inference with type checks.

Usage: python check_graphs.py GRAPH.onnx [...]  (external data is found next to each graph)
Prints one line per graph; exits non-zero with the checker's message on the first failure.
"""

import sys

import onnx
from onnx import shape_inference


def main(paths):
    for path in paths:
        # A path, not a loaded model: the checker then also resolves external data files.
        onnx.checker.check_model(path, full_check=True)
        model = onnx.load(path, load_external_data=False)
        shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        print(f"OK {path} (opset {model.opset_import[0].version}, ir {model.ir_version}, "
              f"{len(model.graph.node)} nodes)")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as e:  # the checker's own message, on one line, for the Rust test
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
