"""`keras-largebatch-train` building conftest's `small_model`, for tests that
run the command in subprocesses:

    python tests/train/small_command.py --model_dir D ...

With `KILL_AT_EPOCH_STEP=E,S` the process ends (`os._exit(9)`, as a kill
would) after step S of epoch E (both from 0).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
from conftest import small_model  # noqa: E402

from keras_largebatch.train import main  # noqa: E402
from keras_largebatch.train import recipe  # noqa: E402

recipe.build_model = small_model
if os.environ.get("KILL_AT_EPOCH_STEP"):
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

if __name__ == "__main__":
    main.run()
