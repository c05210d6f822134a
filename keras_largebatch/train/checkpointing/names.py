"""The names of a run's checkpoint files, in one place.

    model_dir/
      run.lock                                 the running run's lock and
                                               who holds it (`lock.py`)
      run_config.json, epochs_raised.json      the flags (`resume.py`)
      checkpoints/epoch_NNN.weights.h5         the weights after epoch NNN
      checkpoints/epoch_NNN.keras              the last epoch's model
      final.keras                              the same file, a second name
      backup/latest.weights.h5                 model and optimizer at the
                                               last epoch's end (`Backup`)
      backup/training_metadata.json            its epoch, seed states, size
                                               and CRC-32, pending rename
      backup/staged_EEE.weights.h5             a backup being written
      backup/within_epoch_EEE_SSSSSS.weights.h5
      backup/within_epoch.json                 the checkpoint within an
                                               epoch (`StepCheckpoints`)

A file being written is `.tmp-PID-NAME` beside NAME (`_shared.atomic_path`);
a kill leaves it, and the next start removes it (`files.tidy`).
"""

import os
import re

LOCK = "run.lock"
RUN_CONFIG = "run_config.json"
RAISES = "epochs_raised.json"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
EXPORT = "final.keras"
EPOCH = "epoch_{:03d}.weights.h5"
FINAL = "epoch_{:03d}.keras"
BACKUP_WEIGHTS = "latest.weights.h5"
BACKUP_METADATA = "training_metadata.json"
STAGED = "staged_{:03d}.weights.h5"
POINTER = "within_epoch.json"
WEIGHTS = "within_epoch_{:03d}_{:06d}.weights.h5"

EPOCH_RE = re.compile(r"epoch_(\d+)\.(weights\.h5|keras)")
STAGED_RE = re.compile(r"staged_\d+\.weights\.h5")
WEIGHTS_RE = re.compile(r"within_epoch_\d+_\d+\.weights\.h5")
TEMPORARY_RE = re.compile(r"\.tmp-\d+-.+")


def epoch_of(path):
    """The epoch in a checkpoint's name (`epoch_006...` -> 6), else None."""
    match = EPOCH_RE.fullmatch(os.path.basename(path))
    return int(match.group(1)) if match else None


def plain(name):
    """Whether `name` (read from a pointer) names a file inside its folder:
    a non-empty string with no separator, not `.` or `..`."""
    return (isinstance(name, str) and name not in ("", ".", "..")
            and os.path.basename(name) == name and "\\" not in name
            and "\0" not in name)
