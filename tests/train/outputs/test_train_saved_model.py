"""The saved model takes the data set's own images (issue #61): final.keras
loads without the package and scores the raw images as the run did."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_largebatch.train import PROG
from keras_largebatch.train.data import augment_numpy
from keras_largebatch.train.outputs import exported
from keras_largebatch.train.run import driver as train_main
from keras_largebatch.train.recipe import models
from keras_largebatch.train.data import loaders

# A fresh process that cannot import the package: final.keras on digits'
# validation images as scikit-learn gives them (8x8, 0..16), split as the
# command splits them with seed 0.
_SCORE = """
import sys
sys.modules["keras_largebatch"] = None
import keras, numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
digits = load_digits()
_, x_val, _, y_val = train_test_split(
    digits.images[..., None], digits.target, test_size=0.2,
    stratify=digits.target, random_state=0)
model = keras.saving.load_model(sys.argv[1])
print(np.mean(np.argmax(model.predict(x_val, verbose=0), -1) == y_val))
"""


def _linear_model(model_name, image_size, num_classes, bn_momentum=None,
                  channels=3, *args, **kwargs):
    """A model that learns digits in a few steps: pooled pixels, softmax."""
    inputs = keras.Input((image_size, image_size, channels))
    x = keras.layers.AveragePooling2D(8, name="pool")(inputs)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax",
                                 name="predictions")(x)
    return keras.Model(inputs, outputs, name=model_name)


def test_final_keras_scores_the_raw_digits_as_the_run_did_without_package(
        monkeypatch, tmp_path):
    monkeypatch.setattr(models, "build_model", _linear_model)
    model_dir = tmp_path / "run"
    assert train_main.main([
        PROG, f"--model_dir={model_dir}", "--global_batch_size=64",
        "--epochs=2", "--verbose=0", "--optimizer=sgd",
        "--base_learning_rate=1.0", "--warmup_epochs=0"]) == 0
    reported = json.loads((model_dir / "summary.json").read_text())[
        "val_accuracy"]
    proc = subprocess.run(
        [sys.executable, "-c", _SCORE, str(model_dir / "final.keras")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = float(proc.stdout.split()[-1])
    assert reported > 0.5, reported  # It learned: a chance score says little.
    # The same images right (the summary holds Keras' float32 mean).
    assert round(scored * 360) == round(reported * 360), (scored, reported)


def _uint8_spec(channels):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (24, 28, 28, 1)).astype("uint8")
    y = rng.integers(0, 10, 24)
    spec = loaders.from_arrays("fashion_mnist", x / 255.0, y, x / 255.0, y,
                               10, 67, channels)
    return spec, x.astype("float32")


@pytest.mark.parametrize("channels", [3, None], ids=["to_rgb", "own"])
def test_the_saved_model_does_the_pipelines_resize_channels_and_scaling(
        small, channels):
    spec, raw = _uint8_spec(channels)
    model = models.build_model("alexnet_bn", 67, 10, channels=spec.channels)
    pipeline = (augment_numpy.resize(raw / 255.0, 67, spec.channels)
                - 0.5) * 2.0
    wrapped = exported.exported(model, spec)
    assert [type(layer).__name__ for layer in wrapped.layers[:4]] == [
        "InputLayer", "Rescaling", "Resizing",
        "Concatenate" if channels else "Conv2D"]
    assert wrapped.inputs[0].shape[1:] == (28, 28, 1)
    np.testing.assert_allclose(wrapped.predict(raw, verbose=0),
                               model.predict(pipeline, verbose=0),
                               atol=1e-5)
    # The trained layers are stock Keras copies of the model's own (loading
    # needs no package), under their own names, with their weights.
    conv, trained = wrapped.get_layer("conv1"), model.get_layer("conv1")
    assert type(conv) is keras.layers.Conv2D and conv is not trained
    for a, b in zip(conv.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_saved_model_is_read_back_into_the_training_model(small,
                                                           tmp_path):

    spec, _ = _uint8_spec(3)
    model = models.build_model("alexnet_bn", 67, 10)
    path = str(tmp_path / "final.keras")
    exported.save_keras(model, spec, path)
    other = models.build_model("alexnet_bn", 67, 10)
    other.load_weights(path)  # What --mode=eval and a resume do.
    for a, b in zip(model.get_weights(), other.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert isinstance(keras.saving.load_model(path), keras.Model)
