"""Tests of what ships beside m2r2_golden (stdlib unittest, run with test_golden.py): the ONNX
Runtime example's user errors, the build's setuptools check, and the docs' version.

The example runs its own main() with ONNX Runtime stubbed out (a stand-in module, and the export
and decode replaced by the reference golden's tokens), so only numpy and m2r2_golden are needed;
tests/cli/golden_python.rs runs it for real on an export. Goldens come in as for test_golden.py.
"""

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

from safetensors import safe_open
from safetensors.numpy import save_file

import m2r2_golden

PACKAGE = Path(__file__).resolve().parents[1]  # python/


def reference_golden(var: str) -> str:
    path = os.environ.get(var)
    if not path:
        raise AssertionError(f"{var} is not set: see test_golden.py")
    return path


def load_example():
    """examples/onnxruntime_greedy.py as a module, with a stand-in onnxruntime."""
    path = PACKAGE / "examples" / "onnxruntime_greedy.py"
    spec = importlib.util.spec_from_file_location("onnxruntime_greedy", path)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, {"onnxruntime": types.ModuleType("onnxruntime")}):
        spec.loader.exec_module(module)
    return module


class ExampleUserErrors(unittest.TestCase):
    """A missing or invalid --like and an --out that cannot be written: one line, exit non-zero."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.example = load_example()
        self.ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        ref = self.ref
        # the export and the decode: the reference's own
        self.example.load_export = lambda folder, provider: (None, ref.config)
        self.example.decode_greedy = lambda *args: (ref.tokens.tolist(), ref.logits.copy())

    def path(self, name: str) -> str:
        return os.path.join(self.dir.name, name)

    def run_example(self, like: str, out: str) -> str:
        """The message main() exits with (its SystemExit's, printed on stderr with status 1)."""
        argv = ["--export", self.dir.name, "--like", like, "--out", out, "--ignore-eos"]
        with self.assertRaises(SystemExit) as e:
            self.example.main(argv)
        message = e.exception.code
        self.assertIsInstance(message, str)  # a message: exit status 1, no traceback
        self.assertNotIn("\n", message)
        return message

    def test_like_missing_a_folder_or_invalid(self):
        missing = self.path("missing.golden.safetensors")
        self.assertEqual(
            self.run_example(missing, self.path("out")),
            f"--like: {missing}: No such file or directory",
        )
        folder = self.path("adir.gs")
        os.mkdir(folder)
        self.assertIn(f"--like: {folder}: ", self.run_example(folder, self.path("out")))
        # a golden whose tokens do not fit its budget, as the reference refuses it
        with safe_open(reference_golden("M2R2_GOLDEN_GREEDY"), framework="np") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = {**f.metadata(), "max_steps": "2"}
        bad = self.path("bad.golden.safetensors")
        save_file(tensors, bad, metadata=metadata)
        self.assertIn(
            f"--like: {bad}: `tokens` do not agree with `stop_tokens` and `max_steps`",
            self.run_example(bad, self.path("out")),
        )
        self.assertFalse(os.path.exists(self.path("out")))

    def test_out_that_cannot_be_written(self):
        like = reference_golden("M2R2_GOLDEN_GREEDY")
        out = self.path("missing-folder/actual.golden.safetensors")
        self.assertEqual(self.run_example(like, out), f"--out: {out}: No such file or directory")
        folder = self.path("adir.gs")
        os.mkdir(folder)
        self.assertIn(f"--out: {folder}: ", self.run_example(like, folder))
        # and the same decode written where it can be
        ok = self.path("ok.golden.safetensors")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = self.example.main(
                ["--export", self.dir.name, "--like", like, "--out", ok, "--ignore-eos"]
            )
        self.assertEqual(status, 0)
        self.assertIn(f"wrote {ok}", printed.getvalue())
        self.assertEqual(m2r2_golden.read(ok).tokens.tolist(), self.ref.tokens.tolist())


class BuildNeedsSetuptools77(unittest.TestCase):
    """setup.py says which setuptools it needs when an older one runs it (`pip install
    --no-build-isolation` with setuptools < 77, which otherwise fails on the SPDX license)."""

    def run_setup(self, version: str) -> subprocess.CompletedProcess:
        stub = (
            "import sys, types\n"
            "fake = types.ModuleType('setuptools')\n"
            f"fake.__version__ = {version!r}\n"
            "fake.setup = lambda **kwargs: print('setup called')\n"
            "sys.modules['setuptools'] = fake\n"
            "sys.argv = ['setup.py']\n"
            f"exec(compile(open({str(PACKAGE / 'setup.py')!r}).read(), 'setup.py', 'exec'))\n"
        )
        return subprocess.run(
            [sys.executable, "-c", stub], capture_output=True, text=True, timeout=60
        )

    def test_older_setuptools_is_named(self):
        old = self.run_setup("67.6.1")
        self.assertNotEqual(old.returncode, 0)
        self.assertIn("needs setuptools >= 77", old.stderr)
        self.assertIn("67.6.1", old.stderr)
        self.assertNotIn("setup called", old.stdout)
        new = self.run_setup("80.9.0")
        self.assertEqual(new.returncode, 0, new.stderr)
        self.assertIn("setup called", new.stdout)


class Docs(unittest.TestCase):
    def test_readme_names_the_version_files_record(self):
        readme = (PACKAGE / "README.md").read_text(encoding="utf-8")
        self.assertIn(f'`m2r2_version = "m2r2-golden-python {m2r2_golden.__version__}"`', readme)

    def test_docstrings_say_what_is_written(self):
        # the module docs name every version written, and nothing calls a written one read only
        doc = m2r2_golden.golden.__doc__
        self.assertIn("write_tree", doc)
        source = (PACKAGE / "src" / "m2r2_golden" / "golden.py").read_text(encoding="utf-8")
        self.assertNotIn("read only", source)
        self.assertNotIn("steps=ref.max_steps,", m2r2_golden.__doc__)


if __name__ == "__main__":
    unittest.main()
