"""A run whose loss or weights turn non-finite stops there, its last finite
checkpoints kept.

`StopOnDivergence` is the first callback of `fit` (`run.callbacks`),
so it sees each batch's and each epoch's end before any callback that
saves. It reads the weights only where they may have gone bad, as

```python
batch end:  if not isfinite(the previous batch's loss): check(weights)
epoch end:  the same for its last batch; check(weights)
check:      raise Diverged(line) if any weight is NaN or inf
```

A loss-scaled step whose float16 values overflowed (`LARSMixed`,
`LAMBMixed`) is skipped and leaves the weights finite: where its logged
loss is non-finite, the check finds them finite and the run goes on.
Keras' logged loss is the epoch's running mean, non-finite for the rest
of the epoch once one step's was, so the weights are then read at each
batch's end of that epoch.

The weights are the model's float variables and its optimizer's (momenta,
the float32 masters of a mixed optimizer), not the loss scale
(`checkpointing.files.nonfinite_variables`, which every checkpoint's save
calls first, raising `Diverged` where it is not empty). The driver
(`driver.py`) prints the `Diverged` line and exits with `EXIT_CODE` (3).
"""

import math

import keras
from keras import ops

# Defined with the checkpoints, which refuse to save non-finite weights.
from keras_largebatch.train.checkpointing.files import Diverged
from keras_largebatch.train.checkpointing.files import loss_scales
from keras_largebatch.train.checkpointing.files import nonfinite_variables

EXIT_CODE = 3


def describe(model, names, where, loss=None):
    """The one line of a divergence found `where` (e.g. "epoch 2, batch
    7") in `names` (`nonfinite_variables`): the optimizer's step, the rate in
    effect, the loss scale of a mixed optimizer, and what to try."""
    optimizer = model.optimizer
    parts = [f"step {int(ops.convert_to_numpy(optimizer.iterations))}",
             "learning rate "
             f"{float(ops.convert_to_numpy(optimizer.learning_rate)):.6g}"]
    scale = _loss_scale(optimizer)
    if scale is not None:
        parts.append(f"loss scale {scale:g}")
    shown = ", ".join(names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else "")
    loss = "" if loss is None else f"the loss is {loss:g} and "
    return (f"The run diverged at {where} ({', '.join(parts)}): {loss}"
            f"{len(names)} weight(s) are not finite ({shown}). The last "
            "finite checkpoints are kept; try a lower --base_learning_rate "
            "or a longer --warmup_epochs.")


class StopOnDivergence(keras.callbacks.Callback):
    """Raises `Diverged` where the weights turn non-finite: read after a
    batch whose logged loss is non-finite, and after each epoch.

    Each batch's loss is read at the next batch's end (the epoch's last at
    the epoch's end), so that the host never waits for the step it has
    just dispatched. Place it first in `fit`'s callbacks, so that it runs
    before any that saves (Keras calls them in order; on a raise it skips
    `on_train_end`, so `BackupAndRestore` keeps its last backup). A run
    resumed within an epoch (`resumed_at`, a `within_epoch.Position`)
    counts that epoch's batches from its start, not from where it resumed.
    """

    def __init__(self, resumed_at=None):
        super().__init__()
        self._epoch = 0
        self._pending = None
        self._resumed_at = resumed_at
        self._offset = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._pending = None
        at = self._resumed_at
        self._offset = (at.micro_batches
                        if at is not None and at.epoch == epoch else 0)

    def on_train_batch_end(self, batch, logs=None):
        self._check_pending()
        loss = (logs or {}).get("loss")
        self._pending = (None if loss is None
                         else (batch + self._offset, loss))

    def on_epoch_end(self, epoch, logs=None):
        self._check_pending()
        loss = (logs or {}).get("loss")
        self._stop_if_diverged(f"the end of epoch {epoch + 1}",
                    None if loss is None else _float(loss))

    def _check_pending(self):
        if self._pending is None:
            return
        batch, loss = self._pending
        self._pending = None
        loss = _float(loss)
        if not math.isfinite(loss):
            self._stop_if_diverged(
                f"epoch {self._epoch + 1}, batch {batch + 1}", loss)

    def _stop_if_diverged(self, where, loss):
        model = self.model  # On JAX, reading it syncs the state.
        names = nonfinite_variables(model)
        if names:
            raise Diverged(describe(model, names, where, loss))


def _float(value):
    return float(ops.convert_to_numpy(value))


def _loss_scale(optimizer):
    """The dynamic loss scale of a loss-scaling optimizer in the chain
    (`LARSMixed`, `LAMBMixed`), else None."""
    scales = loss_scales(optimizer)
    return float(ops.convert_to_numpy(scales[0])) if scales else None
