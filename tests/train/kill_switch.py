"""The kill switch of the tests' command scripts (`small_command.py`,
`ddp_command.py`), set by environment variables; `install()` arms it.

    KILL_AT_EPOCH_STEP=E,S   end the process (`os._exit(9)`, as a kill
                             would) after step S of epoch E (both from 0)
    KILL_AT_POINT=NAME[,E]   end it the same way right after the write NAME
                             (of epoch E, from 0; without E, the first)
    TERM_AT_EPOCH_STEP=E,S   send SIGTERM after step S of epoch E, as a
                             scheduler preempting the process it started
                             does: to this one, or to its supervisor (a
                             process of a several-process JAX job)

The write points (`POINTS`), in the order a run writes them:

    within_epoch_weights  a checkpoint within an epoch: its weights file
    within_epoch_pointer  ... and then within_epoch.json naming it
    history_row           the epoch's row of history.csv
    eval_row              the epoch's end row of evals.csv
    epoch_checkpoint      checkpoints/epoch_NNN.weights.h5
    backup_weights        the epoch backup's staged weights file
    backup_metadata       ... and then training_metadata.json naming it
    final_model           the final model (epoch_NNN.keras, final.keras)
    summary               summary.json
"""

import os
import re
import signal

import keras

from keras_largebatch.train.run.processes.supervisor import SUPERVISED

POINTS = ("within_epoch_weights", "within_epoch_pointer", "history_row",
          "eval_row", "epoch_checkpoint", "backup_weights", "backup_metadata",
          "final_model", "summary")

_epoch = [0]  # The epoch `fit` is in, from 0.


def install():
    """Arms the switches whose variables are set."""
    ours = []
    if os.environ.get("KILL_AT_EPOCH_STEP"):
        at = tuple(map(int, os.environ["KILL_AT_EPOCH_STEP"].split(",")))
        ours.append(_AtStep(at, lambda: os._exit(9)))
    if os.environ.get("TERM_AT_EPOCH_STEP"):
        at = tuple(map(int, os.environ["TERM_AT_EPOCH_STEP"].split(",")))
        started = (os.getppid() if os.environ.get(SUPERVISED)
                   else os.getpid())
        ours.append(_AtStep(at, lambda: os.kill(started, signal.SIGTERM)))
    if os.environ.get("KILL_AT_POINT"):
        name, *epoch = os.environ["KILL_AT_POINT"].split(",")
        _wrap_point(name, int(epoch[0]) if epoch else None)
        ours.append(_AtStep(None, None))  # Tracks the epoch.
    if not ours:
        return
    fit = keras.Model.fit
    keras.Model.fit = lambda self, *a, callbacks=(), **k: fit(
        self, *a, callbacks=[*callbacks, *ours], **k)


class _AtStep(keras.callbacks.Callback):
    """Calls `act()` after step `at[1]` of epoch `at[0]`; records the
    epoch."""

    def __init__(self, at, act):
        super().__init__()
        self.at, self.act = at, act

    def on_epoch_begin(self, epoch, logs=None):
        _epoch[0] = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.at == (_epoch[0], batch):
            self.act()


def _wrap_point(name, epoch):
    """Makes the writer of the point `name` end the process right after
    it writes, in epoch `epoch` (None: the first time)."""
    from keras_largebatch.train import checkpointing
    from keras_largebatch.train import layout
    from keras_largebatch.train.checkpointing import files
    from keras_largebatch.train.outputs import callbacks
    from keras_largebatch.train.outputs import report

    epoch_weights = re.compile(r"epoch_\d+\.weights\.h5").fullmatch
    # point: (owner, function, the argument naming the file, its test)
    writers = {
        "within_epoch_weights": (files, "save", 1,
                                 layout.WEIGHTS_RE.fullmatch),
        "within_epoch_pointer": (files, "save_json", 0, layout.POINTER.__eq__),
        "history_row": (keras.callbacks.CSVLogger, "on_epoch_end", 0, None),
        "eval_row": (callbacks.WithinEpochEvals, "on_epoch_end", 0, None),
        "epoch_checkpoint": (files, "save", 1, epoch_weights),
        "backup_weights": (files, "save", 1, layout.STAGED_RE.fullmatch),
        "backup_metadata": (files, "save_json", 0,
                            layout.BACKUP_METADATA.__eq__),
        "final_model": (checkpointing, "save_final", 0, None),
        "summary": (report, "write_json", 0, "summary.json".__eq__),
    }
    if name not in writers:
        raise ValueError(f"KILL_AT_POINT: no point {name!r}; one of "
                         f"{', '.join(POINTS)}")
    owner, function, argument, test = writers[name]
    real = getattr(owner, function)

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        if (test is None or test(os.path.basename(str(args[argument])))) \
                and epoch in (None, _epoch[0]):
            os._exit(9)
        return result

    setattr(owner, function, wrapped)
