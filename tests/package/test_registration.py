"""`import keras_largebatch` registers every serializable object of the
package, so that `keras.saving.load_model` finds them after it alone."""

import importlib
import json
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_largebatch
from keras_largebatch import api_export
from keras_largebatch.applications import ResNetCIFAR

PREFIX = "keras_largebatch>"

# A fresh interpreter that imports keras and keras_largebatch only, then
# loads the saved model.
_LOAD = """
import json, sys
import numpy as np
import keras, keras_largebatch
registered = sorted(k for k in keras.saving.get_custom_objects()
                    if k.startswith("keras_largebatch>"))
model = keras.saving.load_model(sys.argv[1])
np.save(sys.argv[2], np.asarray(model.predict(np.load(sys.argv[3]), verbose=0)))
print(json.dumps({"registered": registered,
                  "optimizer": type(model.optimizer).__name__}))
"""

# Every module of the package imported (the TensorFlow-only ones included).
_IMPORT_ALL = """
import importlib, json, pkgutil
import keras, keras_largebatch
names = [m.name for m in pkgutil.walk_packages(
    keras_largebatch.__path__, "keras_largebatch.")
    if not m.name.endswith("__main__")
    and m.module_finder.find_spec(m.name).origin.endswith(".py")]
for name in names + ["keras_largebatch.applications"]:
    importlib.import_module(name)
print(json.dumps(sorted(k for k in keras.saving.get_custom_objects()
                        if k.startswith("keras_largebatch>"))))
"""


def _python(*args):
    proc = subprocess.run([sys.executable, "-c", *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved_and_loaded(tmp_path_factory):
    """A ResNetCIFAR (with `PadChannels`) compiled with LARS, saved here and
    loaded in a fresh process; its predictions in both."""
    folder = tmp_path_factory.mktemp("registration")
    keras.utils.set_random_seed(7)
    model = ResNetCIFAR(depth=8, width=4, input_shape=(8, 8, 3), classes=3)
    assert any(type(layer).__name__ == "PadChannels" for layer in model.layers)
    schedule = keras_largebatch.WarmupPolynomialDecay(
        peak_learning_rate=0.1, warmup_steps=2, decay_steps=10)
    model.compile(optimizer=keras_largebatch.LARS(learning_rate=schedule),
                  loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    model.fit(x, np.array([0, 1, 2, 1]), epochs=1, verbose=0)
    path, inputs = folder / "final.keras", folder / "x.npy"
    model.save(path)
    np.save(inputs, x)
    report = _python(_LOAD, str(path), str(folder / "y.npy"), str(inputs))
    return (np.asarray(model.predict(x, verbose=0)),
            np.load(folder / "y.npy"), report)


def test_a_saved_model_with_pad_channels_loads_after_import_keras_largebatch(
        saved_and_loaded):
    expected, loaded, report = saved_and_loaded
    assert report["optimizer"] == "LARS"
    np.testing.assert_allclose(loaded, expected, rtol=1e-6, atol=1e-7)


def test_every_registered_class_is_there_after_import_keras_largebatch(
        saved_and_loaded):
    everything = _python(_IMPORT_ALL)
    assert f"{PREFIX}PadChannels" in everything
    assert f"{PREFIX}LARSMixed" in everything
    assert saved_and_loaded[2]["registered"] == everything


def test_all_is_the_exports_under_the_package():
    assert keras_largebatch.__all__ == api_export.public_names("keras_largebatch")
    assert {"LARS", "LARSMixed", "PreciseBatchNorm",
            "WarmupPolynomialDecay"} <= set(keras_largebatch.__all__)
    for path, symbol in api_export.EXPORTS.items():
        module, name = path.rsplit(".", 1)
        if module == "keras_largebatch":
            assert name in keras_largebatch.__all__
        assert getattr(importlib.import_module(module), name) is symbol, path


def test_exported_keras_objects_are_registered_under_the_package():
    for symbol in (keras_largebatch.LARS, keras_largebatch.LAMBMixed,
                   keras_largebatch.WarmupPolynomialDecay,
                   keras_largebatch.GradientNoiseScale,
                   keras_largebatch.no_decay_variables):
        assert (keras.saving.get_registered_name(symbol)
                == PREFIX + symbol.__name__)
    # A callback without get_config is public but not serializable.
    assert (keras.saving.get_registered_name(keras_largebatch.PreciseBatchNorm)
            == "PreciseBatchNorm")


def test_export_path_must_name_the_object_under_the_package():
    def helper():
        pass

    with pytest.raises(ValueError, match="Received: path='other.helper'"):
        api_export.keras_largebatch_export("other.helper")
    with pytest.raises(ValueError, match="Received: path='keras_largebatch.x'"):
        api_export.keras_largebatch_export("keras_largebatch.x")(helper)

