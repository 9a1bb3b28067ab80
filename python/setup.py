"""Build out of tree: everything lives in pyproject.toml; this file only points setuptools'
scratch folders (`build/`, `*.egg-info`) at a temporary folder removed when the build exits, so
`pip install ./python` (pip builds in the source tree) leaves python/ exactly as it was.

setuptools runs this file once per build hook, in the hook's own process; each run gets its own
folder. pyproject.toml cannot set these options and setup.cfg only takes fixed paths.

It also says which setuptools the build needs when an older one runs it: pip's build isolation
installs the `setuptools>=77` that pyproject.toml requires, but `--no-build-isolation` builds with
the environment's own, which before 77 fails on the SPDX `license` string with a message that
does not say so.
"""

import atexit
import os
import shutil
import tempfile

import setuptools
from setuptools import setup

_NEEDED = 77  # pyproject.toml's [build-system] requires, for its SPDX `license` string
try:
    _major = int(setuptools.__version__.split(".")[0])
except ValueError:
    _major = _NEEDED
if _major < _NEEDED:
    raise SystemExit(
        f"m2r2-golden: building needs setuptools >= {_NEEDED}, this environment has "
        f"{setuptools.__version__}: pip install 'setuptools>={_NEEDED}', or drop "
        "--no-build-isolation so pip fetches it"
    )

scratch = tempfile.mkdtemp(prefix="m2r2-golden-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(
    options={
        "build": {"build_base": os.path.join(scratch, "build")},
        "egg_info": {"egg_base": scratch},
    }
)
