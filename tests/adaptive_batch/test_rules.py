"""The adaptive batch's learning-rate rules: each registered one against a
closed form written here, AdaScale's gain from the statistics, and `auto`
per optimizer family; on the backend of the run."""

import math
import os
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch.adaptive_batch import rules

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
from adaptive_problem import fit  # noqa: E402
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


def _adascale(scale, ratio):
    if not (math.isfinite(ratio) and ratio > 0):
        return scale
    return (ratio + 1) / (ratio / scale + 1)


# Each registered rule's factor on SGD at S = k / k0, ratio = B_simple / B0,
# written out independently of keras_largebatch.adaptive_batch.rules.
RULE_FACTORS = {
    "unchanged": lambda scale, ratio: 1.0,
    "linear": lambda scale, ratio: scale,
    "sqrt": lambda scale, ratio: math.sqrt(scale),
    "auto": lambda scale, ratio: scale,  # linear for SGD
    "adascale": _adascale,
}


def test_every_registered_rule_has_a_closed_form_here():
    assert set(RULE_FACTORS) == set(rules.RULES)


@pytest.mark.parametrize("rule", list(rules.RULES))
@pytest.mark.parametrize("rate", ["float", "schedule"])
def test_learning_rate_rule_scales_the_compiled_rate(rule, rate):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    base = 0.01 if rate == "float" else \
        keras.optimizers.schedules.ExponentialDecay(0.01, 8, 0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(base, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(
        8, policy="schedule", schedule=[(1, 64)], learning_rate_rule=rule),
        epochs=2, batch=8, shuffle=False)
    # S = 64 / 16; the change is at epoch 1's start, after epoch 0's logs.
    factor = RULE_FACTORS[rule](4.0, history["gradient_noise_scale"][0] / 16)
    expected = 0.01 if rate == "float" else 0.01 * 0.5 ** (16 / 8)
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        expected * factor, rtol=1e-5)


def test_adascale_gain_comes_from_the_statistics_at_the_change():
    x, y, w = regression(d=64, n=4096, sigma=1.0)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(
        16, policy="schedule", schedule=[(1, 128)],
        learning_rate_rule="adascale"), epochs=2, batch=16, shuffle=True)
    ratio = history["gradient_noise_scale"][0] / 32  # B_simple / B0
    gain = (ratio + 1) / (ratio / 4 + 1)  # S = 128 / 32
    assert 1 < gain < 4
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
        1e-9 * gain, rtol=1e-5)


@pytest.mark.parametrize("make, rule", [
    (lambda: keras.optimizers.SGD(0.01, gradient_accumulation_steps=2),
     "linear"),
    (lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01, gradient_accumulation_steps=2)), "linear"),
    (lambda: klb.LARS(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LAMB(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LARSMixed(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: klb.LAMBMixed(0.01, gradient_accumulation_steps=2), "unchanged"),
    (lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2),
     "unchanged"),
])
def test_auto_rule_is_linear_for_sgd_and_unchanged_for_normalised_steps(
        make, rule):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(make(), "mse")
    callback = klb.AdaptiveBatch(8, policy="schedule", schedule=[(1, 64)])
    fit(model, x, y, callback, epochs=2, batch=8, shuffle=False)
    assert callback.resolved_rule() == rule
    factor = float(keras.ops.convert_to_numpy(
        callback.state.learning_rate_factor))
    assert factor == (4.0 if rule == "linear" else 1.0)
