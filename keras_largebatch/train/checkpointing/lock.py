"""One writer per run folder: an OS lock on `model_dir/run.lock`.

A training run takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `run.lock` before
it writes anything in `model_dir` and holds it until it ends; the kernel
releases it when the process dies, however it dies, so a kill never
leaves a stale lock. The holder writes who it is into the file

    {"pid": 4242, "host": "node7", "started": "2025-06-01 12:00:00"}

and a second run on the same folder is refused with one line naming the
folder and that holder (`LockedError`, exit code 2). A run that ends
removes `run.lock` while it still holds the lock, so a folder looks as
it did before the run where nothing else was written (a run refused for
bad input); one that opened the file just before it was removed finds,
once it holds the lock, that its file is no longer the folder's and
opens the new one. A killed run leaves `run.lock` behind, unlocked. The processes of one
multi-process run share the chief's lock: only the chief takes it (the
others write nothing in `model_dir`, or their own `worker_N/`).

On a file system without `flock` (some network file systems: see
docs/training.md), the run goes on unlocked: `RunLock.unlocked` says why,
in one line the command prints.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket

from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import disk

# flock's errors where the file system has no locks (not a held lock).
UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class LockedError(ValueError):
    """Another run holds `model_dir` (one line, exit code 2)."""


class RunLock:
    """The lock a run holds on its `model_dir` (`acquire`), released by
    `release` or by the process's end. `created`: the folder was made to
    hold the lock, so a run refused later leaves nothing behind.
    `unlocked`: None, or why the folder is not locked (its file system has
    no `flock`) and what to make sure of, in one line."""

    def __init__(self, model_dir, file, created, unlocked=None):
        self.model_dir = model_dir
        self.file = file
        self.created = created
        self.unlocked = unlocked

    def release(self, remove_if_empty=False):
        """Removes `run.lock` and releases the lock; with
        `remove_if_empty`, also the folder `acquire` created, if nothing
        else was written into it."""
        if self.file is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.model_dir, layout.LOCK))
        self.file.close()
        self.file = None
        if remove_if_empty and self.created:
            with contextlib.suppress(OSError):  # Not empty: kept.
                os.rmdir(self.model_dir)


def acquire(model_dir):
    """Takes the lock on `model_dir` (created if missing, after
    `disk.check_model_dir`) and writes the holder into it; returns a
    `RunLock`. Raises `LockedError` naming the holder, or
    `disk.OutputError`."""
    disk.check_model_dir(model_dir)
    created = not os.path.isdir(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, layout.LOCK)
    while True:
        file = open(path, "a+")
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in UNSUPPORTED:
                return RunLock(
                    model_dir, file, created,
                    unlocked=f"{model_dir} is not locked: its file system "
                    f"has no flock ({e.strerror}); make sure no other run "
                    f"uses this folder")
            file.seek(0)
            holder = file.read()
            file.close()
            raise LockedError(
                f"`model_dir` is in use by another run ({describe(holder)}); "
                f"a second run would overwrite its files. Wait for it to end "
                f"or use another --model_dir. Received: "
                f"model_dir={model_dir!r}") from None
        if _is_the_folders(file, path):
            break
        file.close()  # Removed by the holder that released it: again.
    file.seek(0)
    file.truncate()
    file.write(json.dumps(holder_of_this_process()) + "\n")
    file.flush()
    return RunLock(model_dir, file, created)


def _is_the_folders(file, path):
    """Whether the open `file` is still the file at `path`."""
    try:
        return os.stat(path).st_ino == os.fstat(file.fileno()).st_ino
    except FileNotFoundError:
        return False


def holder_of_this_process():
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(
                sep=" ", timespec="seconds")}


def describe(text):
    """`pid 4242 on node7, started 2025-06-01 12:00:00`, from the lock
    file's `text` (what its holder wrote)."""
    try:
        holder = json.loads(text)
        return (f"pid {holder['pid']} on {holder['host']}, started "
                f"{holder['started']}")
    except (ValueError, TypeError, KeyError):
        return "its holder has not written its name yet"
