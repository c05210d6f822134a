"""The callbacks that report a run while it trains: images per second
(`Throughput`), history.csv (`HistoryCSV`), validation within epochs
(`WithinEpochEvals`, evals.csv), TensorBoard scalars (`tensorboard`,
`EpochTensorBoard`, `EpochScalars`) and, under torch, the seeding of each
step (`step_randomness`)."""

import csv
import os
import time

import keras
import numpy as np

from keras_largebatch._shared import atomic_path
from keras_largebatch.train import PROG
from keras_largebatch.train import layout


class Throughput(keras.callbacks.Callback):
    """Images per second: the images the training steps processed after
    compilation.

        images_per_sec = sum(steps_e * global_batch_size) / sum(seconds_e)

    over every epoch of this process, each timed to its last training step
    (validation is not counted): the first from the end of this process's
    first step, which compiles (a resumed run compiles again) and is not
    counted, the others from their start. Every step counts a full global
    batch, also when `--steps_per_epoch` repeats the data. Each epoch's
    rate goes into the logs as `images_per_sec` (CSV and TensorBoard).
    A process that ran one step times nothing (`images_per_sec` None).
    """

    def __init__(self, global_batch_size):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.epoch_times = []
        self.epoch_steps = []
        self._compiled = False

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._last = self._start
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._last = time.perf_counter()
        if not self._compiled:  # The step that compiled: not timed.
            self._compiled = True
            self._start = self._last
            return
        self._steps += 1

    def exclude(self, seconds):
        """Takes `seconds` spent on other work (an evaluation within the
        epoch) out of this epoch's time."""
        self._start += seconds

    def on_epoch_end(self, epoch, logs=None):
        seconds = self._last - self._start
        self.epoch_times.append(seconds)
        self.epoch_steps.append(self._steps)
        if logs is not None and seconds > 0 and self._steps:
            logs["images_per_sec"] = (
                self._steps * self.global_batch_size / seconds)

    def timed(self):
        """(images, seconds) over the steps timed."""
        return (sum(self.epoch_steps) * self.global_batch_size,
                sum(self.epoch_times))

    def images_per_sec(self):
        images, seconds = self.timed()
        return images / seconds if seconds > 0 and images else None


class WithinEpochEvals(keras.callbacks.Callback):
    """Evaluates `per_epoch - 1` times within each epoch, evenly spaced in
    its training batches, and writes `evals.csv`: one row per evaluation
    and one at each epoch's end (fit's own validation), with

        epoch        the fraction of epochs done (1.25: a quarter into the
                     second epoch)
        updates      optimizer updates taken so far: micro-batches divided
                     by the micro-batches per update in effect (which
                     `accumulation()` returns; it changes when the batch
                     grows)
        val_loss, val_accuracy

    so that the updates to a target accuracy can be read at a finer grain
    than an epoch. The training metrics of the epoch are saved before each
    evaluation and put back after it (Keras shares the metric objects), and
    the evaluation's time is taken out of `throughput`'s epoch time. A
    resumed run drops the rows past the point it resumes from (`resumed`,
    a `checkpointing.within_epoch.Position` within an epoch, or else the
    start of its first epoch) and counts the updates from there: `taken()`,
    the updates of the restored optimizer (the adaptive batch's), or else
    the micro-batches before that point divided by `accumulation()`; not
    from the rows kept, which a kill or another `per_epoch` may have left
    short. With `path` None it evaluates and writes nothing (a JAX process
    other than the chief: evaluation is collective).
    """

    COLUMNS = ("epoch", "updates", "val_loss", "val_accuracy")

    def __init__(self, validation, per_epoch, path, accumulation,
                 throughput=None, resumed=None, taken=None):
        super().__init__()
        self.validation = validation
        self.per_epoch = per_epoch
        self.path = path
        self.accumulation = accumulation
        self.throughput = throughput
        self.resumed = resumed
        self.taken = taken
        self._updates = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        steps = self.params.get("steps")
        self._at = {} if not steps else {
            round(j * steps / self.per_epoch): j / self.per_epoch
            for j in range(1, self.per_epoch)}
        self._batches = 0
        if self._updates is None:  # This `fit`'s first epoch.
            at = self.resumed
            if at is not None and at.epoch == epoch:
                self._batches = at.micro_batches
            self._updates = self._resume(epoch, self._batches, steps)

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        self._updates += 1.0 / self.accumulation()
        fraction = self._at.get(self._batches)
        if fraction is None or fraction >= 1:
            return
        start = time.perf_counter()
        model = self.model
        if hasattr(model, "jax_state_sync"):
            model.jax_state_sync()
        saved = [v.numpy() for v in model.metrics_variables]
        result = model.evaluate(self.validation, verbose=0, return_dict=True)
        for v, value in zip(model.metrics_variables, saved):
            v.assign(value)
        self._write(self._epoch + fraction, {
            "val_" + name: value for name, value in result.items()})
        if self.throughput is not None:
            self.throughput.exclude(time.perf_counter() - start)

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_accuracy" in logs:
            self._write(epoch + 1, logs)

    def _write(self, epoch, values):
        if not self.path:
            return
        new = not os.path.exists(self.path)
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(self.COLUMNS)
            writer.writerow([f"{epoch:.6g}", f"{self._updates:.6g}",
                             float(values["val_loss"]),
                             float(values["val_accuracy"])])

    def _resume(self, epoch, micro, steps):
        """The updates taken `micro` micro-batches into epoch `epoch` (of
        `steps`), where this `fit` starts; the rows written after that
        point dropped."""
        if self.path and os.path.exists(self.path):
            def before(row):  # Written at micro-batch `at * steps`.
                at = float(row["epoch"]) - epoch
                return at <= 0 or (at < 1 and steps is not None
                                   and at * steps < micro + 0.5)

            with open(self.path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if before(r)]
            with atomic_path(self.path) as tmp, open(
                    tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, self.COLUMNS)
                writer.writeheader()
                writer.writerows(rows)
        if self.taken is not None:
            return float(self.taken())
        return (epoch * (steps or 0) + micro) / self.accumulation()


class HistoryCSV(keras.callbacks.CSVLogger):
    """Keras' `CSVLogger` appending to history.csv under the columns of the
    header it has: an epoch whose logs lack one (`images_per_sec` where a
    run resumed at an epoch's last step timed nothing) gets `NA` there,
    not a row shifted under the header."""

    def __init__(self, filename):
        super().__init__(filename, append=True)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if not self.append_header:
            with open(self.filename, newline="") as f:
                header = next(csv.reader(f), [])
            self.keys = header[1:] or None


def tensorboard(log_dir):
    """`EpochTensorBoard`, or None with a notice where tensorboardX is
    missing."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        print(f"{PROG}: no TensorBoard logs (`pip install "
              "tensorboardX` for them); history.csv has every epoch's "
              "values")
        return None
    return EpochTensorBoard(log_dir)


class EpochTensorBoard(keras.callbacks.Callback):
    """Each epoch's logs as TensorBoard scalars, on every backend.

    The scalars Keras' `TensorBoard` writes for epochs: `log_dir/train` and
    `log_dir/validation` (the `val_` values), tags `epoch_<name>`, step
    the epoch, written with tensorboardX; each epoch's into event files of
    its own (`layout.TENSORBOARD_EPOCH`), so that a resumed run that
    replays an epoch first deletes that epoch's (`checkpointing.tidy`)
    and TensorBoard shows each epoch once.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir

    def on_epoch_end(self, epoch, logs=None):
        from tensorboardX import SummaryWriter

        train, validation = layout.TENSORBOARD_SPLITS
        splits = {}
        for key, value in (logs or {}).items():
            split = validation if key.startswith("val_") else train
            name = key[4:] if split == validation else key
            splits.setdefault(split, []).append((f"epoch_{name}", value))
        for split, scalars in splits.items():
            with SummaryWriter(
                    os.path.join(self.log_dir, split),
                    filename_suffix=layout.TENSORBOARD_EPOCH.format(
                        epoch + 1)) as writer:
                for tag, value in scalars:
                    writer.add_scalar(tag, float(value), epoch)


class EpochScalars(keras.callbacks.Callback):
    """Adds `learning_rate` and `loss_scale` to each epoch's logs.

    The rate is the schedule's at the optimizer's step; the loss scale is
    the dynamic scale of a loss-scaling optimizer, 1 without one.
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = self.model.optimizer
        logs["learning_rate"] = float(
            keras.ops.convert_to_numpy(optimizer.learning_rate))
        scale = getattr(optimizer, "dynamic_scale", None)
        logs["loss_scale"] = float(
            keras.ops.convert_to_numpy(scale)) if scale is not None else 1.0


def step_randomness(seed, within_epoch=None):
    """A callback that reseeds torch's global generator before each step.

    Under torch, Keras' `Dropout` without a seed of its own draws from
    torch's global generator, which no checkpoint holds (and which the
    first epoch of a process consumes differently); seeding it from
    `(seed, epoch, step)` makes a replayed epoch draw what the original
    drew. (Layers' own `SeedGenerator` states travel in the backup.) A run
    resumed `within_epoch` (a `checkpointing.within_epoch.Position`) counts that
    epoch's steps from where it resumed.
    """
    class StepRandomness(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if keras.backend.backend() == "torch":
                import torch

                if within_epoch and self.epoch == within_epoch.epoch:
                    batch += within_epoch.micro_batches
                words = np.random.SeedSequence(
                    [seed, self.epoch, batch]).generate_state(2)
                torch.manual_seed(int(words[0]) << 32 | int(words[1]))

    return StepRandomness()
