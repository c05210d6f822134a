"""A run's checkpoints: the last epochs' weights and the final model.

    checkpoints/epoch_NNN.weights.h5   the weights after epoch NNN
    checkpoints/epoch_NNN.keras        the last epoch: the final model
                                       (weights and architecture, no
                                       optimizer), for `keras.saving.load_model`
    final.keras                        the same file under a second name (a
                                       hard link: its bytes are on disk once)

`--keep_checkpoints` (default 2) epoch checkpoints are kept, the final
model counting as the newest; with 0, only `final.keras` is written (a file
of its own). Each file holds every variable once and no optimizer state:
resuming reads `backup/`, which holds the weights and the optimizer's state
(momentum, loss scale) once. A default run therefore leaves two copies of
the weights (epoch N-1's and the final model's) plus the backup.

`--mode=eval`, `latest` and `--init_weights` read either format.
"""

import os
import shutil
import zipfile

import keras

from keras_largebatch._shared import atomic_path
from keras_largebatch._shared import check_int
from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import files
from keras_largebatch.train.layout import epoch_of


def weights_only(model):
    """An uncompiled twin sharing `model`'s layers: saves no optimizer."""
    return keras.Model(model.inputs, model.outputs, name=model.name)


def save_weights(model, path):
    """Writes `model`'s weights (no optimizer state) to `path` atomically."""
    files.save(weights_only(model), path)


def save_model(model, path):
    """Writes `model` (no optimizer state) as a `.keras` file atomically.

    Keras stores the archive's members uncompressed; they are deflated
    here (float32 weights shrink a little, see docs/training.md, and
    `keras.models.load_model` reads either).
    """
    twin = weights_only(model)

    def write(tmp):
        twin.save(tmp)
        _deflate(tmp)

    files.save(twin, path, write)


def _deflate(path):
    packed = path + ".deflated"  # A .tmp- name too: litter if killed.
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(
            packed, "w", compression=zipfile.ZIP_DEFLATED,
            compresslevel=1) as dst:
        for info in src.infolist():
            with src.open(info) as data, dst.open(
                    info.filename, "w",
                    force_zip64=info.file_size >= 2**31 - 1) as out:
                shutil.copyfileobj(data, out, 1 << 20)
    os.replace(packed, path)


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
        name = layout.EPOCH.format(epoch + 1)
        save_weights(self.model, os.path.join(self.folder, name))
        prune(self.folder, self.keep)


def epoch_checkpoints(folder):
    """The epoch checkpoints in `folder` (both formats), oldest first."""
    found = [os.path.join(folder, name) for name in (
        os.listdir(folder) if os.path.isdir(folder) else ())
        if layout.EPOCH_RE.fullmatch(name)]
    return sorted(found, key=lambda p: (epoch_of(p), p.endswith(".keras")))


def prune(folder, keep):
    """Removes all but the newest `keep` epoch checkpoints."""
    for path in epoch_checkpoints(folder)[:-keep or None]:
        os.remove(path)


def save_final(save, folder, model_dir, epoch, keep=2):
    """Saves the final model once, with `save(path)` (the command's
    `outputs.exported.save_keras`): as epoch `epoch`'s checkpoint
    (`epoch_NNN.keras`, replacing that epoch's `.weights.h5`) and, under a
    second name, as `model_dir/final.keras`.

    With `keep` 0, or where the file system has no hard links, `final.keras`
    is a file of its own.
    """
    export = os.path.join(model_dir, layout.EXPORT)
    if not keep:
        save(export)
        return
    final = os.path.join(folder, layout.FINAL.format(epoch))
    save(final)
    weights = os.path.join(folder, layout.EPOCH.format(epoch))
    if os.path.exists(weights):
        os.remove(weights)
    prune(folder, keep)
    try:
        with atomic_path(export) as tmp:
            os.link(final, tmp)
    except OSError:  # No hard links here: a copy.
        try:
            with atomic_path(export) as tmp:
                shutil.copyfile(final, tmp)
        except OSError as e:
            raise files.SaveError(
                f"could not write {export} ({e.strerror or e}); "
                f"{final} holds the final model") from None


def latest(model_dir):
    """The newest checkpoint of the run in `model_dir`: its newest epoch
    checkpoint, else `final.keras`, else None."""
    found = epoch_checkpoints(os.path.join(model_dir, layout.CHECKPOINTS))
    if found:
        return found[-1]
    export = os.path.join(model_dir, layout.EXPORT)
    return export if os.path.exists(export) else None
