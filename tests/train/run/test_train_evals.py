"""`--evals_per_epoch`: evaluations within each epoch in `evals.csv`, with
the updates taken so far; they change nothing of the training, a resumed
run goes on counting, and precise BN (which they would not use) refuses
them."""

import csv
import os

import numpy as np
import pytest

from keras_largebatch.train.run import driver as train_main

# synthetic: 448 training and 64 validation images; 4 steps an epoch.
TINY = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=8",
        "--steps_per_epoch=4", "--verbose=0", "--augment=none",
        "--warmup_epochs=0", "--image_size=67", "--seed=3"]


def _run(*args):
    return train_main.main(["keras-largebatch-train", *args])


def _evals(model_dir):
    with open(os.path.join(model_dir, "evals.csv"), newline="") as f:
        return [(float(r["epoch"]), float(r["updates"]),
                 float(r["val_accuracy"])) for r in csv.DictReader(f)]


def _weights(model_dir):
    import keras

    model = keras.saving.load_model(os.path.join(model_dir, "final.keras"),
                                    compile=False)
    return model.get_weights()


def test_four_evaluations_an_epoch_with_the_updates_so_far(small, tmp_path):
    out = tmp_path / "run"
    assert _run(*TINY, "--epochs=2", "--evals_per_epoch=4",
                "--gradient_accumulation_steps=2", f"--model_dir={out}") == 0
    rows = _evals(out)
    # Every micro-batch of 4 an epoch, 2 micro-batches per update.
    assert [e for e, _, _ in rows] == [0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2]
    assert [u for _, u, _ in rows] == [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]
    assert all(0 <= a <= 1 for _, _, a in rows)


def test_evaluations_within_epochs_change_nothing_of_the_training(
        small, tmp_path):
    for name, per_epoch in (("plain", 1), ("evals", 2)):
        assert _run(*TINY, "--epochs=2", f"--evals_per_epoch={per_epoch}",
                    f"--model_dir={tmp_path / name}") == 0
    assert not os.path.exists(tmp_path / "plain" / "evals.csv")
    for a, b in zip(_weights(tmp_path / "plain"), _weights(tmp_path / "evals")):
        np.testing.assert_array_equal(a, b)
    with open(tmp_path / "plain" / "history.csv") as f:
        plain = list(csv.DictReader(f))
    with open(tmp_path / "evals" / "history.csv") as f:
        evals = list(csv.DictReader(f))
    # The epoch's training metrics are the epoch's, not an evaluation's.
    for key in ("loss", "accuracy", "val_accuracy"):
        assert [float(r[key]) for r in evals] == pytest.approx(
            [float(r[key]) for r in plain], rel=1e-6)


def test_a_resumed_run_goes_on_counting_updates(small, tmp_path):
    out = tmp_path / "run"
    assert _run(*TINY, "--epochs=1", "--evals_per_epoch=2",
                f"--model_dir={out}") == 0
    assert _run(*TINY, "--epochs=2", "--evals_per_epoch=2",
                f"--model_dir={out}") == 0
    assert [(e, u) for e, u, _ in _evals(out)] == [
        (0.5, 2), (1, 4), (1.5, 6), (2, 8)]


def test_a_run_resumed_with_evaluations_counts_updates_from_its_start(
        small, tmp_path):
    """Started without evaluations within epochs (no evals.csv), resumed
    with them: the updates are the restored run's, not counted from 0."""
    out = tmp_path / "run"
    assert _run(*TINY, "--epochs=1", f"--model_dir={out}") == 0
    assert _run(*TINY, "--epochs=2", "--evals_per_epoch=2",
                f"--model_dir={out}") == 0
    assert [(e, u) for e, u, _ in _evals(out)] == [(1.5, 6), (2, 8)]


def test_a_growing_batch_counts_its_updates_at_the_batch_in_effect(
        small, tmp_path):
    out = tmp_path / "run"
    # Epoch 0: 4 micro-batches of 4 in updates of 8; epoch 1: of 16.
    assert _run(*TINY, "--epochs=2", "--evals_per_epoch=2",
                "--gradient_accumulation_steps=2", "--adaptive_batch=schedule",
                "--batch_schedule=1:16", f"--model_dir={out}") == 0
    assert [(e, u) for e, u, _ in _evals(out)] == [
        (0.5, 1), (1, 2), (1.5, 2.5), (2, 3)]


def test_a_growing_batch_resumed_counts_the_updates_its_optimizer_took(
        small, tmp_path):
    out = tmp_path / "run"
    grows = ("--gradient_accumulation_steps=2", "--adaptive_batch=schedule",
             "--batch_schedule=1:16")
    # Updates of 8 in epoch 0 (two), of 16 from epoch 1 (one an epoch).
    assert _run(*TINY, *grows, "--epochs=2", f"--model_dir={out}") == 0
    assert _run(*TINY, *grows, "--epochs=3", "--evals_per_epoch=2",
                f"--model_dir={out}") == 0
    assert [(e, u) for e, u, _ in _evals(out)] == [(2.5, 3.5), (3, 4)]


def test_precise_bn_refuses_evaluations_within_epochs(small, tmp_path, capsys):
    capsys.readouterr()
    assert _run(*TINY, "--evals_per_epoch=4", "--precise_bn_batches=2",
                f"--model_dir={tmp_path / 'run'}") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "evals_per_epoch=4" in err
    assert not os.path.exists(tmp_path / "run")
