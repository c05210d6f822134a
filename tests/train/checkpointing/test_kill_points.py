"""A run killed right after any of its writes, or stopped by SIGTERM, and
started again with the same command ends with an uninterrupted run's
records: history.csv, evals.csv, summary.json (but what times this
invocation), TensorBoard's scalars (each epoch's once), the epoch
checkpoints and the final weights, bit for bit.

One uninterrupted run per module is the reference. The kills run as one
chain (each start killed at the next point, the last start left to end),
so that a point costs one start: every point on JAX, two on the other
backends. SIGTERM is tested on its own on each backend; it leaves what a
kill right after the checkpoint's pointer would (its save, then the exit).
"""

import csv
import glob
import json
import os
import re
import struct
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest

from keras_largebatch.train import PROG

BACKEND = keras.backend.backend()
# The command scripts live in tests/train.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(HERE, "small_command.py")  # with its kill switch
# Six micro-batches an epoch, an evaluation after the third.
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=6", "--epochs=2", "--augment=crop_flip",
        "--image_size=67", "--warmup_epochs=0.5", "--verbose=2",
        "--deterministic", "--evals_per_epoch=2"]
SWITCHES = ("KILL_AT_EPOCH_STEP", "KILL_AT_POINT", "TERM_AT_EPOCH_STEP")
# What times an invocation, or counts its own epochs.
TIMING = ("images_per_sec", "images_timed", "train_seconds_timed",
          "wall_seconds", "wall_seconds_now", "epochs_run_now")


def _run(model_dir, cache, extra=(), **switches):
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    for name in SWITCHES:
        env.pop(name, None)
    env.update(switches)
    # JAX keeps its compilations for the module's next starts (-40 %).
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    proc = subprocess.run(
        [sys.executable, SCRIPT, *ARGS, *extra, f"--model_dir={model_dir}"],
        env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _h5(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: found.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return found


def _scalars(log_dir):
    """TensorBoard's scalars under `log_dir`, but what times a run: sorted
    [(split, tag, step, value)], a point written twice listed twice. The
    event files read as TFRecords (length, its CRC, the data, its CRC),
    each an `Event` (tensorboardX's protocol buffers: no TensorFlow)."""
    from tensorboardX.proto import event_pb2

    found = []
    for path in glob.glob(os.path.join(log_dir, "*", "events.out.tfevents.*")):
        split = os.path.basename(os.path.dirname(path))
        with open(path, "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            length, = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(
                data[at + 12:at + 12 + length])
            at += 12 + length + 4
            found += [(split, v.tag, event.step, v.simple_value)
                      for v in event.summary.value
                      if v.tag.removeprefix("epoch_") not in TIMING]
    return sorted(found)


def _records(model_dir):
    """Everything a run leaves to read, but what times it."""
    with open(os.path.join(model_dir, "history.csv"), newline="") as f:
        history = [{k: v for k, v in row.items() if k not in TIMING}
                   for row in csv.DictReader(f)]
    with open(os.path.join(model_dir, "evals.csv")) as f:
        evals = f.read()
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = {k: v for k, v in json.load(f).items() if k not in TIMING}
    folder = os.path.join(model_dir, "checkpoints")
    epochs = {name: _h5(os.path.join(folder, name))
              for name in sorted(os.listdir(folder))
              if name.endswith(".weights.h5")}
    final = keras.saving.load_model(
        os.path.join(model_dir, "final.keras")).get_weights()
    scalars = _scalars(os.path.join(model_dir, "tensorboard"))
    assert scalars, "no TensorBoard scalars"
    return (history, evals, summary, scalars, sorted(os.listdir(folder)),
            epochs, final)


def _assert_same_records(got, want):
    *got_rest, got_epochs, got_final = got
    *want_rest, want_epochs, want_final = want
    assert got_rest == want_rest
    assert got_epochs.keys() == want_epochs.keys()
    for name in want_epochs:
        for key, value in want_epochs[name].items():
            np.testing.assert_array_equal(got_epochs[name][key], value)
    assert len(got_final) == len(want_final)
    for x, y in zip(got_final, want_final):
        np.testing.assert_array_equal(x, y)


def _resumed(log):
    return re.findall(r"resumed from epoch (\d+), step (\d+)", log)


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    """`run(model_dir, extra=(), **switches)`: the command (`extra` after
    `ARGS`), its exit code and log."""
    cache = tmp_path_factory.mktemp("compiled")
    return lambda model_dir, extra=(), **switches: _run(
        model_dir, cache, extra, **switches)


@pytest.fixture(scope="module")
def reference(command, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("whole") / "run"
    code, log = command(model_dir)
    assert code == 0, log[-3000:]
    return _records(model_dir)


# (switches, where the next start says it resumes: (epoch from 1, step), or
# None where no epoch is left). Epochs from 0 in the switches.
EVERY_POINT = [
    # Epoch 0 never committed: each start begins the run again.
    (dict(KILL_AT_POINT="history_row,0"), ("1", "0")),
    (dict(KILL_AT_POINT="eval_row,0"), ("1", "0")),
    (dict(KILL_AT_POINT="backup_weights,0"), ("1", "0")),
    (dict(KILL_AT_POINT="epoch_checkpoint,1"), ("2", "0")),
    # SIGTERM's checkpoint within epoch 1, killed before its pointer.
    (dict(TERM_AT_EPOCH_STEP="1,2", KILL_AT_POINT="within_epoch_weights,1"),
     ("2", "0")),
    (dict(KILL_AT_POINT="backup_metadata,1"), None),
    (dict(KILL_AT_POINT="final_model"), None),
    (dict(KILL_AT_POINT="summary"), None),
]
SOME_POINTS = [
    (dict(KILL_AT_POINT="history_row,0"), ("1", "0")),
    (dict(KILL_AT_POINT="backup_metadata,1"), None),
]


def test_a_run_killed_after_any_write_ends_with_an_uninterrupted_runs_records(
        command, reference, tmp_path):
    model_dir = tmp_path / "killed"
    chain = EVERY_POINT if BACKEND == "jax" else SOME_POINTS
    resumes = None  # The first start is a new run.
    for switches, then in [*chain, ({}, None)]:
        code, log = command(model_dir, **switches)
        assert code == (9 if switches else 0), (switches, log[-3000:])
        assert _resumed(log) == ([resumes] if resumes else []), (
            switches, log[-3000:])
        resumes = then
    _assert_same_records(_records(model_dir), reference)


def test_sigterm_saves_at_the_next_step_says_where_and_resumes_there(
        command, reference, tmp_path):
    model_dir = tmp_path / "stopped"
    # Sent after micro-batch 2 of epoch 1 (from 0): saved after the next.
    code, log = command(model_dir, TERM_AT_EPOCH_STEP="1,2")
    assert code == 143, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    said = [line for line in log.splitlines() if "SIGTERM" in line]
    assert said == [
        f"{PROG}: stopped by SIGTERM: run the same command to resume from "
        f"epoch 2, step 4 (backup/within_epoch_002_000004.weights.h5) in "
        f"{model_dir}"], log[-3000:]
    code, log = command(model_dir)
    assert code == 0, log[-3000:]
    assert _resumed(log) == [("2", "4")], log[-3000:]
    _assert_same_records(_records(model_dir), reference)


@pytest.mark.skipif(BACKEND != "jax", reason="the chain above covers the "
                    "checkpoint within an epoch on every backend")
def test_checkpoints_every_two_updates_resume_evaluations_within_epochs(
        command, reference, tmp_path):
    """--checkpoint_every_steps with --evals_per_epoch=2: killed after
    micro-batch 4 of epoch 1 (from 0), past the evaluation after the
    third, the run resumes at the checkpoint of update 4 and ends with the
    records of an uninterrupted run without checkpoints."""
    model_dir = tmp_path / "every_two"
    every = ["--checkpoint_every_steps=2"]
    code, log = command(model_dir, every, KILL_AT_EPOCH_STEP="1,4")
    assert code == 9, log[-3000:]
    code, log = command(model_dir, every)
    assert code == 0, log[-3000:]
    assert _resumed(log) == [("2", "4")], log[-3000:]
    _assert_same_records(_records(model_dir), reference)


@pytest.mark.backend_independent
def test_an_epochs_backup_is_written_after_every_record_of_the_epoch(
        tmp_path):
    """The order of `fit`'s callbacks, which the kills below test in
    effect: the backup a resume starts from after every other writer, the
    stop on a signal (saving within the epoch) after everything."""
    import types

    from keras_largebatch.train import checkpointing
    from keras_largebatch.train import config
    from keras_largebatch.train.outputs import callbacks as outputs
    from keras_largebatch.train.run import callbacks
    from keras_largebatch.train.run import interrupt

    parsed = config.parse([PROG, f"--model_dir={tmp_path}",
                           "--evals_per_epoch=2"])
    inputs = types.SimpleNamespace(step_batch=32, steps_per_epoch=4,
                                   train=None, validation=None)
    found = callbacks.callbacks(
        parsed.runtime, parsed.adaptive, parsed.evaluation, inputs,
        outputs.Throughput(32), str(tmp_path),
        gradient_accumulation_steps=1)
    kinds = [type(c) for c in found]
    backup = kinds.index(checkpointing.Backup)
    for writer in (outputs.HistoryCSV, checkpointing.EpochCheckpoints,
                   outputs.WithinEpochEvals, checkpointing.StepCheckpoints):
        assert kinds.index(writer) < backup, kinds
    assert kinds[backup + 1:] == [interrupt.StopOnInterrupt], kinds
    assert found[-1].checkpoints is found[
        kinds.index(checkpointing.StepCheckpoints)]
