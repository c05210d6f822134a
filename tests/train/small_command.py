"""`keras-largebatch-train` building conftest's `small_model`, for tests that
run the command in subprocesses:

    python tests/train/small_command.py --model_dir D ...

With `KILL_AT_EPOCH_STEP=E,S` the process ends (`os._exit(9)`, as a kill
would) after step S of epoch E (both from 0); `KILL_AT_POINT` ends it
after a named write, `TERM_AT_EPOCH_STEP` sends it SIGTERM
(`kill_switch.py`).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import small_model  # noqa: E402
import kill_switch  # noqa: E402

from keras_largebatch.train import cli  # noqa: E402
from keras_largebatch.train.recipe import models  # noqa: E402

models.build_model = small_model
kill_switch.install()

if __name__ == "__main__":
    cli.run()
