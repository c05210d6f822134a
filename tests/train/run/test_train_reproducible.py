"""Same seed, same weights: twice, and after a run killed mid-epoch."""

import numpy as np
import pytest
import keras

from keras_largebatch.train import data
from keras_largebatch.train.run import driver as train_main

BACKEND = keras.backend.backend()
# Augmentation, dropout (in `small_model`), shuffling and steps_per_epoch
# repeating the data: every source of randomness a run has.
ARGS = ["--dataset=synthetic", "--num_classes=3", "--global_batch_size=32",
        "--steps_per_epoch=5", "--epochs=3", "--warmup_epochs=0.5",
        "--augment=crop_flip", "--verbose=0", "--image_size=67",
        "--deterministic"]


def _run(*args):
    return train_main.main(["keras-largebatch-train", *args])


def _final_weights(model_dir):
    model = keras.saving.load_model(model_dir / "final.keras")
    return [w.numpy() for w in model.weights]


class _Killed(Exception):
    pass


class _KillAt(keras.callbacks.Callback):
    def __init__(self, epoch, step):
        super().__init__()
        self.at = (epoch, step)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise _Killed


@pytest.mark.skipif(BACKEND == "tensorflow",
                    reason="TensorFlow: in subprocesses, below")
def test_same_seed_same_weights_and_a_killed_run_resumes_to_them(
        small, tmp_path, monkeypatch):
    assert _run(*ARGS, f"--model_dir={tmp_path}/a") == 0
    assert _run(*ARGS, f"--model_dir={tmp_path}/b") == 0
    a, b = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)

    # Killed at step 3 of epoch 2, then the same command again.
    real_fit = keras.Model.fit

    def fit_killed(self, *args, callbacks=(), **kwargs):
        return real_fit(self, *args, callbacks=[*callbacks, _KillAt(1, 2)],
                        **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(keras.Model, "fit", fit_killed)
        with pytest.raises(_Killed):
            _run(*ARGS, f"--model_dir={tmp_path}/c")
    assert _run(*ARGS, f"--model_dir={tmp_path}/c") == 0
    c = _final_weights(tmp_path / "c")
    for x, y in zip(a, c):
        np.testing.assert_array_equal(x, y)

    # Another seed: other weights (the test can fail).
    assert _run(*ARGS, "--seed=1", f"--model_dir={tmp_path}/d") == 0
    d = _final_weights(tmp_path / "d")
    assert any(not np.array_equal(x, y) for x, y in zip(a, d))


def _batches(spec, peek=False, **kwargs):
    train, _ = data.batch(spec, 16, seed=3, steps_per_epoch=3, epochs=3,
                          **kwargs)
    if peek:  # As Keras does before fitting, to build the model.
        next(iter(train))
    return [x.numpy() for x, _ in train]


@pytest.mark.tensorflow
def test_data_of_an_epoch_depends_on_seed_and_epoch_only():
    pytest.importorskip("tensorflow")  # The tf.data pipeline's property.
    from keras_largebatch.train.data import augment

    spec = data.load_synthetic(12, 3, num_examples=60)
    aug = augment.build("crop_flip", 12)
    full = _batches(spec, augmenter=aug)
    resumed = _batches(spec, peek=True, augmenter=aug, initial_epoch=2)
    assert len(full) == 9 and len(resumed) == 3
    for x, y in zip(full[6:], resumed):
        np.testing.assert_array_equal(x, y)
    # Epochs differ from each other.
    assert not np.array_equal(full[0], full[3])




@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's flag")
def test_tensorflow_runs_are_identical_under_deterministic(tmp_path):
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "small_command.py")

    def run(model_dir, kill=None):
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        env.pop("KILL_AT_EPOCH_STEP", None)
        if kill:
            env["KILL_AT_EPOCH_STEP"] = kill
        return subprocess.run(
            [sys.executable, script, *ARGS,
             f"--model_dir={model_dir}"],
            env=env, capture_output=True, text=True, timeout=300)

    assert run(tmp_path / "a").returncode == 0
    assert run(tmp_path / "b").returncode == 0
    assert run(tmp_path / "c", kill="1,2").returncode == 9
    proc = run(tmp_path / "c")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a = _final_weights(tmp_path / "a")
    for other in ("b", "c"):
        for x, y in zip(a, _final_weights(tmp_path / other)):
            np.testing.assert_array_equal(x, y)
