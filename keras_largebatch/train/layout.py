"""The run folder: every name the command writes in `model_dir`, once.

    model_dir/
      run.lock              LOCK: the lock a running run holds, and who it
                            is (`checkpointing/lock.py`)
      run_config.json       RUN_CONFIG: the flags of the first run (checked
                            when resuming, `checkpointing/resume.py`)
      epochs_raised.json    RAISES: each later raise of --epochs
      summary.json          SUMMARY: model, dataset, global_batch_size,
                            epochs, val_accuracy, images_per_sec,
                            wall_seconds, ... (`outputs/report.py`)
      learning_curves.png   CURVES: loss and accuracy per epoch (train,
                            validation)
      history.csv           HISTORY: one row per epoch, kept across resumed
                            runs (`outputs.callbacks.HistoryCSV`)
      evals.csv             EVALS: with --evals_per_epoch > 1, the
                            validation accuracy within each epoch
                            (`outputs.callbacks.WithinEpochEvals`)
      tensorboard/          TENSORBOARD: train/ and validation/ scalars per
                            epoch: loss, accuracy (top5_accuracy),
                            learning_rate, loss_scale, images_per_sec;
                            one event file an epoch, its name ending
                            TENSORBOARD_EPOCH (`outputs.EpochTensorBoard`)
      eval.json             EVAL: written by --mode=eval (`run/evaluate.py`)
      checkpoints/          CHECKPOINTS (`checkpointing/epochs.py`)
        epoch_NNN.weights.h5  EPOCH: the weights after epoch NNN
        epoch_NNN.keras       FINAL: the last epoch's model, which takes the
                              data set's own images (`outputs.exported`)
      final.keras           EXPORT: the same file, a second name
      backup/               BACKUP
        latest.weights.h5   BACKUP_WEIGHTS: model and optimizer at the last
                            epoch's end (`checkpointing.Backup`)
        training_metadata.json
                            BACKUP_METADATA: its epoch, seed states, size
                            and CRC-32, pending rename
        staged_EEE.weights.h5
                            STAGED: a backup being written
        within_epoch_EEE_SSSSSS.weights.h5
                            WEIGHTS: the checkpoint within an epoch
        within_epoch.json   POINTER: its pointer
                            (`checkpointing.StepCheckpoints`)
        topk_residuals/     RESIDUALS: each worker's error-feedback
                            residuals under --compression=topk
          worker_N/         (`distribute.topk`): epoch_NNN/ and latest,
            within_EEE_SSSSSS/  RESIDUALS_WITHIN: those of the checkpoint
                            within an epoch of the same numbers
      worker_N/             WORKER: what TensorFlow worker N (not the
                            chief) writes, laid out as `model_dir`

A file being written is `.tmp-PID-NAME` beside NAME (`_shared.atomic_path`);
a kill leaves it, and the next start removes it (`checkpointing.tidy`),
as it trims the files of `EPOCH_ROWS` and the TensorBoard event files to the
epochs the resumed run keeps.
"""

import os
import re

LOCK = "run.lock"
RUN_CONFIG = "run_config.json"
RAISES = "epochs_raised.json"
SUMMARY = "summary.json"
CURVES = "learning_curves.png"
HISTORY = "history.csv"
EVALS = "evals.csv"
TENSORBOARD = "tensorboard"
TENSORBOARD_SPLITS = ("train", "validation")
TENSORBOARD_EPOCH = ".epoch_{:03d}"  # epoch NNN, from 1
EVAL = "eval.json"
CHECKPOINTS = "checkpoints"
EPOCH = "epoch_{:03d}.weights.h5"
FINAL = "epoch_{:03d}.keras"
EXPORT = "final.keras"
BACKUP = "backup"
BACKUP_WEIGHTS = "latest.weights.h5"
BACKUP_METADATA = "training_metadata.json"
STAGED = "staged_{:03d}.weights.h5"
WEIGHTS = "within_epoch_{:03d}_{:06d}.weights.h5"
POINTER = "within_epoch.json"
RESIDUALS = "topk_residuals"
RESIDUALS_WITHIN = "within_{:03d}_{:06d}"
WORKER = "worker_{}"

# The CSV files of one row per epoch (its `epoch` column counted from 0):
# a resumed run drops the rows of the epochs it replays.
EPOCH_ROWS = (HISTORY,)

EPOCH_RE = re.compile(r"epoch_(\d+)\.(weights\.h5|keras)")
STAGED_RE = re.compile(r"staged_\d+\.weights\.h5")
TENSORBOARD_EPOCH_RE = re.compile(r"events\.out\.tfevents\..*\.epoch_(\d+)")
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
