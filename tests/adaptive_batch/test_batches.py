"""The adaptive batch's settings: each bad argument, and each that the
compiled optimizer cannot grow to, is refused naming it with its value."""

import os
import sys

import keras
import pytest

import keras_largebatch as klb

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
from adaptive_problem import fit  # noqa: E402
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({"batch_size": 0, "max_batch_size": 64}, "batch_size=0"),
        ({"batch_size": 16, "max_batch_size": 40}, "max_batch_size=40"),
        ({"batch_size": 16, "start_multiple": 3}, "start_multiple=3"),
        ({"batch_size": 16, "start_multiple": 0}, "start_multiple=0"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 32)],
          "start_multiple": 2}, "start_multiple=2"),
        ({"batch_size": 16, "max_batch_size": 64, "policy": "linear"},
         "policy='linear'"),
        ({"batch_size": 16, "max_batch_size": 64, "c": 0.0}, "c=0.0"),
        ({"batch_size": 16, "max_batch_size": 64,
          "learning_rate_rule": "cubic"}, "learning_rate_rule='cubic'"),
        ({"batch_size": 16, "max_batch_size": 64, "schedule": [(1, 32)]},
         "schedule=[(1, 32)]"),
        ({"batch_size": 16, "policy": "schedule"}, "schedule=None"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(2, 64),
                                                               (1, 128)]},
         "schedule=[(2, 64), (1, 128)]"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 24)]},
         "schedule=[(1, 24)]"),
        ({"batch_size": 16, "policy": "schedule", "max_batch_size": 32,
          "schedule": [(1, 64)]}, "schedule=[(1, 64)]"),
        ({"batch_size": 16, "max_batch_size": 64, "beta": 1.0}, "beta=1.0"),
        ({"batch_size": 16, "max_batch_size": 64, "interval": 0},
         "interval=0"),
        ({"batch_size": 16, "anneal_fraction": 1.0}, "anneal_fraction=1.0"),
        ({"batch_size": 16, "anneal_fraction": -0.25},
         "anneal_fraction=-0.25"),
        ({"batch_size": 16, "anneal_multiple": 3}, "anneal_multiple=3"),
        ({"batch_size": 16, "policy": "schedule", "schedule": [(1, 32)],
          "anneal_fraction": 0.25}, "anneal_fraction=0.25"),
    ],
)
def test_bad_argument_is_named_with_its_value(kwargs, shown):
    argument = shown.split("=")[0]
    with pytest.raises(ValueError, match=f"`{argument}`") as info:
        klb.AdaptiveBatch(**kwargs)
    assert f"Received: {shown}" in str(info.value)


@pytest.mark.parametrize(
    "k, kwargs, shown",
    [
        (None, {"max_batch_size": 64}, "gradient_accumulation_steps=None"),
        (4, {"max_batch_size": 16}, "max_batch_size=16"),
        (2, {"policy": "schedule", "schedule": [(1, 8), (2, 32)]},
         "schedule=[(1, 8), (2, 32)]"),
    ],
)
def test_fit_refuses_what_the_compiled_optimizer_cannot_grow(k, kwargs,
                                                             shown):
    x, y, w = regression(d=4, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.01, gradient_accumulation_steps=k),
                  "mse")
    with pytest.raises(ValueError) as info:
        fit(model, x, y, klb.AdaptiveBatch(8, **kwargs), epochs=1, batch=8)
    assert f"Received: {shown}" in str(info.value)
