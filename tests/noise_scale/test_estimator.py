"""The noise-scale estimator: `fit`'s logs against a float64 NumPy reference
of the estimator and its moving averages, and against a closed form; on the
backend of the run (KERAS_BACKEND)."""

import os
import sys

import keras
import numpy as np
import pytest

import keras_largebatch as klb
from keras_largebatch import noise_scale

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
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


_DATA_PARALLEL = """
import json, os, sys
import numpy as np, keras, jax
import keras_largebatch as klb
sys.path.insert(0, {tests!r})
from test_estimator import fit_logs, regression
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
