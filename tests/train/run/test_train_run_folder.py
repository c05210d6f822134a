"""One writer per run folder, and one line for the faults around a run
(issue #61): a second run on a busy `--model_dir`, Ctrl-C, a damaged
run_config.json, an unknown backend, a disk too small for a checkpoint,
`--mode=eval`'s warning, the banner."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
import warnings

import keras
import numpy as np
import pytest

from keras_largebatch.train import PROG
from keras_largebatch.train.run import divergence
from keras_largebatch.train.run import driver as train_main
from keras_largebatch.train.checkpointing import lock

# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = os.path.join(HERE, "small_command.py")
# digits (1,437 training images) in batches of 16, a small model: fast.
SHORT = ["--global_batch_size=16", "--verbose=0", "--warmup_epochs=0"]


def _run(*args):
    return train_main.main([PROG, *args])


def _ours(err):
    return [line for line in err.splitlines() if line.startswith(PROG)]


# synthetic: 448 training and 64 validation images, 2 steps an epoch.
LONG = ["--dataset=synthetic", "--num_classes=3", "--image_size=67",
        "--augment=none", "--global_batch_size=16", "--steps_per_epoch=2",
        "--verbose=0", "--warmup_epochs=0", "--epochs=40"]


def _start(model_dir, *args):
    """The command in a subprocess, training long enough to be caught."""
    return subprocess.Popen(
        [sys.executable, COMMAND, f"--model_dir={model_dir}", *LONG, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, proc, timeout=300):
    """Waits until the running `proc` has written `path` (its first
    epoch's end: history.csv, or the backup)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.2)


@pytest.mark.backend_independent
def test_a_second_run_on_a_busy_model_dir_exits_2_naming_the_holder(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    first = _start(model_dir, "--seed=0")
    try:
        _wait_for(model_dir / "history.csv", first)
        config = (model_dir / "run_config.json").read_bytes()
        history = (model_dir / "history.csv").read_bytes()
        capsys.readouterr()
        assert _run(*LONG, f"--model_dir={model_dir}", "--seed=1") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"{PROG}: error: `model_dir` is in use by "
                              f"another run (pid {first.pid} on "
                              f"{socket.gethostname()}, started "), err
        assert f"model_dir={str(model_dir)!r}" in err, err
        # Nothing of the first run was touched: its flags, its rows.
        assert (model_dir / "run_config.json").read_bytes() == config
        assert (model_dir / "history.csv").read_bytes().startswith(history)
        assert first.poll() is None  # Still training.
    finally:
        first.kill()
        first.communicate()


_HOLD = """
import sys, time
from keras_largebatch.train.checkpointing import lock
held = lock.acquire(sys.argv[1])  # Held while referenced.
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.backend_independent
def test_the_lock_dies_with_its_holder_and_refuses_a_second_opener(
        tmp_path):
    folder = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, folder],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(lock.LockedError, match=f"pid {holder.pid} on "):
            lock.acquire(folder)
    finally:
        holder.kill()  # As a kill -9 would: no clean-up of its own.
        holder.wait()
    taken = lock.acquire(folder)  # No stale lock.
    try:
        with open(os.path.join(folder, "run.lock")) as f:
            assert json.load(f)["pid"] == os.getpid()
        with pytest.raises(lock.LockedError):  # Another open file: refused.
            lock.acquire(folder)
    finally:
        taken.release()


@pytest.mark.backend_independent
def test_a_file_system_without_flock_runs_unlocked_saying_so_once(
        tmp_path, monkeypatch, capsys):
    """The lock knows nothing of the command: it says why the folder is
    unlocked, and the command prints that line, naming itself, on stderr."""
    import errno

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_flock)
    folder = str(tmp_path / "run")
    taken = lock.acquire(folder)
    taken.release(remove_if_empty=True)
    assert taken.unlocked == (f"{folder} is not locked: its file system has "
                              "no flock (No locks available); make sure no "
                              "other run uses this folder")
    # Refused after the lock is taken: more images than digits has.
    assert _run(f"--model_dir={folder}", "--global_batch_size=65536") == 2
    unlocked, refused = _ours(capsys.readouterr().err)
    assert unlocked == f"{PROG}: {taken.unlocked}"
    assert refused.startswith(f"{PROG}: error: `global_batch_size` is larger")
    assert not os.path.exists(folder)  # Made for the lock: gone again.


def test_ctrl_c_exits_130_in_one_line_saying_where_it_resumes(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    proc = _start(model_dir)
    try:
        _wait_for(model_dir / "backup" / "training_metadata.json", proc)
        history = (model_dir / "history.csv").read_bytes()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    ours = _ours(err)
    assert len(ours) == 1, err[-3000:]
    assert ours[0].startswith(f"{PROG}: interrupted (Ctrl-C): run the same "
                              "command to resume from epoch "), ours
    # The step it stopped at, or after the epoch when that was the last.
    assert re.search(r"step 1 \(backup/within_epoch_\d+_000001\.weights"
                     r"|step 0 \(backup/latest\.weights\.h5", ours[0]), ours
    assert (model_dir / "history.csv").read_bytes().startswith(history)
    # It resumes there, and times the steps after its own compilation.
    capsys.readouterr()
    assert _run(*LONG, f"--model_dir={model_dir}") == 0
    step = int(re.search(r"resumed from epoch \d+, step (\d)",
                         capsys.readouterr().out).group(1))
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["epochs_run_now"] >= 1
    assert summary["images_timed"] == (
        summary["epochs_run_now"] * 2 - 1 - step) * 16
    assert summary["images_per_sec"] > 0


@pytest.mark.backend_independent
@pytest.mark.parametrize("content", [b"[1, 2]", b"{}", b"\x8f\x00\xffz"],
                         ids=["list", "empty", "bytes"])
def test_a_damaged_run_config_exits_2_naming_it_and_is_never_resumed(
        content, tmp_path, capsys):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "run_config.json").write_bytes(content)
    for args in ([], ["--mode=eval"]):
        assert _run(f"--model_dir={model_dir}", *args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"{PROG}: error: "
                              f"{model_dir / 'run_config.json'} is damaged"), err
    assert os.listdir(model_dir) == ["run_config.json"]
    assert (model_dir / "run_config.json").read_bytes() == content


def _cli(backend, *args):
    env = dict(os.environ, KERAS_BACKEND=backend)
    return subprocess.run(
        [sys.executable, "-m", "keras_largebatch.train.cli", *args],
        env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.backend_independent
@pytest.mark.parametrize("backend,guess", [("JAX", "jax"),
                                           ("bogus", None)])
def test_an_unknown_backend_is_one_line_and_help_still_helps(
        backend, guess, tmp_path):
    proc = _cli(backend, f"--model_dir={tmp_path}/run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        f"{PROG}: error: Keras' backend {backend!r} (KERAS_BACKEND) is not "
        "one Keras knows: use one of tensorflow, jax, torch"), proc.stderr
    if guess:
        assert f"KERAS_BACKEND={guess}." in proc.stderr
    assert not os.path.exists(tmp_path / "run")
    helped = _cli(backend, "--help")
    assert helped.returncode == 0 and "--model_dir" in helped.stdout


def test_a_disk_too_small_for_the_first_checkpoint_is_refused_before_it(
        small, tmp_path, monkeypatch, capsys):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(
        free=10_000))
    model_dir = tmp_path / "run"
    assert _run(*SHORT, f"--model_dir={model_dir}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{PROG}: error: `model_dir` has 0.0 MB free on "
                          "its disk; the first checkpoint"), err
    assert "Nothing was written, so there is nothing to resume" in err
    assert "resume" not in err.split("nothing to resume")[1]
    assert not model_dir.exists()


def test_eval_says_no_input_ran_out_and_the_run_opens_with_its_banner(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    assert _run(*SHORT, f"--model_dir={model_dir}", "--steps_per_epoch=2",
                "--epochs=1") == 0
    banner = _ours(capsys.readouterr().out)[:3]
    assert banner[0] == (f"{PROG}: alexnet_bn on digits: images 8x8x1 (to "
                         "the model 67x67x3), 10 classes, 1437 training "
                         "and 360 validation images"), banner
    assert banner[1] == (f"{PROG}: batch 16 (16 per device), 2 steps an "
                         "epoch, 1 epoch: 2 steps"), banner
    assert banner[2].startswith(
        f"{PROG}: backend {keras.backend.backend()}, 1 process, 1 device "), banner
    assert "precision float32, optimizer lars_mixed at a peak learning " \
           "rate of" in banner[2], banner
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _run(f"--model_dir={model_dir}", "--mode=eval") == 0
    assert not [w for w in caught if "ran out of data" in str(w.message)]


@pytest.mark.backend_independent
def test_the_divergence_line_counts_the_batches_before_a_resume():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.optimizer.build(model.trainable_variables)
    kernel = model.get_layer("d").kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    at = types.SimpleNamespace(epoch=1, micro_batches=5)
    stop = divergence.StopOnDivergence(resumed_at=at)
    stop.set_model(model)
    stop.on_epoch_begin(1)
    stop.on_train_batch_end(1, {"loss": float("nan")})  # Read one late:
    with pytest.raises(divergence.Diverged, match="epoch 2, batch 7 "):
        stop.on_train_batch_end(2, {"loss": float("nan")})
