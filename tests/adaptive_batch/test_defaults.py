"""The adaptive batch's defaults: from the micro-batch alone, each optimizer
family starts at 4x, follows 4 x B_simple up to 8x, with its rate rule."""

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


FAMILIES = {
    # Keras' SGD, alone and loss-scaled: the rate linear in the batch.
    "sgd": (lambda: keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2),
            "linear"),
    "lso_sgd": (lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(1e-9, gradient_accumulation_steps=2)),
        "linear"),
    # Normalised steps: the rate unchanged.
    "lars": (lambda: klb.LARS(1e-9, gradient_accumulation_steps=2),
             "unchanged"),
    "lars_mixed": (lambda: klb.LARSMixed(1e-9, gradient_accumulation_steps=2),
                   "unchanged"),
    "lamb": (lambda: klb.LAMB(1e-9, gradient_accumulation_steps=2),
             "unchanged"),
    "lamb_mixed": (lambda: klb.LAMBMixed(1e-9, gradient_accumulation_steps=2),
                   "unchanged"),
    "adam": (lambda: keras.optimizers.Adam(1e-9,
                                           gradient_accumulation_steps=2),
             "unchanged"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_defaults_start_at_4x_follow_4_b_simple_up_to_8x(family):
    make, rule = FAMILIES[family]
    x, y, w = regression(d=64, n=2048, sigma=1.0)
    model = linear_model(w)
    model.compile(make(), "mse")
    callback = klb.AdaptiveBatch(16)  # only the micro-batch: the defaults
    history = fit(model, x, y, callback, epochs=2, batch=16, shuffle=True)
    # Compiled at 16 * 2 = 32: 128 from the first update, then 4 x B_simple
    # (~516) capped at 8 x 32 = 256; the rate x 4 then x 8 (linear) or x 1.
    assert history["global_batch_size"] == [128, 256]
    assert callback.max_batch_size == 256
    assert callback.resolved_rule() == rule
    factor = float(keras.ops.convert_to_numpy(
        callback.state.learning_rate_factor))
    assert factor == (8.0 if rule == "linear" else 1.0)
    # 128 micro-batches an epoch: 16 updates of 8, then 8 of 16.
    assert history["updates"] == [16, 24]
