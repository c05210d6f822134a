"""`model_dir` checked before anything is built: a folder, writable.

The nearest existing folder on the way to `model_dir` (and, resuming,
its `backup/` and `checkpoints/`) must take a file: a probe is created
and removed, so a read-only or unwritable folder ends the command with
one line and exit code 2 before data and model are built. Once the model
is built, and before training, `check_free_space` refuses a disk that
cannot hold the first epoch's checkpoints (exit code 2, nothing written);
the free space is checked again before each save (`files.save`).
"""

import os
import shutil
import tempfile

from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import files


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
    for folder in (ancestor, os.path.join(model_dir, layout.BACKUP),
                   os.path.join(model_dir, layout.CHECKPOINTS)):
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


def first_checkpoint_bytes(model):
    """About the bytes the first epoch's end writes: the backup (weights
    and the optimizer's state, `model.optimizer` built) and the epoch's
    weights."""
    from keras_largebatch.train.checkpointing import epochs

    return files.estimate(model) + files.estimate(epochs.weights_only(model))


def check_free_space(model_dir, needed, resuming):
    """Refuses a `model_dir` whose disk has fewer than `needed` bytes free
    (`OutputError`), saying that nothing was written (`resuming`: that the
    run there is as it was)."""
    free = shutil.disk_usage(_nearest_folder(model_dir)).free
    if free >= needed:
        return
    kept = ("Nothing new was written: the run there resumes from its last "
            "checkpoint once there is space" if resuming else
            "Nothing was written, so there is nothing to resume")
    raise OutputError(
        f"`model_dir` has {_mb(free)} free on its disk; the first "
        f"checkpoint (the weights, the optimizer's state, the weights "
        f"again) needs about {_mb(needed)}. {kept}. Free some space or "
        f"use another --model_dir. Received: model_dir={model_dir!r}")


def _nearest_folder(path):
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def _mb(count):
    return f"{count / 1e6:.1f} MB"
