"""The noise-scale tests' problem: a linear regression whose B_simple is
known in closed form (tests/noise_scale/test_estimator.py derives it)."""

import keras
import numpy as np


def regression(d, n, sigma, seed=0):
    """y = x.w* + noise, x ~ N(0, I_d), and a start w = w* + e, |e| = 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w_star = rng.standard_normal((d, 1))
    e = rng.standard_normal((d, 1))
    e /= np.linalg.norm(e)
    y = x @ w_star + sigma * rng.standard_normal((n, 1))
    return x, y, w_star + e


def linear_model(w):
    """A bias-free Dense(1) starting at `w`."""
    model = keras.Sequential([
        keras.Input((w.shape[0],)),
        keras.layers.Dense(1, use_bias=False),
    ])
    model.layers[0].kernel.assign(w.astype("float32"))
    return model
