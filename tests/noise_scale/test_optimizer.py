"""`NoiseScaleOptimizer`: which updates it counts and measures, that it wraps
without changing training, and that its statistics are saved by name with
the optimizer; on the backend of the run."""

import os
import sys

import keras
import numpy as np
import pytest
from keras import ops

import keras_largebatch as klb
from keras_largebatch import noise_scale

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


@pytest.mark.parametrize("interval", [1, 3])
def test_every_update_counted_and_every_interval_th_measured(interval):
    # 24 micro-batches of 16, k = 2: 12 updates, measured: 0, 3, 6, 9.
    x, y, w = regression(d=8, n=384, sigma=0.5)
    model = linear_model(w)
    model.compile(klb.NoiseScaleOptimizer(
        keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
        interval=interval), "mse")
    model.fit(x.astype("float32"), y.astype("float32"), batch_size=16,
              epochs=1, shuffle=False, verbose=0)
    state = model.optimizer
    assert int(ops.convert_to_numpy(state.updates)) == 12
    assert float(ops.convert_to_numpy(state.samples)) == 12 // interval


@pytest.mark.parametrize("interval", [1, 3])
def test_a_skipped_step_is_not_counted_as_an_update(interval):
    # Micro-batch 5 (the last of update 2, not measured at interval 3)
    # overflows: LARSMixed skips it, the counter stops at 23 of 24, and
    # 23 accepted micro-batches hold 11 whole updates.
    x, y, w = regression(d=8, n=384, sigma=0.5)
    x = x.astype("float32")
    x[5 * 16] = 1e30
    model = linear_model(w)
    model.compile(klb.NoiseScaleOptimizer(
        klb.LARSMixed(1e-9, gradient_accumulation_steps=2),
        interval=interval), "mse")
    model.fit(x, y.astype("float32"), batch_size=16, epochs=1,
              shuffle=False, verbose=0)
    state = model.optimizer
    assert int(ops.convert_to_numpy(state.iterations)) == 11
    assert int(ops.convert_to_numpy(state.updates)) == 11


def test_training_is_unchanged_and_the_optimizer_is_wrapped_not_patched():
    x, y, w = regression(d=8, n=256, sigma=0.5)
    weights, counts = [], []
    for callbacks in ([], [klb.GradientNoiseScale(16)]):
        model = linear_model(w)
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9,
                                         gradient_accumulation_steps=2)
        model.compile(optimizer, "mse")
        optimizer.build(model.trainable_variables)
        before = dict(vars(optimizer))
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                  callbacks=callbacks)
        weights.append(model.get_weights()[0])
        # Nothing set on the instance: no method, no extra variable.
        assert set(vars(optimizer)) == set(before)
        counts.append(len(optimizer.variables))
    np.testing.assert_array_equal(weights[0], weights[1])
    assert counts[0] == counts[1]
    assert isinstance(model.optimizer, klb.NoiseScaleOptimizer)
    assert model.optimizer.inner_optimizer is optimizer


def test_statistics_are_saved_with_the_optimizer(tmp_path):
    x, y, w = regression(d=8, n=256, sigma=0.5)

    def compiled():
        model = linear_model(w)
        model.compile(klb.NoiseScaleOptimizer(keras.optimizers.SGD(
            0.0, gradient_accumulation_steps=2)), "mse")
        model.optimizer.build(model.trainable_variables)
        return model

    model = compiled()
    callback = klb.GradientNoiseScale(16)
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[callback])
    path = str(tmp_path / "gns.weights.h5")
    model.save_weights(path)
    restored = compiled()
    restored.load_weights(path)
    assert restored.optimizer.result(16) == callback.result()
    assert float(keras.ops.convert_to_numpy(restored.optimizer.updates)) == 8


def test_own_variables_are_saved_by_name_and_statistics_named():
    x, y, w = regression(d=8, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(klb.NoiseScaleOptimizer(keras.optimizers.SGD(
        0.0, gradient_accumulation_steps=2)), "mse")
    model.fit(x, y, batch_size=16, verbose=0)
    state = model.optimizer
    store = {}
    state.save_own_variables(store)
    assert set(noise_scale.STATISTIC_VARIABLES) | {
        "accumulation_steps", "learning_rate_factor"} <= set(store)
    statistics = state.statistics
    assert statistics._fields == noise_scale.Statistics._fields
    for field, name in noise_scale.STATISTIC_VARIABLES._asdict().items():
        assert getattr(statistics, field).name == name
        np.testing.assert_array_equal(
            store[name], ops.convert_to_numpy(getattr(statistics, field)))
    assert int(store["updates"]) == 2
    # Loaded by name, whatever the order of the store.
    other = linear_model(w)
    other.compile(klb.NoiseScaleOptimizer(keras.optimizers.SGD(
        0.0, gradient_accumulation_steps=2)), "mse")
    other.optimizer.build(other.trainable_variables)
    other.optimizer.load_own_variables(dict(reversed(list(store.items()))))
    assert other.optimizer.result(16) == state.result(16)
