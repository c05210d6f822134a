"""The epoch backup: model and optimizer at each epoch's end (`Backup`)."""

import os

import keras

from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import files


class Backup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` at each epoch's end, atomic, with the seed states.

    The new weights are written whole under a name of their epoch
    (`staged_EEE.weights.h5`), then `training_metadata.json` naming them
    with their size and CRC-32, then they are renamed onto
    `latest.weights.h5`. So a run killed anywhere in a save resumes from
    the epoch before it or the one it saved, never from one's weights with
    the other's count; a restore reads the staged file where a kill left
    the rename undone. The metadata also holds the state of every
    `SeedGenerator` in the model (dropout), which weights files leave out,
    so that a resumed run draws the masks an uninterrupted run would draw.

    It is the last callback of `fit` that writes (`run.callbacks`): the
    epoch's history row, its evaluations, its checkpoint and TensorBoard
    are written before its backup, so that a run killed before the
    backup's metadata is in place replays the epoch and rewrites them (the
    rows past the epoch resumed are trimmed on resume), and one killed
    after it has them all.

    Which checkpoint a run resumes from is chosen before it is built
    (`restore.choose`): this callback restores only when `start` is its
    own (`kind == "backup"`). With `save_dir`, it saves there instead of
    `backup_dir` (the processes of a JAX job other than the chief: saving
    is collective, the chief's copy is the one kept).
    """

    def __init__(self, backup_dir, save_dir=None, start=None):
        super().__init__(backup_dir, save_freq="epoch",
                         delete_checkpoint=False)
        self.save_dir = save_dir or backup_dir
        self.start = start

    def _save_model(self):
        os.makedirs(self.save_dir, exist_ok=True)
        staged = layout.STAGED.format(self._current_epoch)
        written = files.save(self.model, os.path.join(self.save_dir, staged))
        files.save_json(os.path.join(self.save_dir, layout.BACKUP_METADATA), {
            "epoch": self._current_epoch,
            "batch": self._last_batch_seen,
            "seed_states": [s.numpy().tolist()
                            for s in seed_states(self.model)],
            "staged": staged,
            "written": written,
        })
        os.replace(os.path.join(self.save_dir, staged),
                   os.path.join(self.save_dir, layout.BACKUP_WEIGHTS))
        files.tidy(self.save_dir)

    def _load_model(self):
        start = self.start
        if start is None or start.kind != "backup":
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        # This process's folder (a TensorFlow worker keeps its own), the
        # file `start` chose, or the name it has once the rename is done.
        staged = os.path.join(self.backup_dir, os.path.basename(start.weights))
        try:
            model.load_weights(staged)
        except FileNotFoundError:
            model.load_weights(os.path.join(self.backup_dir,
                                            layout.BACKUP_WEIGHTS))
        model._initial_epoch = start.epoch
        restore_seed_states(model, start.seed_states)


def seed_states(model):
    """The state variables of the model's `SeedGenerator`s, in layer order."""
    return [generator.state
            for layer in model._flatten_layers(include_self=True)
            for generator in getattr(layer, "_seed_generators", [])]


def restore_seed_states(model, saved):
    states = seed_states(model)
    if len(saved) == len(states):
        for state, value in zip(states, saved):
            state.assign(value)
