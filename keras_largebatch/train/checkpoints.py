"""A run's checkpoints: the last epochs' weights, the final weights, the model.

    checkpoints/epoch_NNN.weights.h5   the weights after epoch NNN; the last
                                       `--keep_checkpoints` (default 2) kept
    checkpoints/final.weights.h5       the weights at the end (a hard link
                                       to the last epoch's file: same bytes)
    final.keras                        the model, for `keras.saving.load_model`

None of them holds optimizer state: resuming reads `backup/`, which holds
the weights and the optimizer's state (momentum, loss scale) once. A default
run therefore leaves three copies of the weights plus the backup.
"""

import glob
import os

import keras

from keras_largebatch._shared import atomic_path
from keras_largebatch._shared import check_int

EPOCH_PATTERN = "epoch_{:03d}.weights.h5"
FINAL = "final.weights.h5"
EXPORT = "final.keras"


def weights_only(model):
    """An uncompiled twin sharing `model`'s layers: saves no optimizer."""
    return keras.Model(model.inputs, model.outputs, name=model.name)


def save_weights(model, path):
    """Writes `model`'s weights (no optimizer state) to `path` atomically."""
    with atomic_path(path) as tmp:
        weights_only(model).save_weights(tmp)


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves the weights after each epoch and keeps the last `keep`."""

    def __init__(self, folder, keep=2):
        super().__init__()
        check_int("keep_checkpoints", keep, 0)
        self.folder = folder
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        if not self.keep:
            return
        name = EPOCH_PATTERN.format(epoch + 1)
        save_weights(self.model, os.path.join(self.folder, name))
        for path in epoch_checkpoints(self.folder)[:-self.keep]:
            os.remove(path)


def epoch_checkpoints(folder):
    """The epoch checkpoints in `folder`, oldest first."""
    return sorted(glob.glob(os.path.join(folder, "epoch_[0-9]*.weights.h5")))


def save_final(model, folder, model_dir, epoch):
    """Writes `final.weights.h5` (linked to epoch `epoch`'s file when it
    exists) and exports the model (no optimizer) to `model_dir/final.keras`.
    """
    final = os.path.join(folder, FINAL)
    last = os.path.join(folder, EPOCH_PATTERN.format(epoch))
    try:
        with atomic_path(final) as tmp:
            os.link(last, tmp)
    except OSError:  # No such epoch file, or no hard links here.
        save_weights(model, final)
    with atomic_path(os.path.join(model_dir, EXPORT)) as tmp:
        weights_only(model).save(tmp)


def latest(folder):
    """The newest checkpoint in `folder` (an epoch's, else the final one)."""
    found = epoch_checkpoints(folder)
    if found:
        return found[-1]
    final = os.path.join(folder, FINAL)
    return final if os.path.exists(final) else None
