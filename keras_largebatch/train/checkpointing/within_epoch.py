"""Checkpoints within an epoch (`--checkpoint_every_steps`).

A step is an update: an optimizer step, `--gradient_accumulation_steps`
micro-batches (more once `--adaptive_batch` grows the batch). Every N
updates into an epoch (not at its end: the epoch's backup is taken
there), at an update boundary, `StepCheckpoints` writes into `backup/`

    within_epoch_EEE_SSSSSS.weights.h5   the model and the optimizer
                                         (momentum, loss scale, noise-scale
                                         statistics, the batch in effect)
    within_epoch.json                    epoch, step, micro-batches, the
                                         data position, the adaptive
                                         batch's pending switch, the
                                         dropout seed states, the metrics,
                                         the weights' name, size and CRC-32

the weights first, the JSON last (each renamed into place), the previous
weights removed only then (also across an epoch's end, until the run
ends): a run killed while writing keeps the previous checkpoint, and one
whose epoch backup is damaged falls back to the last checkpoint within
the epoch before. The data position is Grain's iterator state
(`grain_pipeline.Resumable`) or, for tf.data, the micro-batch to start
from (`tf_pipeline.batch`'s `initial_step`). A run started again resumes
from the newer of this and the epoch backup that loads whole
(`restore.choose`), says `resumed from epoch E, step S` (E counted from
1, as Keras' progress shows it; S updates into it), runs the rest of that
epoch and goes on; its weights at the end are those of an uninterrupted
run. A run stopped by a signal (`run.interrupt`) saves the same
checkpoint at the step it stops at (`save_now`), with or without the
flag.
"""

import dataclasses
import os

import keras
import numpy as np

from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import backup
from keras_largebatch.train.checkpointing import files


@dataclasses.dataclass(frozen=True)
class Position:
    """A checkpoint within epoch `epoch` (from 0): `step` updates and
    `micro_batches` batches of `fit` into it; `data` is the pipeline's
    position (`{"grain_state": ..., "start_epoch": ...}` or `{}`); the
    weights file `weights` holds the model and the optimizer."""

    epoch: int
    step: int
    micro_batches: int
    data: dict
    pending_accumulation_steps: int
    seed_states: list
    metrics: list
    weights: str


class StepCheckpoints(keras.callbacks.Callback):
    """Saves every `every` updates within an epoch, and where asked
    (`save_now`); resumes from `restore`.

    With `every` 0 it reads nothing per batch: the steps into an epoch are
    the micro-batches (one per update) or, under accumulation, the
    optimizer's updates since the epoch began, read once an epoch.

    Args:
        every: updates between checkpoints (0: none, only resumes and
            saves where asked).
        save_dir: the folder written (`backup/`).
        steps_per_epoch: batches of `fit` per epoch.
        restore: the `Position` this run resumes from, or None.
        data: the `grain_pipeline.Resumable` training data, or None
            (tf.data: the position is the micro-batch).
        adaptive: the `AdaptiveBatch` callback, or None.
        strategy: the TensorFlow strategy, or None (its metrics are
            per-worker sums, not restored).
        residuals: the top-k residuals' callback (`distribute.sparse.
            residual_checkpoint_callback`), or None: each checkpoint also
            saves them (`layout.RESIDUALS_WITHIN`), then waits at
            `barrier` until every worker has, before the pointer names it.
        barrier: returns once every worker has called it (None: one
            process).
    """

    def __init__(self, every, save_dir, steps_per_epoch, restore=None,
                 data=None, adaptive=None, strategy=None, residuals=None,
                 barrier=None):
        super().__init__()
        self.every = every
        self.save_dir = save_dir
        self.steps_per_epoch = steps_per_epoch
        self.restore = restore
        self.data = data
        self.adaptive = adaptive
        self.strategy = strategy
        self.residuals = residuals
        self.barrier = barrier
        self.step = 0
        self._consumed = 0
        self._offset = 0
        self._micro = 0
        self._updates_before = None

    def on_train_begin(self, logs=None):
        position = self.restore
        if position is None:
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(position.weights)
        backup.restore_seed_states(model, position.seed_states)
        model._initial_epoch = position.epoch
        if self.adaptive is not None:
            self.adaptive.resume_within_epoch(
                position.pending_accumulation_steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self.step, self._offset = epoch, 0, 0
        position, self._cut = self.restore, False
        if position is not None and epoch == position.epoch:
            self.step, self._offset = position.step, position.micro_batches
            self._cut = True
            variables = self._metrics_variables(len(position.metrics))
            if self.strategy is None and len(variables) == len(
                    position.metrics):
                for variable, value in zip(variables, position.metrics):
                    variable.assign(np.asarray(value, variable.dtype))
        self._micro = self._offset
        self._updates_before = None
        if not self.every and self._per_update():
            self._updates_before = self._updates() - self.step

    def on_train_batch_end(self, batch, logs=None):
        self._consumed += 1
        micro = self._micro = self._offset + batch + 1
        if self._cut and micro >= self.steps_per_epoch:
            self.model.stop_training = True  # The rest of the epoch ran.
        if not self.every or not self._at_update_boundary():
            return
        self.step += 1
        if self.step % self.every == 0 and micro < self.steps_per_epoch:
            self._save(micro)

    def _metrics_variables(self, saved):
        """The model's metric variables, its compiled metrics built first
        where fewer than the `saved` exist (TensorFlow builds them in the
        first step; the values they take here are assigned over)."""
        model = self.model
        outputs = getattr(model, "outputs", None)
        if len(model.metrics_variables) < saved and outputs:
            y = keras.ops.zeros((1, *outputs[0].shape[1:]))
            model.compute_metrics(None, y, y, None)
        return model.metrics_variables

    def at_update_boundary(self):
        """Whether the last batch ended an update (no gradients are half
        accumulated)."""
        return self._at_update_boundary()

    def save_now(self):
        """At an update boundary: saves a checkpoint at this step, unless
        it is the epoch's last (its backup follows); whether it saved."""
        if self._micro >= self.steps_per_epoch:
            return False
        if not self.every:
            self.step = (self._micro if self._updates_before is None
                         else self._updates() - self._updates_before)
        self._save(self._micro)
        return True

    def on_epoch_end(self, epoch, logs=None):
        if self._cut:
            self.model.stop_training = False
            self._cut = False
        self.restore = None
        # Kept until the next one is written: the epoch's backup (an
        # earlier callback) is newer, but may turn out damaged.

    def on_train_end(self, logs=None):
        self._remove_weights()  # The run is done, its backup whole.

    def _per_update(self):
        """Whether an update takes several micro-batches (or may: the
        adaptive batch)."""
        if self.adaptive is not None:
            return True
        from keras_largebatch import noise_scale

        optimizer = noise_scale.accumulating_optimizer(self.model.optimizer)
        return (optimizer.gradient_accumulation_steps or 1) > 1

    def _updates(self):
        """The updates the optimizer has taken (one read)."""
        if self.adaptive is not None:
            return int(keras.ops.convert_to_numpy(self.adaptive.state.updates))
        from keras_largebatch import noise_scale

        optimizer = noise_scale.accumulating_optimizer(self.model.optimizer)
        return int(keras.ops.convert_to_numpy(
            optimizer._iterations)) // optimizer.gradient_accumulation_steps

    def _accumulation(self):
        if self.adaptive is not None:
            return self.adaptive.accumulation_steps
        from keras_largebatch import noise_scale

        optimizer = noise_scale.accumulating_optimizer(self.model.optimizer)
        return optimizer.gradient_accumulation_steps or 1

    def _at_update_boundary(self):
        k = self._accumulation()
        if k == 1:
            return True
        from keras_largebatch import noise_scale

        # Keras counts micro-batches; `self.model` syncs JAX's state first.
        counter = noise_scale.accumulating_optimizer(
            self.model.optimizer)._iterations
        return int(keras.ops.convert_to_numpy(counter)) % k == 0

    def _save(self, micro):
        model = self.model
        os.makedirs(self.save_dir, exist_ok=True)
        name = layout.WEIGHTS.format(self._epoch + 1, self.step)
        written = files.save(model, os.path.join(self.save_dir, name))
        data = {}
        if self.data is not None:
            data = {"grain_state": self.data.state_at(self._consumed),
                    "start_epoch": self.data.start_epoch}
        pending = (self.adaptive.state.pending_accumulation_steps
                   if self.adaptive is not None else None)
        if self.residuals is not None:
            self.residuals.save_within(
                layout.RESIDUALS_WITHIN.format(self._epoch + 1, self.step))
            if self.barrier is not None:  # None: this process alone.
                self.barrier()
        files.save_json(os.path.join(self.save_dir, layout.POINTER), {
            "epoch": self._epoch, "step": self.step, "micro_batches": micro,
            "data": data, "pending_accumulation_steps": pending,
            "seed_states": [s.numpy().tolist()
                            for s in backup.seed_states(model)],
            "metrics": [np.asarray(v.numpy()).tolist()
                        for v in model.metrics_variables],
            "weights": name,
            "written": written,
        })
        self._remove_weights(keep=name)

    def _remove_weights(self, keep=None):
        if not os.path.isdir(self.save_dir):
            return
        for name in os.listdir(self.save_dir):
            if layout.WEIGHTS_RE.fullmatch(name) and name != keep:
                os.remove(os.path.join(self.save_dir, name))
