"""`GradientNoiseScale`: a second fit measures again; its arguments, config
and registered name."""

import inspect
import os
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


def test_second_fit_with_the_callback_measures_again():
    x, y, w = regression(d=8, n=256, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                  "mse")
    for _ in range(2):
        history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False,
                            verbose=0, callbacks=[klb.GradientNoiseScale(16)])
        assert np.isfinite(history.history["gradient_noise_scale"][0])


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": 64.0}, "batch_size=64.0"),
        ({"batch_size": 64, "beta": 1.0}, "beta=1.0"),
        ({"batch_size": 64, "beta": -0.1}, "beta=-0.1"),
        ({"batch_size": 64, "interval": 0}, "interval=0"),
    ],
)
def test_bad_argument_is_named_with_its_value(kwargs, shown):
    argument = shown.split("=")[0]
    with pytest.raises(ValueError, match=f"`{argument}`") as info:
        klb.GradientNoiseScale(**kwargs)
    assert f"Received: {shown}" in str(info.value)


def test_get_config_covers_every_argument():
    config = klb.GradientNoiseScale(64, beta=0.9).get_config()
    signature = inspect.signature(klb.GradientNoiseScale.__init__)
    assert set(config) == set(signature.parameters) - {"self"}
    assert klb.GradientNoiseScale(**config).get_config() == config


def test_callback_is_registered_under_package_name():
    assert (keras.saving.get_registered_name(klb.GradientNoiseScale)
            == "keras_largebatch>GradientNoiseScale")
