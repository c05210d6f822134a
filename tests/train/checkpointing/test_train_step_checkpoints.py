"""`--checkpoint_every_steps`: a run killed within an epoch, on one process
and across processes, resumes there and ends with an uninterrupted run's
weights, bit for bit; so does a job of several processes stopped by
SIGTERM to one of them, which all save at one step."""

import csv
import functools
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.distribute import localhost
from keras_largebatch.train import PROG

BACKEND = keras.backend.backend()
# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(HERE, "small_command.py")  # KILL_AT_EPOCH_STEP ends it
# Six micro-batches an epoch, a checkpoint every two updates.
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=6", "--epochs=2", "--augment=crop_flip",
        "--image_size=67", "--warmup_epochs=0.5", "--verbose=2",
        "--deterministic", "--checkpoint_every_steps=2"]
# k0 = 2 micro-batches an update, 4 from epoch 1, 8 from epoch 2 (from 0):
# ten micro-batches an epoch, so each switch waits two or four of them,
# and a checkpoint every update lands while one is pending.
ADAPTIVE = ["--steps_per_epoch=10", "--gradient_accumulation_steps=2",
            "--adaptive_batch=schedule", "--batch_schedule=1:64,2:128",
            "--epochs=3", "--max_global_batch_size=128",
            "--checkpoint_every_steps=1"]


def _run(model_dir, extra=(), kill=None):
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    env.pop("KILL_AT_EPOCH_STEP", None)
    if kill:
        env["KILL_AT_EPOCH_STEP"] = kill
    proc = subprocess.run(
        [sys.executable, SCRIPT, *ARGS, *extra, f"--model_dir={model_dir}"],
        env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _weights(model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"))
    return model.get_weights()


def _assert_identical(a, b):
    for x, y in zip(_weights(a), _weights(b)):
        np.testing.assert_array_equal(x, y)


def _resumed(log):
    found = re.findall(r"resumed from epoch (\d+), step (\d+)", log)
    assert len(found) == 1, log[-3000:]
    return tuple(map(int, found[0]))


@pytest.mark.parametrize("extra, kills", [
    # (epoch, micro-batch) of the kill, both from 0 -> (epoch, step) resumed
    ((), {"0,2": (1, 2), "1,4": (2, 4)}),
    (ADAPTIVE, {"1,2": (2, 1), "2,5": (3, 1)}),
], ids=["fixed_batch", "adaptive_batch"])
def test_a_run_killed_within_an_epoch_resumes_there_bit_identical(
        extra, kills, tmp_path, command_runs):
    # The uninterrupted and the killed runs are the session's, shared with
    # test_checkpoint_faults.py (the same arguments).
    whole = command_runs.get([*ARGS, *extra])
    assert whole.code == 0, whole.log[-3000:]
    for i, (kill, at) in enumerate(kills.items()):
        killed = command_runs.get([*ARGS, *extra], kill)
        assert killed.code == 9, killed.log[-3000:]
        model_dir = command_runs.copy(killed, tmp_path / f"killed_{i}")
        code, log = _run(model_dir, extra)
        assert code == 0, log[-3000:]
        assert _resumed(log) == at
        _assert_identical(whole.model_dir, model_dir)


@pytest.mark.parametrize("value", ["-1", "x"])
def test_a_bad_checkpoint_every_steps_exits_2_with_one_line(
        value, tmp_path, capsys):
    from keras_largebatch.train.run import driver as main

    code = main.main(["keras-largebatch-train",
                      f"--checkpoint_every_steps={value}",
                      f"--model_dir={tmp_path}/run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "checkpoint_every_steps" in err
    assert not os.path.exists(tmp_path / "run")


def test_checkpoints_within_epochs_go_with_evaluations_and_top_k():
    """Both kept within an epoch (the evaluations' position, each worker's
    residuals): resumed there in test_kill_points.py and below."""
    from keras_largebatch.train import config as train_flags

    parsed = train_flags.parse(["prog", "--model_dir=/tmp/x",
                                "--checkpoint_every_steps=2",
                                "--evals_per_epoch=2",
                                "--distribution=multi_worker",
                                "--compression=topk"])
    assert parsed.runtime.checkpoint_every_steps == 2
    assert train_flags.BY_NAME["checkpoint_every_steps"].free


def _switches(kill, term):
    """The kill switches of process or worker 1 (`kill_switch.py`)."""
    return {name: value for name, value in (("KILL_AT_EPOCH_STEP", kill),
                                            ("TERM_AT_EPOCH_STEP", term))
            if value}


def _jax_job(model_dir, kill=None, term=None):
    port = localhost.free_ports(1)[0]
    procs = []
    for index in range(2):
        env = dict(os.environ, KERAS_BACKEND="jax",
                   XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                   KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                   KERAS_DISTRIBUTION_PROCESS_ID=str(index))
        env.pop("KILL_AT_EPOCH_STEP", None)
        env.pop("TERM_AT_EPOCH_STEP", None)
        if index == 1:
            env.update(_switches(kill, term))
        procs.append(subprocess.Popen(
            [sys.executable, SCRIPT, "--distribution=data_parallel", *ARGS,
             "--collective_timeout_seconds=30", f"--model_dir={model_dir}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    try:
        return [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    finally:
        localhost.kill(procs)


def _tf_job(model_dir, kill=None, term=None, extra=()):
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    for name in ("TF_CONFIG", "KILL_AT_EPOCH_STEP", "TERM_AT_EPOCH_STEP"):
        env.pop(name, None)
    command = [sys.executable, SCRIPT, "--distribution=multi_worker", *ARGS,
               *extra, "--collective_timeout_seconds=30",
               f"--model_dir={model_dir}"]
    logs = [f"{model_dir}_{i}.log" for i in range(2)]
    switches = [f"{k}={v}" for k, v in _switches(kill, term).items()]
    command1 = ["env", *switches, *command]  # Worker 1 only.
    procs = localhost.start([command, command1], logs=logs, env=env)
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        localhost.kill(procs)
    out = []
    for log in logs:
        with open(log) as f:
            out.append(f.read())
    return list(zip(codes, out))


# What times an invocation.
TIMING = ("images_per_sec", "images_timed", "train_seconds_timed")


def _history(model_dir):
    with open(os.path.join(model_dir, "history.csv"), newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING}
                for row in csv.DictReader(f)]


# Top-k all-reduce with error feedback: each worker's residuals are saved
# with every checkpoint within an epoch.
TOPK = ("--compression=topk", "--topk_density=0.05")


@pytest.mark.multi_process
@pytest.mark.parametrize("extra", [(), TOPK], ids=["dense", "topk"])
def test_a_job_killed_or_stopped_by_sigterm_within_an_epoch_resumes_there(
        extra, tmp_path):
    """One chain of starts (a job of two processes costs half a minute to
    start): process 1 killed after micro-batch 4 of epoch 0 (from 0), so
    the job resumes at epoch 1, step 4; that start stopped by SIGTERM to
    process 1 after micro-batch 1 of epoch 1, so every process saves at
    the step they agree on and says so; the last start resumes there and
    ends with the uninterrupted job's weights, bit for bit: under top-k
    compression (TensorFlow workers) with every worker's residuals
    restored as they were. The one-process tests above kill in each
    epoch."""
    if BACKEND not in ("jax", "tensorflow") or (extra and BACKEND == "jax"):
        pytest.skip("two JAX processes; two TensorFlow workers (top-k)")
    job = functools.partial(_jax_job if BACKEND == "jax" else _tf_job,
                            **({"extra": extra} if extra else {}))
    whole = job(tmp_path / "whole")
    assert all(code == 0 for code, _ in whole), whole[0][1][-3000:]
    model_dir = tmp_path / "stopped"
    killed = job(model_dir, kill="0,4")
    assert killed[0][0] != 0, killed[0][1][-3000:]
    if BACKEND == "jax":  # Its supervisor reports the training's end.
        assert killed[1][0] == 1, killed[1][1][-3000:]
        assert "ended with exit code 9" in killed[1][1]
    else:
        assert killed[1][0] == 9, killed[1][1][-3000:]

    stopped = job(model_dir, term="1,1")
    said = []
    for code, log in stopped:
        assert code == 143, log[-3000:]
        assert _resumed(log) == (1, 4)
        ours = [line for line in log.splitlines()
                if line.startswith(f"{PROG}: stopped")]
        assert len(ours) == 1 and "Traceback" not in log, log[-3000:]
        said += ours
    # Both name the one checkpoint, within epoch 2 (from 1), at or past
    # the 2 updates taken when the signal came: none of them is lost.
    assert said[0] == said[1], said
    found = re.fullmatch(
        rf"{PROG}: stopped by SIGTERM: run the same command to resume "
        rf"from epoch 2, step (\d) \(backup/within_epoch_002_00000\1"
        rf"\.weights\.h5\) in {re.escape(str(model_dir))}", said[0])
    assert found and 2 <= int(found.group(1)) < 6, said[0]

    again = job(model_dir)
    assert all(code == 0 for code, _ in again), again[0][1][-3000:]
    assert _resumed(again[0][1]) == (2, int(found.group(1)))
    _assert_identical(tmp_path / "whole", model_dir)
    # TensorFlow workers' running metrics (per-worker sums) start again at
    # a checkpoint within an epoch (docs/training.md); JAX's are restored.
    if BACKEND == "jax":
        assert _history(model_dir) == _history(tmp_path / "whole")


@pytest.mark.parametrize("killed_after", ["weights", "metadata"])
def test_an_epoch_backup_killed_while_saving_resumes_one_whole_epoch(
        killed_after, tmp_path, monkeypatch):
    from keras_largebatch.train.checkpointing import backup
    from keras_largebatch.train.checkpointing import files
    from keras_largebatch.train.checkpointing import restore

    def model():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    folder = str(tmp_path / "backup")
    saved = model()
    callback = backup.Backup(folder)
    callback.set_model(saved)
    callback.on_epoch_end(0)  # Epoch 1 saved whole.
    first = saved.get_weights()
    saved.set_weights([w + 1 for w in first])
    # Epoch 2's save stops after its staged weights, or after the metadata.
    real = os.replace if killed_after == "metadata" else None

    def kill(*args):
        raise KeyboardInterrupt

    if killed_after == "weights":
        monkeypatch.setattr(files, "save_json", kill)
    else:
        monkeypatch.setattr(os, "replace", lambda a, b: (
            kill() if os.path.basename(a).startswith("staged_") else real(a, b)))
    with pytest.raises(KeyboardInterrupt):
        callback.on_epoch_end(1)
    monkeypatch.undo()

    start, skipped = restore.choose(str(tmp_path))
    assert skipped == []
    restored = model()
    again = backup.Backup(folder, start=start)
    again.set_model(restored)
    again.on_train_begin()
    epoch, weights = ((1, first) if killed_after == "weights"
                      else (2, [w + 1 for w in first]))
    assert restored._initial_epoch == epoch
    for a, b in zip(restored.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
