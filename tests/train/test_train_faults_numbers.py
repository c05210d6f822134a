"""keras-largebatch-train on bad numbers and a missing backend: non-finite
flags, a diverging run, a skipped fp16 overflow, `--help` and the backend
check before Keras is imported (issue #52, items 4 and 5)."""

import glob
import io
import os
import re
import subprocess
import sys
import tomllib
import zipfile

import h5py
import keras
import numpy as np
import pytest

from keras_largebatch import LARSMixed
from keras_largebatch import _backend
from keras_largebatch.train import PROG
from keras_largebatch.train import cli
from keras_largebatch.train.run import divergence
from keras_largebatch.train import config as flags
from keras_largebatch.train.run import driver as train_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
FLOATS = [f.name for f in flags.TABLE if f.kind == "float"]


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", FLOATS)
def test_every_float_flag_refuses_a_non_finite_value_naming_it(
        name, tmp_path, capsys):
    for value in ("nan", "inf", "-inf"):
        code = train_main.main([PROG, f"--{name}={value}",
                                f"--model_dir={tmp_path}/run"])
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1, err
        assert f"`{name}` must be a finite float" in err, err
        assert f"{name}={value}" in err, err
        assert not os.path.exists(tmp_path / "run")


def _float_arrays(path):
    """The float arrays of a `.weights.h5` or `.keras` file."""
    if path.endswith(".keras"):
        with zipfile.ZipFile(path) as z:
            path = io.BytesIO(z.read("model.weights.h5"))
    found = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _, x: found.append(x[()]) if isinstance(
            x, h5py.Dataset) and x.dtype.kind == "f" else None)
    return found


def test_a_diverging_run_exits_3_with_one_line_and_keeps_finite_checkpoints(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    code = train_main.main([
        PROG, f"--model_dir={model_dir}", "--optimizer=sgd",
        "--base_learning_rate=1e8", "--global_batch_size=16",
        "--steps_per_epoch=4", "--epochs=4", "--verbose=0"])
    err = capsys.readouterr().err
    assert code == divergence.EXIT_CODE == 3, err
    # Its one line, last (tensorboardX may have warned of an inf val_loss).
    ours = [x for x in err.splitlines() if x.startswith(PROG)]
    assert ours == err.splitlines()[-1:], err
    line = ours[0]
    assert re.match(f"{PROG}: error: The run diverged at (the end of )?"
                    "epoch [2-4]", line), line
    for part in ("step ", "learning rate ", "not finite",
                 "--base_learning_rate", "--warmup_epochs"):
        assert part in line, line
    assert "loss scale" not in line  # sgd scales no loss.
    # Epoch 1 ends finite at this rate, and a later one diverges: its
    # checkpoint and backup stay, with finite weights.
    saved = [p for p in glob.glob(f"{model_dir}/**/*", recursive=True)
             if p.endswith((".weights.h5", ".keras"))]
    assert os.path.join(model_dir, "checkpoints",
                        "epoch_001.weights.h5") in saved, saved
    assert any("backup" in p for p in saved), saved
    assert not (model_dir / "final.keras").exists()
    for path in saved:
        assert all(np.isfinite(a).all() for a in _float_arrays(path)), path


def _dense_model():
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="logits", dtype="float32")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture
def float16_policy():
    before = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    yield
    keras.mixed_precision.set_dtype_policy(before)


def test_an_fp16_overflow_the_loss_scale_skips_is_not_divergence(
        float16_policy):
    model = _dense_model()
    model.compile(LARSMixed(learning_rate=0.1, initial_scale=2.0**15),
                  keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    x[:8] = 1e6  # Above float16's largest: the first batch's loss is inf.
    y = np.arange(32) % 2
    stop = divergence.StopOnDivergence()
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                        callbacks=[stop], verbose=0)
    assert not np.isfinite(history.history["loss"][0])
    assert divergence.nonfinite_variables(model) == []
    scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
    assert scale == 2.0**14  # The overflowed step was skipped.

    kernel = model.get_layer("hidden").kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    stop.on_train_batch_end(3, {"loss": float("nan")})  # Read one late:
    with pytest.raises(divergence.Diverged) as raised:
        stop.on_train_batch_end(4, {"loss": float("nan")})
    line = str(raised.value)
    assert "\n" not in line and kernel.path in line
    assert "epoch 1, batch 4" in line and "loss scale 16384" in line


def test_nonfinite_variables_reads_the_optimizer_but_not_the_loss_scale(
        float16_policy):
    model = _dense_model()
    optimizer = LARSMixed(learning_rate=0.1)
    model.compile(optimizer, "mse")
    optimizer.build(model.trainable_variables)
    optimizer.dynamic_scale.assign(np.inf)
    assert divergence.nonfinite_variables(model) == []
    state = next(v for v in optimizer.variables
                 if keras.backend.is_float_dtype(v.dtype)
                 and tuple(v.shape) == (4, 8))
    state.assign(np.full((4, 8), np.nan, "float32"))
    assert divergence.nonfinite_variables(model) == [state.path]


def test_the_divergence_check_runs_before_every_callback(tmp_path):
    import types

    from keras_largebatch.train.run import callbacks as fit_callbacks
    from keras_largebatch.train.outputs import callbacks

    config = flags.parse([PROG, f"--model_dir={tmp_path}"])
    inputs = types.SimpleNamespace(step_batch=32, steps_per_epoch=4,
                                   train=None, validation=None)
    found = fit_callbacks.callbacks(
        config.runtime, config.adaptive, config.evaluation, inputs,
        callbacks.Throughput(32), str(tmp_path), gradient_accumulation_steps=1)
    assert isinstance(found[0], divergence.StopOnDivergence)
    assert not any(isinstance(c, divergence.StopOnDivergence)
                   for c in found[1:])


# --help and the backend, before Keras: what `keras-largebatch-train` runs.
@pytest.mark.backend_independent
def test_console_script_is_the_entry_that_needs_no_keras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts[PROG] == "keras_largebatch.train.cli:run"
    for module in (cli, _backend):
        with open(module.__file__) as f:
            source = f.read()
        assert "import keras\n" not in source, module
        assert "from keras " not in source, module


@pytest.mark.backend_independent
def test_help_needs_no_backend(monkeypatch, capsys):
    monkeypatch.setattr(_backend, "_installed", lambda name: False)
    assert cli.main([PROG, "--help"]) == 0
    assert capsys.readouterr().out == flags.help_text(PROG) + "\n"


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    """KERAS_BACKEND unset, no keras.json."""
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))


@pytest.mark.backend_independent
def test_default_backend_missing_exits_2_naming_the_installed_ones(
        no_config, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_backend, "_installed",
                        lambda name: name != "tensorflow")
    assert cli.main([PROG, f"--model_dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{PROG}: error: Keras' backend 'tensorflow' "
                          "(Keras' default: KERAS_BACKEND is not set) is not "
                          "installed; installed: jax, torch. Choose one with "
                          "KERAS_BACKEND=jax"), err
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.backend_independent
def test_the_backend_is_read_as_keras_reads_it(no_config, monkeypatch,
                                              tmp_path):
    assert _backend.chosen()[0] == "tensorflow"
    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text('{"backend": "torch"}')
    assert _backend.chosen() == ("torch", str(home / "keras.json"))
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert _backend.chosen() == ("jax", "KERAS_BACKEND")
    monkeypatch.setattr(_backend, "_installed", lambda name: False)
    assert "nor is any other" in _backend.missing()


# Whether or not they are installed, the command's process cannot import
# TensorFlow (or any backend with BLOCK=all), as when it is not installed.
_WITHOUT = """
import os, sys
for name in ["tensorflow"] + (["jax", "torch"] if os.environ["BLOCK"] == "all"
                              else []):
    sys.modules[name] = None
from keras_largebatch.train.cli import run
run()
"""


def _without_backend(tmp_path, *args, block="tensorflow"):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    env.update(HOME=str(tmp_path / "home"), BLOCK=block)
    (tmp_path / "home").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", _WITHOUT, *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.backend_independent
def test_help_works_with_no_backend_installed_or_chosen(tmp_path):
    proc = _without_backend(tmp_path, "--help", block="all")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == flags.help_text(PROG) + "\n"


@pytest.mark.backend_independent
def test_without_tensorflow_or_keras_backend_a_run_exits_2_in_one_line(
        tmp_path):
    proc = _without_backend(tmp_path, f"--model_dir={tmp_path}/run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "'tensorflow'" in proc.stderr and "KERAS_BACKEND=" in proc.stderr
    assert not os.path.exists(tmp_path / "run")
