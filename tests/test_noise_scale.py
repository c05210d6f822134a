"""GradientNoiseScale: the estimator against float64 NumPy, a closed form,
and its arguments; on the backend of the run (KERAS_BACKEND)."""

import inspect
import os
import sys

import keras
import numpy as np
import pytest
from keras import ops

import keras_largebatch as klb
from keras_largebatch import noise_scale

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regression_problem import linear_model  # noqa: E402
from regression_problem import regression  # noqa: E402


def reference(x, y, w, batch, k, beta, interval=1):
    """float64 (B_simple, |G|^2, tr Sigma) after one pass over (x, y) in
    order, for L = mean((x.w - y)^2) with `w` held still (Appendix A of
    arXiv:1812.06162, each term a bias-corrected EMA), measuring every
    `interval`-th update."""
    grads = [
        2.0 * xb.T @ (xb @ w - yb) / len(xb)
        for xb, yb in zip(np.split(x, len(x) // batch),
                          np.split(y, len(y) // batch))
    ]
    ema_g = ema_t = 0.0
    updates = 0
    for i in range(0, len(grads) - k + 1, k * interval):
        micro = grads[i:i + k]
        small = np.mean([np.sum(g ** 2) for g in micro])
        big = np.sum(np.mean(micro, axis=0) ** 2)
        b_small, b_big = batch, k * batch
        grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
        trace = (small - big) / (1 / b_small - 1 / b_big)
        ema_g = beta * ema_g + (1 - beta) * grad_sq
        ema_t = beta * ema_t + (1 - beta) * trace
        updates += 1
    debias = 1 - beta ** updates
    return ema_t / ema_g, ema_g / debias, ema_t / debias


def fit_logs(optimizer, x, y, w, batch, beta, epochs=1, shuffle=False,
             interval=None):
    model = linear_model(w)
    model.compile(optimizer, "mse")
    history = model.fit(
        x.astype("float32"), y.astype("float32"), batch_size=batch,
        epochs=epochs, shuffle=shuffle, verbose=0,
        callbacks=[klb.GradientNoiseScale(batch, beta=beta,
                                          interval=interval)])
    return {name: history.history[name] for name in noise_scale.LOG_NAMES}


@pytest.mark.parametrize("k, interval", [(2, None), (2, 1), (3, 1), (2, 3)])
def test_logs_match_float64_reference_of_estimator_and_ema(k, interval):
    x, y, w = regression(d=8, n=384, sigma=0.5)
    logs = fit_logs(keras.optimizers.SGD(0.0, gradient_accumulation_steps=k),
                    x, y, w, batch=16, beta=0.9, interval=interval)
    # None: the callback's default, MONITOR_INTERVAL.
    expected = reference(x, y, w, batch=16, k=k, beta=0.9,
                         interval=interval or noise_scale.MONITOR_INTERVAL)
    for name, value in zip(noise_scale.LOG_NAMES, expected):
        np.testing.assert_allclose(logs[name][-1], value, rtol=1e-4)


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


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
    # LARS needs a rate > 0; at 1e-9 the weights stay still to float32.
    "lars": lambda: klb.LARS(1e-9, gradient_accumulation_steps=2),
    # Loss-scaled by 2**15: the components are off by 2**30 if not unscaled.
    "lars_mixed": lambda: klb.LARSMixed(1e-9, gradient_accumulation_steps=2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_regression_noise_scale_within_ten_percent_of_closed_form(name):
    # Per example l = (x.e - eps)^2, g = 2x(x.e - eps): G = 2e and, for
    # Gaussian x, tr Sigma = 4((d + 2)|e|^2 + d sigma^2) - 4|e|^2, so
    # B_simple = ((d + 1)|e|^2 + d sigma^2) / |e|^2 = 129 here.
    d, sigma = 64, 1.0
    x, y, w = regression(d=d, n=16384, sigma=sigma)
    logs = fit_logs(OPTIMIZERS[name](), x, y, w, batch=64, beta=0.995,
                    epochs=2, shuffle=True, interval=1)
    np.testing.assert_allclose(logs["gradient_noise_scale"][-1],
                               (d + 1) + d * sigma ** 2, rtol=0.1)
    np.testing.assert_allclose(logs["gns_grad_sq_norm"][-1], 4.0, rtol=0.1)
    np.testing.assert_allclose(logs["gns_trace_cov"][-1],
                               4 * ((d + 1) + d * sigma ** 2), rtol=0.1)


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


def test_second_fit_with_the_callback_measures_again():
    x, y, w = regression(d=8, n=256, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                  "mse")
    for _ in range(2):
        history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False,
                            verbose=0, callbacks=[klb.GradientNoiseScale(16)])
        assert np.isfinite(history.history["gradient_noise_scale"][0])


def test_fit_without_accumulation_raises_naming_the_argument():
    x, y, w = regression(d=8, n=64, sigma=0.5)
    model = linear_model(w)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(ValueError, match="`gradient_accumulation_steps`"):
        model.fit(x, y, batch_size=16, verbose=0,
                  callbacks=[klb.GradientNoiseScale(16)])


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


def test_check_measurable_needs_accumulation():
    with pytest.raises(ValueError) as info:
        noise_scale.check_measurable(keras.optimizers.SGD(0.1))
    assert "Received: gradient_accumulation_steps=None" in str(info.value)


def test_check_measurable_finds_accumulation_inside_mixed_optimizer():
    optimizer = klb.LARSMixed(0.1, gradient_accumulation_steps=4)
    assert noise_scale.check_measurable(optimizer) == "accumulation"


def test_get_config_covers_every_argument():
    config = klb.GradientNoiseScale(64, beta=0.9).get_config()
    signature = inspect.signature(klb.GradientNoiseScale.__init__)
    assert set(config) == set(signature.parameters) - {"self"}
    assert klb.GradientNoiseScale(**config).get_config() == config


def test_callback_is_registered_under_package_name():
    assert (keras.saving.get_registered_name(klb.GradientNoiseScale)
            == "keras_largebatch>GradientNoiseScale")


@pytest.mark.parametrize(
    "b_simple, batch, words",
    [
        (4096.0, 128, "room to grow"),
        (200.0, 128, "near the critical batch"),
        (100.0, 4096, "mostly wasted"),
        (float("nan"), 128, "not measured"),
        (-3.0, 128, "not measured"),
    ],
)
def test_describe_says_in_one_line_what_the_batch_gains(b_simple, batch,
                                                        words):
    line = noise_scale.describe(b_simple, batch)
    assert words in line and "\n" not in line


def test_describe_gives_steps_relative_to_minimum():
    # B = B_simple: S = 2 S_min, E = 2 E_min; doubling B: 1.5/2 = 75%.
    line = noise_scale.describe(512.0, 512)
    assert "steps 2.00x the minimum, examples 2.00x" in line
    assert "takes 75% of the steps" in line


_DATA_PARALLEL = """
import json, os, sys
import numpy as np, keras, jax
import keras_largebatch as klb
sys.path.insert(0, {tests!r})
from test_noise_scale import fit_logs, regression
keras.utils.set_random_seed(100)
keras.distribution.set_distribution(
    keras.distribution.DataParallel(devices=jax.devices()))
x, y, w = regression(d=64, n=16384, sigma=1.0)
# Every update measured (256): the estimate's spread is a few percent, well
# inside the tolerance (every 8th, 32 of them, spreads about 10%).
logs = fit_logs(keras.optimizers.SGD(0.0, gradient_accumulation_steps=2),
                x, y, w, batch=64, beta=0.995, epochs=2, shuffle=True,
                interval=1)
print(json.dumps(dict(logs, devices=len(jax.devices()))))
"""


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="keras.distribution.DataParallel on JAX")
def test_jax_data_parallel_on_two_devices_measures_the_global_batch():
    # The gradient is global under DataParallel: accumulation is the source.
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="jax",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    code = _DATA_PARALLEL.format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=300,
                          capture_output=True, text=True, check=True)
    logs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert logs["devices"] == 2
    np.testing.assert_allclose(logs["gradient_noise_scale"][-1], 129.0,
                               rtol=0.1)
