"""Checkpoints that fail: a damaged one is skipped for the next with one
line, and the rerun ends bit for bit as an uninterrupted run; where none
loads, an unwritable `model_dir` or a full disk, one line and an exit code;
what a kill left is removed at the next start.

`legacy_run/` is a run of `ARGS` on JAX written before checkpoints moved
into `train/checkpointing/` (pointers without sizes or CRC-32s), killed
after micro-batch 4 of epoch 2: its epoch backup holds epoch 1, its
checkpoint within epoch 2 four updates. Its weights were computed by the
JAX release of its day, whose float32 results may differ from today's in
the last bit, so a rerun is compared with it to within float32 rounding;
bit-identity is asserted on runs killed by the JAX installed now.
"""

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "small_command.py")
LEGACY = os.path.join(HERE, "legacy_run")
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=6", "--epochs=2", "--augment=crop_flip",
        "--image_size=67", "--warmup_epochs=0.5", "--verbose=2",
        "--deterministic", "--checkpoint_every_steps=2"]
# Code that does not vary with the backend: runs once, on JAX
# (tests/conftest.py).
def ONCE(test):
    return pytest.mark.backend_independent(pytest.mark.skipif(
        BACKEND != "jax", reason="backend-independent: runs on JAX")(test))


def _run(model_dir, kill=None):
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    env.pop("KILL_AT_EPOCH_STEP", None)
    if kill:
        env["KILL_AT_EPOCH_STEP"] = kill
    proc = subprocess.run(
        [sys.executable, SCRIPT, *ARGS, f"--model_dir={model_dir}"],
        env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _main(model_dir, *extra):
    from keras_largebatch.train.run import driver as main

    return main.main(["keras-largebatch-train", *ARGS, *extra,
                      f"--model_dir={model_dir}"])


@pytest.fixture(scope="module")
def whole(command_runs):
    """The final weights of an uninterrupted run (the session's, shared
    with test_train_step_checkpoints.py)."""
    run = command_runs.get(ARGS)
    assert run.code == 0, run.log[-3000:]
    model = keras.saving.load_model(os.path.join(run.model_dir, "final.keras"))
    return model.get_weights()


def _killed(tmp_path, command_runs, kill="1,4"):
    """A copy of a run killed after micro-batch 4 of epoch 2 (`kill`), by
    the code and libraries installed now (the session's)."""
    killed = command_runs.get(ARGS, kill)
    assert killed.code == 9, killed.log[-3000:]
    return command_runs.copy(killed, tmp_path / "run")


def _legacy(tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(LEGACY, model_dir)
    return model_dir


def _pointer(model_dir):
    with open(model_dir / "backup" / "within_epoch.json") as f:
        return json.load(f)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _assert_identical(whole, model_dir):
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"))
    for x, y in zip(whole, model.get_weights()):
        np.testing.assert_array_equal(x, y)


def _assert_within_rounding(whole, model_dir):
    """`legacy_run`'s resume against today's uninterrupted run: equal but
    for float32 rounding (a few ulps); a resume from the wrong step or
    without the optimizer's state differs by orders of magnitude more."""
    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"))
    for x, y in zip(whole, model.get_weights()):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


def _resumed(log):
    found = re.findall(r"resumed from epoch (\d+), step (\d+)", log)
    assert len(found) == 1, log[-3000:]
    return tuple(map(int, found[0]))


def _one_line(err):
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@ONCE
def test_a_run_written_before_the_move_resumes_where_it_stopped_and_tidy(
        whole, tmp_path):
    model_dir = _legacy(tmp_path)
    litter = [model_dir / "backup" / ".tmp-4242-within_epoch_002_000006"
              ".weights.h5", model_dir / "backup" / "staged_002.weights.h5",
              model_dir / "checkpoints" / ".tmp-4242-epoch_002.keras"
              ".deflated", model_dir / ".tmp-4242-summary.json"]
    for path in litter:
        path.write_bytes(b"half")
    mine = model_dir / "backup" / "notes.tmp"
    mine.write_text("not the run's")
    code, log = _run(model_dir)
    assert code == 0, log[-3000:]
    assert "skipped" not in log, log[-3000:]
    assert _resumed(log) == (2, 4)
    assert not any(path.exists() for path in litter)
    assert mine.exists()
    _assert_within_rounding(whole, model_dir)


def test_a_damaged_newest_checkpoint_falls_back_to_the_epoch_backup(
        whole, tmp_path, command_runs):
    model_dir = _killed(tmp_path, command_runs)
    name = _pointer(model_dir)["weights"]
    _truncate(model_dir / "backup" / name)
    code, log = _run(model_dir)
    assert code == 0, log[-3000:]
    skipped = [line for line in log.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and name in skipped[0], log[-3000:]
    assert "resuming at epoch 2, step 0" in skipped[0]
    assert _resumed(log) == (2, 0)
    _assert_identical(whole, model_dir)


@ONCE
def test_a_damaged_epoch_backup_falls_back_to_the_checkpoint_before_it(
        whole, tmp_path, command_runs):
    # Killed just after epoch 1's backup.
    model_dir = _killed(tmp_path, command_runs, "1,0")
    assert _pointer(model_dir)["epoch"] == 0
    _truncate(model_dir / "backup" / "latest.weights.h5")
    code, log = _run(model_dir)
    assert code == 0, log[-3000:]
    skipped = [line for line in log.splitlines() if "skipped" in line]
    assert len(skipped) == 1, log[-3000:]
    assert "latest.weights.h5 has" in skipped[0]
    assert "resuming at epoch 1, step 4" in skipped[0]
    assert _resumed(log) == (1, 4)
    _assert_identical(whole, model_dir)
    with open(model_dir / "history.csv") as f:
        assert [row.split(",")[0] for row in f][1:] == ["0", "1"]


def _damage(model_dir, fault):
    """Damages the checkpoint within epoch 2 of `model_dir`; returns what
    the skip line must name."""
    backup = model_dir / "backup"
    pointer = _pointer(model_dir)
    if fault == "truncated":
        _truncate(backup / pointer["weights"])
        return pointer["weights"]
    if fault == "missing":
        os.remove(backup / pointer["weights"])
        return f"{pointer['weights']} is missing"
    if fault == "garbage":
        (backup / "within_epoch.json").write_bytes(b"\x00{not json")
        return "within_epoch.json does not parse"
    if fault.startswith("no_"):
        del pointer[fault[3:]]
    else:  # A name outside the folder.
        pointer["weights"] = {"parent": "../latest.weights.h5",
                              "absolute": str(backup / pointer["weights"])
                              }[fault]
    (backup / "within_epoch.json").write_text(json.dumps(pointer))
    return "within_epoch.json"


@ONCE
@pytest.mark.parametrize("fault", [
    "truncated", "missing", "garbage", "no_step", "no_weights", "no_data",
    "parent", "absolute"])
def test_a_damaged_checkpoint_within_an_epoch_is_skipped_for_the_backup(
        fault, tmp_path):
    from keras_largebatch.train.checkpointing import restore

    model_dir = _legacy(tmp_path)
    named = _damage(model_dir, fault)
    start, skipped = restore.choose(str(model_dir))
    assert start.kind == "backup" and start.epoch == 1
    assert start.position is None
    assert len(skipped) == 1 and named in skipped[0], skipped


@ONCE
@pytest.mark.parametrize("fault", ["truncated", "garbage_metadata",
                                   "missing_metadata"])
def test_a_damaged_epoch_backup_is_skipped_and_where_none_loads_exit_2(
        fault, tmp_path, capsys, small):
    from keras_largebatch.train.checkpointing import restore

    model_dir = _legacy(tmp_path)
    backup = model_dir / "backup"
    if fault == "truncated":
        _truncate(backup / "latest.weights.h5")
    elif fault == "garbage_metadata":
        (backup / "training_metadata.json").write_text('{"epoch": "one"')
    else:
        os.remove(backup / "training_metadata.json")
    # The checkpoint within the epoch after it still loads: it is newer
    # (said where the backup's own epoch is unknown).
    start, skipped = restore.choose(str(model_dir))
    assert (start.kind, start.epoch) == ("within_epoch", 1)
    assert len(skipped) == (fault != "truncated"), skipped
    _damage(model_dir, "truncated")
    before = sorted(os.listdir(backup))
    assert _main(model_dir) == 2
    err = _one_line(capsys.readouterr().err)
    assert str(backup) in err and "within_epoch_002_000004" in err, err
    assert ("latest.weights.h5" in err or "training_metadata" in err), err
    assert sorted(os.listdir(backup)) == before


@ONCE
def test_a_damaged_checkpoint_of_the_first_epoch_starts_the_run_over(
        tmp_path):
    # Killed in epoch 1 with its one checkpoint then damaged: no epoch had
    # finished, so the run's start is the newest state that loads.
    from keras_largebatch.train.checkpointing import restore

    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "within_epoch.json").write_text('{"epoch": 0, "st')
    (tmp_path / "checkpoints").mkdir()
    start, skipped = restore.choose(str(tmp_path))
    assert start is None
    assert len(skipped) == 1 and "within_epoch.json" in skipped[0], skipped
    # Once an epoch had finished, its loss is not silently replayed.
    (tmp_path / "checkpoints" / "epoch_001.weights.h5").write_bytes(b"x")
    with pytest.raises(restore.NoCheckpoint, match="backup"):
        restore.choose(str(tmp_path))


@ONCE
def test_a_checkpoint_that_differs_from_its_recorded_crc_is_skipped(
        tmp_path):
    from keras_largebatch.train.checkpointing import files
    from keras_largebatch.train.checkpointing import restore
    from keras_largebatch.train.checkpointing.backup import Backup

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    backup = Backup(str(tmp_path / "backup"))
    backup.set_model(model)
    backup.on_epoch_end(0)
    path = tmp_path / "backup" / "latest.weights.h5"
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        assert json.load(f)["written"] == files.fingerprint(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # Same size, another byte.
    path.write_bytes(bytes(data))
    with pytest.raises(restore.NoCheckpoint, match="CRC-32"):
        restore.choose(str(tmp_path))


@ONCE
def test_only_the_runs_own_litter_is_removed(tmp_path):
    from keras_largebatch.train import checkpointing

    model_dir = _legacy(tmp_path)
    metadata = model_dir / "backup" / "training_metadata.json"
    saved = json.loads(metadata.read_text())
    saved["staged"] = "staged_002.weights.h5"  # A rename a kill left.
    metadata.write_text(json.dumps(saved))
    pending = model_dir / "backup" / "staged_002.weights.h5"
    shutil.copy(model_dir / "backup" / "latest.weights.h5", pending)
    litter = model_dir / "backup" / "staged_001.weights.h5"
    litter.write_bytes(b"x")
    kept = [model_dir / "backup" / ".tmpfile", model_dir / "tmp-1-x",
            model_dir / "backup" / "within_epoch_002_000004.weights.h5"]
    kept[0].write_bytes(b"x")
    kept[1].write_bytes(b"x")
    removed = checkpointing.tidy(str(model_dir))
    assert removed == [str(litter)]
    assert pending.exists() and all(path.exists() for path in kept)


def _read_only(folder):
    """Makes `folder` read-only: a read-only bind mount (root), else chmod;
    returns an undo, or None where neither works."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        done = subprocess.run(
            f"mount --bind {folder} {folder} && "
            f"mount -o remount,ro,bind {folder}", shell=True,
            capture_output=True)
        if done.returncode == 0:
            return lambda: subprocess.run(["umount", str(folder)])
        subprocess.run(["umount", str(folder)], capture_output=True)
        return None
    os.chmod(folder, 0o555)
    if os.access(folder, os.W_OK):
        os.chmod(folder, 0o755)
        return None
    return lambda: os.chmod(folder, 0o755)


@ONCE
@pytest.mark.parametrize("resuming", [False, True], ids=["new", "resume"])
def test_a_read_only_model_dir_is_refused_before_anything_is_built(
        resuming, tmp_path, capsys, monkeypatch):
    from keras_largebatch.train import data

    model_dir = _legacy(tmp_path) if resuming else tmp_path / "parent"
    model_dir.mkdir(exist_ok=True)
    undo = _read_only(model_dir)
    if undo is None:
        pytest.skip("no read-only folder here (no bind mount, chmod "
                    "ignored)")

    def built(*args, **kwargs):
        raise AssertionError("data built")

    monkeypatch.setattr(data, "inputs", built)
    try:
        target = model_dir if resuming else model_dir / "run"
        assert _main(target) == 2
    finally:
        undo()
    err = _one_line(capsys.readouterr().err)
    assert "cannot be written" in err and str(model_dir) in err, err


@ONCE
def test_a_failed_write_keeps_the_last_checkpoint_and_no_temporary(
        tmp_path, monkeypatch):
    from keras_largebatch.train.checkpointing import files

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "a.weights.h5"
    files.save(model, str(path), model.save_weights)
    before = path.read_bytes()

    def full(tmp):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(files.SaveError, match="No space left") as e:
        files.save(model, str(path), full)
    assert str(tmp_path) in str(e.value) and "bytes" in str(e.value)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.weights.h5"]
    monkeypatch.setattr(files.shutil, "disk_usage",
                        lambda folder: types.SimpleNamespace(free=10))
    with pytest.raises(files.SaveError, match="has 10 bytes free"):
        files.save(model, str(path), model.save_weights)
    assert path.read_bytes() == before


@ONCE
def test_non_finite_weights_are_never_written(tmp_path):
    pytest.importorskip("keras_largebatch.train.run.divergence")
    from keras_largebatch.train.run import divergence
    from keras_largebatch.train.checkpointing import files

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    kernel = model.layers[0].kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(divergence.Diverged):
        files.save(model, str(tmp_path / "a.weights.h5"), model.save_weights)
    assert os.listdir(tmp_path) == []


@pytest.fixture
def tiny_disk(tmp_path):
    folder = tmp_path / "disk"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs",
                           str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield folder
    # Lazily: a failed run may hold a file open there (CSVLogger).
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@ONCE
def test_a_full_disk_ends_the_run_with_one_line_and_exit_1(
        tiny_disk, capsys, small, monkeypatch):
    from keras_largebatch.train.checkpointing import disk
    from keras_largebatch.train.checkpointing import restore

    # 96 kB cannot hold the first checkpoint: refused before training.
    needed = []
    check = disk.check_free_space

    def recorded(folder, count, resuming):
        needed.append(count)
        return check(folder, count, resuming)

    monkeypatch.setattr(disk, "check_free_space", recorded)
    model_dir = tiny_disk / "run"
    assert _main(model_dir) == 2
    err = _one_line(capsys.readouterr().err)
    assert "nothing to resume" in err and not model_dir.exists(), err
    # Room for the first checkpoint and two pages more: the run starts and
    # the disk fills during training, after checkpoints were written.
    size = -(-needed[0] // 4096) * 4096 + 2 * 4096
    subprocess.run(["mount", "-o", f"remount,size={size}", str(tiny_disk)],
                   check=True, capture_output=True)
    assert _main(model_dir) == 1
    err = _one_line(capsys.readouterr().err)
    assert str(model_dir) in err and "bytes" in err, err
    leftover = [name for _, _, found in os.walk(model_dir)
                for name in found if name.startswith(".tmp-")]
    assert leftover == []
    start, skipped = restore.choose(str(model_dir))
    assert start is not None and skipped == []  # What was written loads.


@ONCE
def test_a_weights_file_made_in_memory_is_the_one_save_weights_writes(
        tmp_path):
    h5py = pytest.importorskip("h5py")
    from keras_largebatch.train.checkpointing import files

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.BatchNormalization()])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.save_weights(tmp_path / "keras.weights.h5")
    files.save(model, str(tmp_path / "ours.weights.h5"))

    def read(path):
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, item: found.__setitem__(
                name, item[()] if isinstance(item, h5py.Dataset) else None))
        return found

    keras_file, ours = (read(tmp_path / f"{name}.weights.h5")
                        for name in ("keras", "ours"))
    assert sorted(keras_file) == sorted(ours) and len(ours) > 4
    for name, value in keras_file.items():
        np.testing.assert_array_equal(value, ours[name])
    model.load_weights(tmp_path / "ours.weights.h5")
