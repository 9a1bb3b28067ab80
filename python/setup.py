"""Build out of tree: everything lives in pyproject.toml; this file only points setuptools'
scratch folders (`build/`, `*.egg-info`) at a temporary folder removed when the build exits, so
`pip install ./python` (pip builds in the source tree) leaves python/ exactly as it was.

setuptools runs this file once per build hook, in the hook's own process; each run gets its own
folder. pyproject.toml cannot set these options and setup.cfg only takes fixed paths.
"""

import atexit
import os
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="m2r2-golden-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(
    options={
        "build": {"build_base": os.path.join(scratch, "build")},
        "egg_info": {"egg_base": scratch},
    }
)
