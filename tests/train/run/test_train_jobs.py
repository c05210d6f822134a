"""The command as a job: refusals, throughput, checkpoints, resume, logs."""

import json
import os
import zipfile

import keras
import pytest

from keras_largebatch.train.run import driver as train_main
from keras_largebatch.train.outputs import callbacks
from keras_largebatch.train.run import placement

BACKEND = keras.backend.backend()
# synthetic: 448 training and 64 validation images.
TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=8",
        "--steps_per_epoch=2", "--verbose=0", "--augment=none",
        "--warmup_epochs=0", "--image_size=67"]


def _run(*args):
    return train_main.main(["keras-largebatch-train", *args])


REFUSED = {
    "global_batch_larger_than_the_training_set": (
        ["--global_batch_size=1000"], 1, "global_batch_size=1000"),
    "warmup_as_long_as_the_run": (
        ["--warmup_epochs=2", "--epochs=2"], 1, "warmup_epochs=2"),
    "warmup_longer_than_the_run": (
        ["--warmup_epochs=100", "--epochs=2"], 1, "warmup_epochs=100"),
    "validation_set_without_a_full_batch": (
        ["--global_batch_size=128"], 2, "validation set (64 images)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_before_anything_is_written(case, tmp_path, monkeypatch,
                                            capsys):
    args, replicas, expected = REFUSED[case]
    monkeypatch.setattr(placement, "_distribution",
                        lambda flags: (None, replicas, True, 0))
    capsys.readouterr()
    assert _run(*TINY, *args, f"--model_dir={tmp_path}/run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keras-largebatch-train: error:")
    assert "\n" not in err and expected in err
    assert not os.path.exists(tmp_path / "run")


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_images_per_sec_counts_every_step_after_the_one_that_compiles(
        monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(callbacks.time, "perf_counter", clock)
    meter = callbacks.Throughput(global_batch_size=256)
    # The first step holds a 30 s compilation; the 99 others of epoch 1
    # take 0.1 s, epochs 2 and 3 100 steps in 4 s and 6 s: 299 x 256
    # images in 19.9 s, whatever the data size.
    for epoch, step_seconds in enumerate([[30.0] + [0.1] * 99,
                                          [0.04] * 100, [0.06] * 100]):
        meter.on_epoch_begin(epoch)
        for step, seconds in enumerate(step_seconds):
            clock.now += seconds
            meter.on_train_batch_end(step)
        clock.now += 5.0  # validation: not counted
        logs = {}
        meter.on_epoch_end(epoch, logs)
    assert meter.timed() == (299 * 256, pytest.approx(19.9))
    assert meter.images_per_sec() == pytest.approx(299 * 256 / 19.9)
    assert logs["images_per_sec"] == pytest.approx(25_600 / 6.0)


def test_a_resumed_process_times_the_steps_after_its_own_compilation(
        monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(callbacks.time, "perf_counter", clock)
    meter = callbacks.Throughput(global_batch_size=32)
    # Resumed for its last epoch: 12 s to compile again, then 9 steps.
    meter.on_epoch_begin(5)
    for step, seconds in enumerate([12.0] + [0.5] * 9):
        clock.now += seconds
        meter.on_train_batch_end(step)
    logs = {}
    meter.on_epoch_end(5, logs)
    assert meter.images_per_sec() == pytest.approx(9 * 32 / 4.5)
    assert logs["images_per_sec"] == pytest.approx(9 * 32 / 4.5)
    # One step in all: nothing timed, no rate (never 0).
    single = callbacks.Throughput(global_batch_size=32)
    single.on_epoch_begin(0)
    single.on_train_batch_end(0)
    logs = {}
    single.on_epoch_end(0, logs)
    assert single.images_per_sec() is None and "images_per_sec" not in logs


def test_summary_counts_every_step_of_repeated_data(small, tmp_path):
    # 3 epochs of 4 steps of 128 = 512 images per epoch on 448 training
    # images: the data repeats and every step still counts a full batch.
    model_dir = tmp_path / "run"
    assert _run(*TINY, "--global_batch_size=128", "--steps_per_epoch=4",
                "--epochs=3", f"--model_dir={model_dir}") == 0
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["images_timed"] == (3 * 4 - 1) * 128  # Not the first.
    seconds = summary["train_seconds_timed"]
    assert 0 < seconds < summary["wall_seconds_now"]
    assert summary["images_per_sec"] == pytest.approx(
        (3 * 4 - 1) * 128 / seconds)


CHANGED_FLAGS = [
    # (flag as given, the run's value as the error echoes it)
    ("--base_learning_rate=1.5", "base_learning_rate=0.0"),
    ("--base_batch_size=128", "base_batch_size=256"),
    ("--lr_scaling=sqrt", "lr_scaling='auto'"),
    ("--warmup_epochs=0.5", "warmup_epochs=0.0"),
    ("--end_learning_rate=0.001", "end_learning_rate=0.0001"),
    ("--poly_power=1", "poly_power=2.0"),
    ("--steps_per_epoch=3", "steps_per_epoch=2"),
    ("--momentum=0.8", "momentum=0.9"),
    ("--eta=0.002", "eta=0.001"),
    ("--weight_decay=0.0001", "weight_decay=0.0005"),
    ("--precision=mixed_bfloat16", "precision='auto'"),
    ("--label_smoothing=0.1", "label_smoothing=0.0"),
    ("--bn_momentum=0.99", "bn_momentum=0.9"),
    ("--seed=1", "seed=0"),
    ("--optimizer=sgd", "optimizer='lars_mixed'"),
    ("--global_batch_size=16", "global_batch_size=8"),
    ("--augment=crop_flip", "augment='none'"),
    ("--epochs=1", "epochs=2"),
]


def test_resume_refuses_each_changed_flag_naming_both_values(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    assert _run(*TINY, "--epochs=2", f"--model_dir={model_dir}") == 0
    before = {name: (model_dir / name).read_bytes()
              for name in ("run_config.json", "summary.json")}
    for flag, old in CHANGED_FLAGS:
        capsys.readouterr()
        assert _run(*TINY, "--epochs=2", flag,
                    f"--model_dir={model_dir}") == 2, flag
        err = capsys.readouterr().err.strip()
        name, new = flag[2:].split("=")
        assert "\n" not in err
        assert f"`{name}`" in err and old in err and new in err, err
    assert {name: (model_dir / name).read_bytes() for name in before} \
        == before
    # Output flags may change.
    assert _run(*TINY, "--epochs=2", "--verbose=2", "--check_images=false",
                f"--model_dir={model_dir}") == 0


def test_raising_epochs_trains_on_and_says_how_the_schedule_stretches(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    args = [*TINY, "--warmup_epochs=0.5", f"--model_dir={model_dir}"]
    assert _run(*args, "--epochs=2") == 0
    config = (model_dir / "run_config.json").read_text()
    capsys.readouterr()
    assert _run(*args, "--epochs=4") == 0
    out = capsys.readouterr().out
    assert "--epochs raised from 2 to 4" in out
    assert "stretched to end at epoch 4 (step 8 instead of 4)" in out
    assert (model_dir / "run_config.json").read_text() == config
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["epochs_run_now"] == 2
    raised = json.loads((model_dir / "epochs_raised.json").read_text())
    assert [(r["from_epochs"], r["epochs"], r["at_epoch"])
            for r in raised] == [(2, 4, 2)]
    # The raise is the new reference: going back to 3 is refused.
    assert _run(*args, "--epochs=3") == 2
    assert "epochs=3" in capsys.readouterr().err


def _floats(path, group=None):
    import h5py

    sizes = []
    with h5py.File(path, "r") as f:
        root = f[group] if group else f
        # A mixed optimizer's store records its layout (a JSON string, no
        # variable) beside its variables.
        root.visititems(lambda name, obj: sizes.append(obj.size)
                        if isinstance(obj, h5py.Dataset)
                        and not name.endswith("/layout") else None)
    return sum(sizes)


def _keras_floats(path, tmp_path):
    with zipfile.ZipFile(path) as archive:
        archive.extract("model.weights.h5", tmp_path)
    return _floats(tmp_path / "model.weights.h5")


def test_checkpoints_keep_two_epochs_and_hold_each_variable_once(
        small, tmp_path):
    model_dir = tmp_path / "run"
    assert _run(*TINY, "--epochs=3", f"--model_dir={model_dir}") == 0
    folder = model_dir / "checkpoints"
    # Two epoch checkpoints; the last is the final model, exported as
    # final.keras under a second name: the same bytes, not a third copy.
    assert sorted(os.listdir(folder)) == [
        "epoch_002.weights.h5", "epoch_003.keras"]
    assert os.path.samefile(model_dir / "final.keras",
                            folder / "epoch_003.keras")
    model = keras.saving.load_model(model_dir / "final.keras")
    assert getattr(model, "optimizer", None) is None
    weights = sum(int(w.numpy().size) for w in model.weights)
    assert _keras_floats(folder / "epoch_003.keras", tmp_path) == weights
    assert _floats(folder / "epoch_002.weights.h5") == weights
    # The backup: the weights, the optimizer's variables once, no more.
    trainable = sum(int(w.numpy().size) for w in model.trainable_weights)
    backup = _floats(model_dir / "backup" / "latest.weights.h5")
    assert weights + trainable <= backup < weights + trainable + 20
    # Either format loads into the model by path.
    for name in ("epoch_002.weights.h5", "epoch_003.keras"):
        reference = keras.Model(model.inputs, model.outputs)
        reference.load_weights(folder / name)
        for a, b in zip(model.weights, reference.weights):
            assert a.path == b.path


def test_keep_checkpoints_zero_keeps_only_the_final_model(small, tmp_path):
    model_dir = tmp_path / "run"
    assert _run(*TINY, "--epochs=2", "--keep_checkpoints=0",
                f"--model_dir={model_dir}") == 0
    assert os.listdir(model_dir / "checkpoints") == []
    assert os.stat(model_dir / "final.keras").st_nlink == 1
    summary = json.loads((model_dir / "summary.json").read_text())
    assert _run(f"--model_dir={model_dir}", "--mode=eval",
                "--verbose=0") == 0
    result = json.loads((model_dir / "eval.json").read_text())
    assert (result["checkpoint"], result["epoch"]) == ("final.keras", None)
    assert result["val_accuracy"] == pytest.approx(summary["val_accuracy"])


# AlexNet-BN at 67x67 with 10 classes (the default run's model);
# test_train_recipe derives the count layer by layer.
ALEXNET_BN_PARAMS = 20_214_538


def _disk_bytes(folder, skip):
    """Bytes of the files under `folder` but not under `skip`, each file
    once however many names it has (as `du` counts)."""
    seen, total = set(), 0
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if os.path.join(root, d) != str(skip)]
        for name in names:
            stat = os.stat(os.path.join(root, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def test_default_run_leaves_under_three_times_the_weight_bytes(tmp_path):
    # The default flags (AlexNet-BN on digits, --keep_checkpoints=2) with
    # one step per epoch: the files do not depend on the number of steps.
    model_dir = tmp_path / "run"
    assert _run(f"--model_dir={model_dir}", "--epochs=3",
                "--steps_per_epoch=1", "--verbose=0") == 0
    weight_bytes = 4 * ALEXNET_BN_PARAMS  # float32 variables
    model = keras.saving.load_model(model_dir / "final.keras")
    assert model.count_params() == ALEXNET_BN_PARAMS
    # Everything but backup/: checkpoints, final.keras, logs, plot, JSON.
    written = _disk_bytes(model_dir, skip=model_dir / "backup")
    assert written <= 3 * weight_bytes, written / weight_bytes
    # The weights twice (epoch 2, and the final model under two names),
    # plus at most 1% of headers, configs and logs.
    assert sorted(os.listdir(model_dir / "checkpoints")) == [
        "epoch_002.weights.h5", "epoch_003.keras"]
    assert written <= 2.01 * weight_bytes, written / weight_bytes
    # Counted name by name (the hard link twice), still within 3x: the
    # exported model is deflated.
    by_name = sum(
        os.path.getsize(os.path.join(root, name))
        for root, dirs, names in os.walk(model_dir)
        if "backup" not in os.path.relpath(root, model_dir).split(os.sep)
        for name in names)
    assert by_name <= 3 * weight_bytes, by_name / weight_bytes


def _tensorboard_tags(folder):
    import glob

    # TensorFlow's reader; the TF-free job skips this check.
    tf = pytest.importorskip("tensorflow")

    tags = {}
    for path in glob.glob(os.path.join(folder, "*", "events.out.tfevents.*")):
        split = os.path.basename(os.path.dirname(path))
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(split, set()).add(value.tag)
    return tags


@pytest.mark.tensorflow  # TensorFlow's reader checks the tags.
def test_tensorboard_top5_and_eval_of_the_latest_checkpoint(
        small, tmp_path, capsys):
    model_dir = tmp_path / "run"
    args = [*TINY, "--num_classes=12", f"--model_dir={model_dir}"]
    assert _run(*args, "--epochs=2") == 0
    tags = _tensorboard_tags(model_dir / "tensorboard")
    assert {"epoch_loss", "epoch_accuracy", "epoch_top5_accuracy",
            "epoch_learning_rate", "epoch_loss_scale",
            "epoch_images_per_sec"} <= tags["train"]
    assert {"epoch_loss", "epoch_accuracy",
            "epoch_top5_accuracy"} <= tags["validation"]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["top5_accuracy"] >= summary["val_accuracy"]
    before = sorted(os.listdir(model_dir))

    # Only --model_dir and --mode: the other flags are the run's.
    assert _run(f"--model_dir={model_dir}", "--mode=eval",
                "--verbose=0") == 0
    result = json.loads((model_dir / "eval.json").read_text())
    assert result["checkpoint"] == os.path.join("checkpoints",
                                                "epoch_002.keras")
    assert result["epoch"] == 2
    assert result["val_accuracy"] == pytest.approx(summary["val_accuracy"])
    assert result["top5_accuracy"] == pytest.approx(summary["top5_accuracy"])
    assert sorted(os.listdir(model_dir)) == sorted(before + ["eval.json"])


def test_no_top5_with_ten_classes_or_fewer(small, tmp_path):
    assert _run(*TINY, "--epochs=1", f"--model_dir={tmp_path}/run") == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "top5_accuracy" not in summary


def test_eval_without_a_run_exits_2(tmp_path, capsys):
    assert _run(f"--model_dir={tmp_path}/none", "--mode=eval") == 2
    assert "run_config.json" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "none")
