"""keras-largebatch-train as a job: refusals, throughput, checkpoints, resume."""

import json
import os

import keras
import pytest

from keras_largebatch.train import main as train_main
from keras_largebatch.train import outputs

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
    monkeypatch.setattr(train_main, "_distribution",
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


def test_images_per_sec_is_steps_times_batch_over_the_timed_epochs(
        monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(outputs.time, "perf_counter", clock)
    meter = outputs.Throughput(global_batch_size=256)
    # Epoch 1 holds a 30 s compilation; epochs 2 and 3 take 100 steps in
    # 4 s and 6 s: 2 x 100 x 256 images in 10 s, whatever the data size.
    for epoch, step_seconds in enumerate([[30.0] + [0.1] * 99,
                                          [0.04] * 100, [0.06] * 100]):
        meter.on_epoch_begin(epoch)
        for step, seconds in enumerate(step_seconds):
            clock.now += seconds
            meter.on_train_batch_end(step)
        clock.now += 5.0  # validation: not counted
        logs = {}
        meter.on_epoch_end(epoch, logs)
    assert meter.timed() == (51_200, pytest.approx(10.0))
    assert meter.images_per_sec() == pytest.approx(5_120.0)
    assert logs["images_per_sec"] == pytest.approx(25_600 / 6.0)


def test_summary_counts_every_step_of_repeated_data(small, tmp_path):
    # 3 epochs of 4 steps of 128 = 512 images per epoch on 448 training
    # images: the data repeats and every step still counts a full batch.
    model_dir = tmp_path / "run"
    assert _run(*TINY, "--global_batch_size=128", "--steps_per_epoch=4",
                "--epochs=3", f"--model_dir={model_dir}") == 0
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["images_timed"] == 2 * 4 * 128
    seconds = summary["train_seconds_timed"]
    assert 0 < seconds < summary["wall_seconds_now"]
    assert summary["images_per_sec"] == pytest.approx(1024 / seconds)
