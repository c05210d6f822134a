"""The kill switch of the tests' command scripts (`small_command.py`,
`ddp_command.py`): with `KILL_AT_EPOCH_STEP=E,S` in the environment,
`install()` makes `fit` end the process (`os._exit(9)`, as a kill would)
after step S of epoch E (both from 0)."""

import os

import keras


def install():
    """Adds the kill callback to every `fit`, where the variable is set."""
    if not os.environ.get("KILL_AT_EPOCH_STEP"):
        return
    epoch_at, step_at = map(int, os.environ["KILL_AT_EPOCH_STEP"].split(","))

    class Kill(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) == (epoch_at, step_at):
                os._exit(9)

    fit = keras.Model.fit
    keras.Model.fit = lambda self, *a, callbacks=(), **k: fit(
        self, *a, callbacks=[*callbacks, Kill()], **k)
