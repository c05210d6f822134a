"""Where the noise scale's gradients come from: gradient accumulation is
required without replicas, and found inside a wrapping optimizer."""

import os
import sys

import keras
import pytest

import keras_largebatch as klb
from keras_largebatch import noise_scale

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


def test_fit_without_accumulation_raises_naming_the_argument():
    x, y, w = regression(d=8, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="`gradient_accumulation_steps`"):
        model.fit(x, y, batch_size=16, verbose=0,
                  callbacks=[klb.GradientNoiseScale(16)])


def test_check_measurable_needs_accumulation():
    with pytest.raises(ValueError) as info:
        noise_scale.check_measurable(keras.optimizers.SGD(0.1))
    assert "Received: gradient_accumulation_steps=None" in str(info.value)


def test_check_measurable_finds_accumulation_inside_mixed_optimizer():
    optimizer = klb.LARSMixed(0.1, gradient_accumulation_steps=4)
    assert noise_scale.check_measurable(optimizer) == "accumulation"
