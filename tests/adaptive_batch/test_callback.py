"""`AdaptiveBatch`: annealing over the last epochs, the logs it adds, its
config and registered name; on the backend of the run."""

import inspect
import math
import os
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
from adaptive_problem import B_SIMPLE  # noqa: E402
from adaptive_problem import NOISE_POLICIES  # noqa: E402
from adaptive_problem import OPTIMIZERS  # noqa: E402
from adaptive_problem import decaying_sgd_problem  # noqa: E402
from adaptive_problem import fit  # noqa: E402
from adaptive_problem import reference  # noqa: E402
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


@pytest.mark.parametrize("policy", NOISE_POLICIES)
def test_anneal_brings_the_batch_down_after_the_update_in_progress(policy):
    # 6 micro-batches an epoch; k = 4 from the first (start 2 x k0, and the
    # cap 32 = 4 x 8). Epoch 3 of 4 is the last quarter: capped at 1 x k0.
    # Its first micro-batch is 18, inside an update of 4 (16-19): k = 2
    # starts at 20, and the rate (linear in k) halves there.
    x, y, w, model = decaying_sgd_problem()
    callback = klb.AdaptiveBatch(8, max_batch_size=32, policy=policy,
                                 start_multiple=2, learning_rate_rule="linear",
                                 anneal_fraction=0.25, anneal_multiple=1)
    history = fit(model, x, y, callback, epochs=4, batch=8, shuffle=False)
    assert history["global_batch_size"] == [32, 32, 32, 16]

    def k(i):
        return 4 if i < 20 else 2

    expected, updates = reference(
        np.tile(x, (4, 1)), np.tile(y, (4, 1)), w, 8,
        lambda i: 0.05 * 0.5 ** (i / 6) * k(i) / 2, k)
    assert history["updates"] == [1, 3, 4, updates]
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    factor = callback.state.learning_rate_factor
    assert float(keras.ops.convert_to_numpy(factor)) == 1.0


def test_anneal_takes_the_last_share_of_the_epochs_and_never_grows_past():
    x, y, w = regression(d=64, n=8192, sigma=1.0)
    model = linear_model(w)
    model.compile(OPTIMIZERS["sgd"](), "mse")
    callback = klb.AdaptiveBatch(16, max_batch_size=2048, beta=0.98, c=1.0,
                                 start_multiple=1, anneal_fraction=0.4,
                                 anneal_multiple=2)
    history = fit(model, x, y, callback, epochs=5, batch=16, shuffle=True)
    batches = history["global_batch_size"]
    # 0.4 * 5 = 2 epochs at most 2 x 32; before them, B_simple.
    assert batches[0] == 32
    assert B_SIMPLE / 2 <= batches[1] == batches[2] <= 2 * B_SIMPLE
    assert batches[3:] == [64, 64]
    # 512 micro-batches of 16 an epoch: 128 updates of 64 in each of the
    # last two.
    assert np.diff(history["updates"])[-2:].tolist() == [128, 128]


def test_logs_carry_the_batch_and_the_noise_scale_each_epoch():
    x, y, w = regression(d=8, n=256, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                  "mse")
    history = fit(model, x, y, klb.AdaptiveBatch(16, max_batch_size=64,
                                                 start_multiple=1),
                  epochs=2, batch=16, shuffle=False)
    for name in ("global_batch_size", "updates", "gradient_noise_scale"):
        assert len(history[name]) == 2
    assert history["global_batch_size"][0] == 32


def test_get_config_covers_every_argument():
    callback = klb.AdaptiveBatch(16, policy="schedule", schedule=[(2, 64)],
                                 learning_rate_rule="sqrt", c=2.0)
    config = callback.get_config()
    signature = inspect.signature(klb.AdaptiveBatch.__init__)
    assert set(config) == set(signature.parameters) - {"self"}
    assert klb.AdaptiveBatch(**config).get_config() == config


def test_exported_and_registered_under_package_name():
    assert (keras.saving.get_registered_name(klb.AdaptiveBatch)
            == "keras_largebatch>AdaptiveBatch")
    assert math.isclose(klb.AdaptiveBatch(8, 64).c, 4.0)
