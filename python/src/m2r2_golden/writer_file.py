"""Putting a golden on disk: through a temporary file beside its path, read back (and so validated
as every reader validates it) before it takes the path, with the mode a plain ``open`` gives.

Apart from :mod:`m2r2_golden.writer`, which builds the tensors and metadata, so that every writer
(:mod:`m2r2_golden.tree_writer` too) saves the same way."""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Dict

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from .golden import Golden
from .reader import read


def _save(tensors: Dict[str, np.ndarray], path: str, metadata: Dict[str, str]) -> Golden:
    """Write the golden to ``path`` through a temporary file beside it (named by ``tempfile``, so
    it never takes another file's name), read it back (:func:`read`: a file that does not
    validate raises ValueError and leaves ``path`` as it was), then move it to ``path``. Returns
    the golden read back.

    The file gets the mode a plain ``open(path, "w")`` gives: an existing file's, else 0666 less
    the umask (safetensors and ``tempfile`` create files 0600, which would leave goldens readable
    by their writer only). The mode is taken from a placeholder created at ``path`` (``O_EXCL``),
    removed again if the write fails."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "a folder, not a file to write the golden to", path)
    placeholder = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        placeholder = True
        mode = os.fstat(fd).st_mode
        os.close(fd)
    except FileExistsError:
        mode = os.stat(path).st_mode
    temp = None
    try:
        folder, name = os.path.split(path)
        # a hidden name beside it, as short as names must be
        fd, temp = tempfile.mkstemp(prefix=f".{name[:64]}.", suffix=".partial", dir=folder or ".")
        os.close(fd)
        try:
            save_file(tensors, temp, metadata=metadata)
        except SafetensorError as e:
            raise OSError(errno.EIO, f"cannot write the golden: {e}", path) from None
        try:
            written = read(temp)
        except ValueError as e:
            raise ValueError(str(e).replace(temp, path)) from None
        os.replace(temp, path)
        temp = None
    except BaseException:
        for leftover in [temp] + ([path] if placeholder else []):
            if leftover is not None:
                try:
                    os.remove(leftover)
                except OSError:
                    pass
        raise
    os.chmod(path, mode & 0o7777)
    written.path = path
    return written
