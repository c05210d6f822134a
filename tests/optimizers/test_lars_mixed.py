"""LARSMixed: loss scaling, overflow skip, float32 master weights, fit."""

import keras
import numpy as np
import pytest

import keras_largebatch as klb


def lars_reference(w, grads, lr, momentum, eta, weight_decay):
    """Float64 LARS for one kernel-like variable (decayed and adapted)."""
    w = np.array(w, np.float64)
    v = np.zeros_like(w)
    for g in grads:
        g = np.asarray(g, np.float64)
        trust = eta * np.linalg.norm(w) / (
            np.linalg.norm(g) + weight_decay * np.linalg.norm(w)
        )
        v = momentum * v + lr * trust * (g + weight_decay * w)
        w = w - v
    return w


def test_lars_runs_on_unscaled_gradients(apply_step):
    w0 = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    var = keras.Variable(w0, name="kernel")
    grads = [np.random.default_rng(i).normal(size=(3, 4)).astype("float32") for i in (1, 2, 3)]
    optimizer = klb.LARSMixed(0.1, momentum=0.9, eta=0.01, weight_decay=1e-2, initial_scale=256.0)
    for g in grads:
        apply_step(optimizer, [g * 256.0], [var])
    expected = lars_reference(w0, grads, 0.1, 0.9, 0.01, 1e-2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(var), expected, rtol=2e-5)


def test_overflow_skips_step_and_halves_scale(apply_step):
    rng = np.random.default_rng(0)
    kernel = keras.Variable(rng.normal(size=(3, 4)).astype("float32"), name="kernel")
    bias = keras.Variable(rng.normal(size=(4,)).astype("float32"), name="bias")
    optimizer = klb.LARSMixed(0.1, momentum=0.9, eta=0.01, weight_decay=1e-2,
                              initial_scale=1024.0)
    g1 = [rng.normal(size=(3, 4)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    apply_step(optimizer, [g * 1024.0 for g in g1], [kernel, bias])
    before = [keras.ops.convert_to_numpy(v) for v in [kernel, bias] + optimizer.inner_optimizer.variables]

    bad = [g1[0] * 1024.0, np.array([1.0, np.inf, 0.0, 2.0], "float32")]
    apply_step(optimizer, bad, [kernel, bias])

    after = [keras.ops.convert_to_numpy(v) for v in [kernel, bias] + optimizer.inner_optimizer.variables]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)  # nothing written, iterations too
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == 512.0
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 1

    nan_grads = [np.full((3, 4), np.nan, "float32"), g1[1]]
    apply_step(optimizer, nan_grads, [kernel, bias])
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == 256.0
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(kernel), before[0])


def test_scale_doubles_after_dynamic_growth_steps(apply_step):
    var = keras.Variable(np.ones((2, 2), "float32"), name="kernel")
    optimizer = klb.LARSMixed(0.1, initial_scale=8.0, dynamic_growth_steps=3)
    scales = []
    for _ in range(7):
        apply_step(optimizer, [np.ones((2, 2), "float32")], [var])
        scales.append(float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)))
    assert scales == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_float16_weight_moves_below_float16_resolution_with_masters(apply_step):
    # 1e-4 per step is below float16's spacing at 1.0 (2**-10 ~ 9.8e-4):
    # rounded in float16 the weight never moves; with a float32 master it
    # reaches 0.99 after 100 steps.
    scale = 2.0**10
    mixed_var = keras.Variable(np.ones((4,), "float16"), dtype="float16", name="b")
    mixed = klb.LARSMixed(1e-4, momentum=0.0, initial_scale=scale)
    plain_var = keras.Variable(np.ones((4,), "float16"), dtype="float16", name="b")
    plain = klb.LARS(1e-4, momentum=0.0)
    grad = np.ones((4,), "float16")
    for _ in range(100):
        apply_step(mixed, [grad * np.float16(scale)], [mixed_var])
        plain.apply([grad], [plain_var])

    assert keras.backend.standardize_dtype(mixed_var.dtype) == "float16"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(mixed_var).astype("float32"), 0.99, atol=5e-4
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(plain_var), 1.0)
    master = [v for v in mixed.variables if v.name.endswith("_master")]
    assert len(master) == 1
    np.testing.assert_allclose(keras.ops.convert_to_numpy(master[0]), 0.99, rtol=1e-5)


def test_master_resyncs_after_weights_set_from_outside(apply_step):
    var = keras.Variable(np.ones((4,), "float16"), dtype="float16", name="b")
    optimizer = klb.LARSMixed(1e-4, momentum=0.0, initial_scale=1.0)
    apply_step(optimizer, [np.ones((4,), "float16")], [var])
    var.assign(np.full((4,), 3.0, "float16"))
    apply_step(optimizer, [np.ones((4,), "float16")], [var])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(var).astype("float32"), 3.0 - 1e-4, atol=2e-3
    )


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX only")
def test_eager_apply_on_jax_equals_stateless_apply(apply_step):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 4)).astype("float32")
    grads = [rng.normal(size=(3, 4)).astype("float32") * 64 for _ in range(3)]
    grads[1][0, 0] = np.inf
    results = []
    for eager in (True, False):
        var = keras.Variable(w0, name="kernel")
        optimizer = klb.LARSMixed(0.1, eta=0.01, initial_scale=64.0)
        for g in grads:
            if eager:
                optimizer.apply([g], [var])
            else:
                apply_step(optimizer, [g], [var])
        results.append((keras.ops.convert_to_numpy(var),
                        float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    assert results[0][1] == results[1][1] == 32.0


def test_compile_keeps_lars_mixed_under_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = klb.LARSMixed(0.1)
    model.compile(optimizer=optimizer, loss="mse")
    assert model.optimizer is optimizer


def digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order].astype("int32")
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def epochs_in_own_order(x, y, epochs, seed):
    """`epochs` passes over `(x, y)` end to end, each in a permutation drawn
    from the test's own rng, for `fit(shuffle=False)`: the order that
    `fit(shuffle=True)` draws is Keras' and changes between its versions."""
    rng = np.random.default_rng(seed)
    orders = np.concatenate([rng.permutation(len(x)) for _ in range(epochs)])
    return x[orders], y[orders]


def test_fit_converges_at_batch_1024_on_digits():
    pytest.importorskip("sklearn")
    keras.config.set_dtype_policy("mixed_float16")
    (x, y), (xv, yv) = digits_split()
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256),
        # 60 steps only: the moving statistics need a short horizon.
        keras.layers.BatchNormalization(momentum=0.9),
        keras.layers.ReLU(),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ])
    steps = 60
    schedule = klb.WarmupPolynomialDecay(4.0, warmup_steps=10, decay_steps=steps - 10)
    model.compile(
        optimizer=klb.LARSMixed(schedule, momentum=0.9, eta=0.01, weight_decay=1e-4),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    x_rep = np.concatenate([x] * 2)[:2048]
    y_rep = np.concatenate([y] * 2)[:2048]
    x_fit, y_fit = epochs_in_own_order(x_rep, y_rep, steps // 2, seed=0)
    before, _ = model.evaluate(x, y, verbose=0)
    model.fit(x_fit, y_fit, batch_size=1024, shuffle=False, verbose=0)
    after, _ = model.evaluate(x, y, verbose=0)
    assert after < before / 4
    _, accuracy = model.evaluate(xv, yv, verbose=0)
    # This order reaches 0.9748 (JAX), 0.9849 (torch), 0.9773 (TensorFlow).
    # Other seeds and orders reach 0.947 to 0.990, one of 56 below 0.95
    # (docs/keras-versions.md): the bound sits under the lowest.
    assert accuracy >= 0.94
