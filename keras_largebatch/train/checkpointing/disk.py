"""`model_dir` checked before anything is built: a folder, writable.

The nearest existing folder on the way to `model_dir` (and, resuming,
its `backup/` and `checkpoints/`) must take a file: a probe is created
and removed, so a read-only or unwritable folder ends the command with
one line and exit code 2 before data and model are built. The free space
is checked before each save (`files.save`).
"""

import os
import tempfile

from keras_largebatch.train.checkpointing import names


class OutputError(ValueError):
    """Bad `model_dir` (the command reports it on one line, exit code 2)."""


def check_model_dir(model_dir):
    """Refuses a `model_dir` that is not a folder or cannot be written."""
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise OutputError(
            f"`model_dir` exists and is not a directory. Received: "
            f"model_dir={model_dir!r}")
    # Missing parents are created (after every check); the nearest existing
    # ancestor must be a directory.
    ancestor = os.path.abspath(model_dir)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise OutputError(
            f"`model_dir` lies under {ancestor!r}, which is not a directory. "
            f"Received: model_dir={model_dir!r}")
    for folder in (ancestor, os.path.join(model_dir, names.BACKUP),
                   os.path.join(model_dir, names.CHECKPOINTS)):
        if os.path.isdir(folder):
            _probe(folder, model_dir)


def _probe(folder, model_dir):
    try:
        fd, path = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-probe",
                                    dir=folder)
        os.close(fd)
        os.remove(path)
    except OSError as e:
        raise OutputError(
            f"`model_dir` cannot be written: creating a file in {folder} "
            f"failed ({e.strerror or e}). Use a writable folder. Received: "
            f"model_dir={model_dir!r}") from None
