"""A run's checkpoints, in one package (file names: `train/layout.py`).

    check_model_dir(model_dir, run_config, recorded, train)
                                -> resume.Resume or None
        a writable folder (`disk.py`); resuming, the flags compared with
        the run `recorded` there (`resume.py`, read once by the caller)
        and the newest checkpoint that loads whole chosen (`restore.py`),
        before data and model are built
    lock.acquire(model_dir)     the run folder's one writer (`lock.py`),
                                taken before anything is written
    tidy(model_dir)             removes what a killed run left (temporaries,
                                staged backups), at the start of training
    Backup                      the epoch backup (`backup.py`)
    StepCheckpoints             the checkpoint within an epoch
                                (`within_epoch.py`)
    EpochCheckpoints, save_final, latest
                                epoch checkpoints and the final model
                                (`epochs.py`)
    SaveError                   a checkpoint that could not be written
                                (`files.py`: every save goes through
                                `files.save`)

Every checkpoint file is written to a temporary name and renamed into
place; its pointer (the JSON file naming it) is written after it and
records its size and CRC-32.
"""

import csv
import json
import os

from keras_largebatch._shared import atomic_path
from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import files
from keras_largebatch.train.checkpointing.backup import Backup
from keras_largebatch.train.checkpointing.disk import OutputError
from keras_largebatch.train.checkpointing.epochs import EpochCheckpoints
from keras_largebatch.train.checkpointing.epochs import latest
from keras_largebatch.train.checkpointing.epochs import save_final
from keras_largebatch.train.checkpointing.files import SaveError
from keras_largebatch.train.checkpointing.restore import NoCheckpoint
from keras_largebatch.train.checkpointing.resume import check_model_dir
from keras_largebatch.train.checkpointing.within_epoch import StepCheckpoints


def tidy(model_dir, finished_epochs=None):
    """Removes temporaries and staged backups a kill left in `model_dir`,
    its `backup/` and `checkpoints/` (the staged backup the metadata names
    is kept: it is the backup), and resuming after `finished_epochs`, the
    rows of the epochs it replays from each file of `layout.EPOCH_ROWS`
    (there are some where a damaged checkpoint was skipped for an older
    one) and their TensorBoard event files. Returns the paths removed."""
    backup = os.path.join(model_dir, layout.BACKUP)
    pending = None
    try:
        with open(os.path.join(backup, layout.BACKUP_METADATA)) as f:
            pending = json.load(f).get("staged")
    except (OSError, ValueError, AttributeError):
        pass
    removed = []
    for folder in (model_dir, backup,
                   os.path.join(model_dir, layout.CHECKPOINTS)):
        removed += [os.path.join(folder, name)
                    for name in files.tidy(folder, pending)]
    if finished_epochs is not None:
        for name in layout.EPOCH_ROWS:
            _trim_epochs(os.path.join(model_dir, name), finished_epochs)
        removed += _trim_tensorboard(
            os.path.join(model_dir, layout.TENSORBOARD), finished_epochs)
    return removed


def _trim_tensorboard(log_dir, epochs):
    """Removes the event files of the epochs after the first `epochs`
    (`layout.TENSORBOARD_EPOCH`); returns their paths."""
    removed = []
    for split in layout.TENSORBOARD_SPLITS:
        folder = os.path.join(log_dir, split)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            found = layout.TENSORBOARD_EPOCH_RE.fullmatch(name)
            if found and int(found.group(1)) > epochs:
                os.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    return removed


def _trim_epochs(path, epochs):
    """Keeps the rows of the CSV file `path` (as Keras' `CSVLogger` writes
    it: an `epoch` column from 0) of the first `epochs` epochs."""
    if not os.path.exists(path):
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "epoch" not in rows[0]:
        return
    column = rows[0].index("epoch")
    kept = [rows[0]] + [r for r in rows[1:]
                        if r and int(float(r[column])) < epochs]
    if len(kept) < len(rows):
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            csv.writer(f).writerows(kept)


__all__ = ["Backup", "EpochCheckpoints", "NoCheckpoint", "OutputError",
           "SaveError", "StepCheckpoints", "check_model_dir", "latest",
           "save_final", "tidy"]
