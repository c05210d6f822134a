import collections
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys

import keras
import pytest


def small_model(model_name, image_size, num_classes, bn_momentum=None,
                channels=3, *args, **kwargs):
    """A 1.5 k-parameter stand-in for `recipe.models.build_model` (fast tests).

    Convolution, batch norm, dropout and a classifier: every kind of state
    the real models have (moving statistics, a dropout seed).
    """
    inputs = keras.Input((image_size, image_size, channels))
    x = keras.layers.Conv2D(8, 3, strides=4, name="conv1")(inputs)
    x = keras.layers.BatchNormalization(momentum=bn_momentum or 0.9,
                                        name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.25, name="dropout")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax",
                                 name="predictions")(x)
    return keras.Model(inputs, outputs, name=model_name)


@pytest.fixture
def small(monkeypatch):
    """keras-largebatch-train builds `small_model` instead of the real one."""
    from keras_largebatch.train.recipe import models

    monkeypatch.setattr(models, "build_model", small_model)


# Runs of the tests' command (`small_command.py`) made once per test
# session and shared by every test, file and pytest worker that asks for the
# same one (the `command_runs` fixture): the same backend, arguments and
# kill point give the same run folder (`--deterministic`), so one process
# start and one first trace serve them all. The runs live beside the
# session's temporary folders (the base that pytest-xdist's workers share),
# each made under a file lock by the first test that needs it; a run that
# did not end as asked is not kept, so each test that asks sees its failure.

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "small_command.py")  # KILL_AT_EPOCH_STEP ends it
KILLED = 9  # kill_switch's exit code

Run = collections.namedtuple("Run", "model_dir code log")


def _base(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # Under pytest-xdist each worker's base is a folder of the session's.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "command_runs"
    folder.mkdir(exist_ok=True)
    return folder


def run_command(model_dir, args, kill=None, backend=None, timeout=300):
    """The command in a subprocess: (exit code, stdout + stderr)."""
    env = dict(os.environ, KERAS_BACKEND=backend or keras.backend.backend())
    env.pop("KILL_AT_EPOCH_STEP", None)
    if kill:
        env["KILL_AT_EPOCH_STEP"] = kill
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args, f"--model_dir={model_dir}"],
        env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def _shared_run(tmp_path_factory, args, kill=None, backend=None):
    """The run of `args` (killed after `kill`, 'EPOCH,STEP', if given) on
    `backend` (default the suite's), made once a session: a `Run` whose
    `model_dir` no test may change (`copy_run` gives one to change)."""
    backend = backend or keras.backend.backend()
    key = hashlib.sha256(json.dumps(
        [backend, list(args), kill]).encode()).hexdigest()[:16]
    folder = _base(tmp_path_factory) / key
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "done.json"
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            code, log = run_command(folder / "run", args, kill, backend)
            if code != (KILLED if kill else 0):
                shutil.rmtree(folder, ignore_errors=True)
                return Run(None, code, log)
            done.write_text(json.dumps(dict(code=code, log=log)))
        found = json.loads(done.read_text())
    return Run(folder / "run", found["code"], found["log"])


def copy_run(run, destination):
    """A copy of `run`'s folder at `destination`, for a test to change."""
    assert run.model_dir is not None, run.log[-3000:]
    shutil.copytree(run.model_dir, destination, symlinks=True)
    return destination


class CommandRuns:
    """`get(args, kill=None, backend=None)`: the shared `Run`;
    `copy(run, destination)`: its folder copied, for a test to change;
    `run(model_dir, args, kill=None)`: a run of its own, (code, log)."""

    def __init__(self, tmp_path_factory):
        self._factory = tmp_path_factory

    def get(self, args, kill=None, backend=None):
        return _shared_run(self._factory, args, kill, backend)

    copy = staticmethod(copy_run)
    run = staticmethod(run_command)


@pytest.fixture(scope="session")
def command_runs(tmp_path_factory):
    """The session's shared runs of the tests' command (`CommandRuns`)."""
    return CommandRuns(tmp_path_factory)
