"""LAMB against a float64 NumPy reference, optax.lamb and Keras' Lamb."""

import keras
import numpy as np
import pytest

import keras_largebatch as klb


def reference_lamb(weights, grad_steps, lr, beta_1, beta_2, epsilon,
                   weight_decay, decayed, adapted, trust_clip=False):
    """The LAMB rule of You et al. (2019) in float64, one variable at a time;
    `lr` is a float or a list of rates, one per step."""
    w = [np.array(x, np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, grads in enumerate(grad_steps, start=1):
        rate = lr[t - 1] if isinstance(lr, list) else lr
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            m_hat = m[i] / (1 - beta_1**t)
            v_hat = v[i] / (1 - beta_2**t)
            r = m_hat / (np.sqrt(v_hat) + epsilon)
            if decayed[i]:
                r = r + weight_decay * w[i]
            w_norm, r_norm = np.linalg.norm(w[i]), np.linalg.norm(r)
            trust = w_norm / r_norm if adapted[i] and w_norm > 0 and r_norm > 0 else 1.0
            if trust_clip:
                trust = min(trust, 1.0)
            w[i] = w[i] - rate * trust * r
    return w


# body/kernel body/bias bn/gamma bn/beta zero/kernel zero/bias head/kernel head/bias
KERNEL = [True, False, False, False, True, False, True, False]
ZERO_KERNEL = 4


def enlarge_kernels(variables):
    """Kernels of norm above |r| ~ sqrt(size): trust ratios above 1."""
    for i in (0, 6):
        variables[i].assign(variables[i] * 10.0)


def realistic_grads(variables, steps, seed):
    """Magnitudes log-uniform in 1e-6..1e-2, random signs; zero/kernel (zero
    weights) gets a zero gradient at the first step: |w| = |r| = 0 there."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        grads = []
        for v in variables:
            magnitude = 10.0 ** rng.uniform(-6, -2, size=v.shape)
            grads.append((magnitude * rng.choice([-1, 1], size=v.shape)).astype("float32"))
        if step == 0:
            grads[ZERO_KERNEL] = np.zeros_like(grads[ZERO_KERNEL])
        out.append(grads)
    return out


def run(optimizer, variables, grad_steps):
    for grads in grad_steps:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def assert_matches(actual, expected, paths, rtol=2e-5):
    # atol: float32 rounding at the tensor's scale, for elements near 0.
    for a, e, p in zip(actual, expected, paths):
        atol = 1e-7 + 1e-6 * np.abs(e).max()
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=p)


@pytest.mark.parametrize(
    "weight_decay, beta_2, trust_clip",
    [(1e-2, 0.999, False), (0.0, 0.99, False), (0.1, 0.999, True)],
)
def test_matches_float64_reference_over_several_steps(weight_decay, beta_2, trust_clip, dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    if trust_clip:
        enlarge_kernels(variables)
    grad_steps = realistic_grads(variables, 4, seed=0)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = klb.LAMB(0.05, beta_2=beta_2, weight_decay=weight_decay,
                         trust_clip=trust_clip)
    actual = run(optimizer, variables, grad_steps)
    decayed = [k and weight_decay > 0 for k in KERNEL]
    expected = reference_lamb(initial, grad_steps, 0.05, 0.9, beta_2, 1e-6,
                              weight_decay, decayed, KERNEL, trust_clip)
    assert_matches(actual, expected, [v.path for v in variables])
    # zero/kernel moved from 0 with a trust ratio of 1, without NaN.
    assert np.abs(actual[ZERO_KERNEL]).max() > 0
    assert all(np.isfinite(a).all() for a in actual)


def test_trust_clip_changes_the_update(dense_bn_model):
    # Guards the previous test: with enlarged kernels some trust ratio is
    # above 1, so clipping is not a no-op there.
    model = dense_bn_model()
    variables = model.trainable_variables
    enlarge_kernels(variables)
    grad_steps = realistic_grads(variables, 4, seed=0)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    clipped = reference_lamb(initial, grad_steps, 0.05, 0.9, 0.999, 1e-6, 0.1,
                             KERNEL, KERNEL, trust_clip=True)
    free = reference_lamb(initial, grad_steps, 0.05, 0.9, 0.999, 1e-6, 0.1,
                          KERNEL, KERNEL, trust_clip=False)
    assert not np.allclose(clipped[0], free[0], rtol=1e-4)


def test_exclusions_by_path_and_by_keras_var_list(dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 3, seed=1)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = klb.LAMB(0.05, weight_decay=1e-2,
                         exclude_from_weight_decay=["^head/"],
                         exclude_from_layer_adaptation=["body/kernel"])
    optimizer.exclude_from_weight_decay(var_list=[variables[ZERO_KERNEL]])
    actual = run(optimizer, variables, grad_steps)
    decayed, adapted = list(KERNEL), list(KERNEL)
    decayed[6] = decayed[ZERO_KERNEL] = False
    adapted[0] = False
    expected = reference_lamb(initial, grad_steps, 0.05, 0.9, 0.999, 1e-6,
                              1e-2, decayed, adapted)
    assert_matches(actual, expected, [v.path for v in variables])


def test_schedule_is_read_each_step(dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 3, seed=2)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.05, 0.01])
    actual = run(klb.LAMB(schedule, weight_decay=1e-2), variables, grad_steps)
    expected = reference_lamb(initial, grad_steps, [0.05, 0.05, 0.01], 0.9, 0.999,
                              1e-6, 1e-2, KERNEL, KERNEL)
    constant = reference_lamb(initial, grad_steps, 0.05, 0.9, 0.999, 1e-6, 1e-2,
                              KERNEL, KERNEL)
    assert not np.allclose(constant[0], expected[0], rtol=1e-4)
    assert_matches(actual, expected, [v.path for v in variables])


def test_float16_variable_is_updated_in_float32_and_cast_back():
    w0 = np.random.default_rng(3).normal(size=(4, 3)).astype("float16")
    var = keras.Variable(w0, dtype="float16", name="kernel")
    grads = [[np.random.default_rng(s).normal(size=(4, 3)).astype("float16") * np.float16(1e-2)]
             for s in (4, 5)]
    optimizer = klb.LAMB(0.01, weight_decay=1e-2)
    run(optimizer, [var], grads)
    assert keras.backend.standardize_dtype(var.dtype) == "float16"
    assert [keras.backend.standardize_dtype(v.dtype) for v in optimizer.momentums] == ["float32"]
    expected = reference_lamb([w0.astype(np.float32)], grads, 0.01, 0.9, 0.999, 1e-6,
                              1e-2, [True], [True])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(var).astype("float64"),
                               expected[0], rtol=2e-3, atol=2e-3)


def test_equals_keras_lamb_without_weight_decay():
    # Keras' Lamb adapts every variable and has no coupled decay: with
    # weight_decay=0 and kernel-only variables (all adapted here too) the
    # two rules coincide.
    rng = np.random.default_rng(6)
    shapes = [(3, 3, 2, 4), (7, 5), (5, 2)]
    initial = [rng.normal(size=s).astype("float32") * 0.1 for s in shapes]
    grad_steps = [[(rng.normal(size=s) * 1e-3).astype("float32") for s in shapes]
                  for _ in range(4)]
    results = []
    for optimizer in (klb.LAMB(0.01, epsilon=1e-6),
                      keras.optimizers.Lamb(0.01, epsilon=1e-6)):
        variables = [keras.Variable(w) for w in initial]
        results.append(run(optimizer, variables, grad_steps))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not np.allclose(results[0][0], initial[0])


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="optax is JAX")
def test_equals_optax_lamb_where_the_rules_coincide(dense_bn_model):
    """optax.lamb = scale_by_adam, add_decayed_weights(mask), trust ratio on
    every leaf, learning rate. With `mask` = our decay mask (kernels) it
    equals LAMB on every kernel; with the trust ratio also masked to kernels
    (`optax.masked(scale_by_trust_ratio(), mask)`) on every variable."""
    import jax.numpy as jnp
    import optax

    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 4, seed=7)
    params = [jnp.asarray(keras.ops.convert_to_numpy(v)) for v in variables]
    actual = run(klb.LAMB(0.05, weight_decay=1e-2), variables, grad_steps)

    mask = [p.ndim > 1 for p in params]
    plain = optax.lamb(0.05, eps=1e-6, weight_decay=1e-2, mask=mask)
    chained = optax.chain(
        optax.scale_by_adam(eps=1e-6),
        optax.add_decayed_weights(1e-2, mask=mask),
        optax.masked(optax.scale_by_trust_ratio(), mask),
        optax.scale_by_learning_rate(0.05),
    )
    for transform, compare in ((plain, mask), (chained, [True] * len(mask))):
        state, p = transform.init(params), list(params)
        for grads in grad_steps:
            updates, state = transform.update([jnp.asarray(g) for g in grads], state, p)
            p = optax.apply_updates(p, updates)
        for a, e, same, v in zip(actual, p, compare, variables):
            if same:
                np.testing.assert_allclose(a, np.asarray(e), rtol=2e-5, atol=1e-7,
                                           err_msg=v.path)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch _foreach")
@pytest.mark.parametrize("weight_decay, trust_clip", [(1e-2, False), (0.0, False), (0.1, True)])
def test_fused_torch_path_equals_generic_path(weight_decay, trust_clip, dense_bn_model):
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(7)
        model = dense_bn_model()
        variables = model.trainable_variables
        optimizer = klb.LAMB(0.05, weight_decay=weight_decay, trust_clip=trust_clip,
                             exclude_from_layer_adaptation=["head"])
        optimizer.use_fused_path = fused
        results.append(run(optimizer, variables, realistic_grads(variables, 3, seed=8)))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch _foreach")
def test_fused_torch_path_is_taken():
    from keras_largebatch.optimizers import torch_lamb

    calls = []
    original = torch_lamb.update_step
    torch_lamb.update_step = lambda *a: calls.append(1) or original(*a)
    try:
        var = keras.Variable(np.ones((3, 3), "float32"))
        klb.LAMB(0.01).apply([np.full((3, 3), 1e-3, "float32")], [var])
    finally:
        torch_lamb.update_step = original
    assert calls == [1]


# LAMBMixed: the LARSMixed mechanism around LAMB.

SCALE = 2.0**12


def apply_scaled(optimizer, variables, grad_steps, apply_step, scale=SCALE):
    for grads in grad_steps:
        apply_step(optimizer, [g * np.float32(scale) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def test_lamb_mixed_applies_lamb_to_unscaled_gradients(apply_step, dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 4, seed=10)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = klb.LAMBMixed(0.05, weight_decay=1e-2, initial_scale=SCALE)
    actual = apply_scaled(optimizer, variables, grad_steps, apply_step)
    expected = reference_lamb(initial, grad_steps, 0.05, 0.9, 0.999, 1e-6, 1e-2,
                              KERNEL, KERNEL)
    assert_matches(actual, expected, [v.path for v in variables])


def test_lamb_mixed_overflow_skips_step_and_halves_scale(apply_step, dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 3, seed=11)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = klb.LAMBMixed(0.05, weight_decay=1e-2, initial_scale=SCALE)
    apply_scaled(optimizer, variables, grad_steps[:1], apply_step)
    state = [keras.ops.convert_to_numpy(v) for v in variables + optimizer.variables
             if "scale" not in v.name and "step_counter" not in v.name]
    bad = [g * np.float32(SCALE) for g in grad_steps[1]]
    bad[3] = bad[3].copy()
    bad[3][1] = np.inf
    apply_step(optimizer, bad, variables)
    after = [keras.ops.convert_to_numpy(v) for v in variables + optimizer.variables
             if "scale" not in v.name and "step_counter" not in v.name]
    for a, b in zip(after, state):
        np.testing.assert_array_equal(a, b)
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == SCALE / 2
    # The next finite step is LAMB's second step (t = 2 in the corrections).
    actual = apply_scaled(optimizer, variables, grad_steps[2:], apply_step, SCALE / 2)
    expected = reference_lamb(initial, [grad_steps[0], grad_steps[2]], 0.05, 0.9,
                              0.999, 1e-6, 1e-2, KERNEL, KERNEL)
    assert_matches(actual, expected, [v.path for v in variables])


def test_lamb_mixed_keeps_float32_masters_of_float16_weights(apply_step, dense_bn_model):
    keras.config.set_dtype_policy("float16")
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 3, seed=12)
    grad_steps = [[g.astype("float16") for g in grads] for grads in grad_steps]
    initial = [keras.ops.convert_to_numpy(v).astype("float32") for v in variables]
    optimizer = klb.LAMBMixed(1e-3, weight_decay=1e-2, initial_scale=SCALE)
    apply_scaled(optimizer, variables, grad_steps, apply_step)
    masters = [v for v in optimizer.variables if v.name.endswith("_master")]
    assert len(masters) == len(variables)
    expected = reference_lamb(initial, grad_steps, 1e-3, 0.9, 0.999, 1e-6, 1e-2,
                              KERNEL, KERNEL)
    assert_matches([keras.ops.convert_to_numpy(m) for m in masters], expected,
                   [v.path for v in variables], rtol=1e-4)
    for m, v in zip(masters, variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(m).astype("float16"), keras.ops.convert_to_numpy(v))


@pytest.mark.parametrize("cls, inner, kwargs", [
    (klb.LAMBMixed, klb.LAMB, {"weight_decay": 1e-2}),
    (klb.LARSMixed, klb.LARS, {"weight_decay": 1e-2, "eta": 0.02}),
])
def test_mixed_with_clipping_unscales_before_the_inner_rule(cls, inner, kwargs, apply_step, dense_bn_model):
    # Clipping needs unscaled gradients: the unscaling is not folded here.
    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = realistic_grads(variables, 3, seed=13)
    start = [keras.ops.convert_to_numpy(v) for v in variables]
    actual = apply_scaled(cls(0.05, global_clipnorm=1e-3, initial_scale=SCALE, **kwargs),
                          variables, grad_steps, apply_step)
    plain = [keras.Variable(w) for w in start]
    expected = run(inner(0.05, global_clipnorm=1e-3, **kwargs), plain, grad_steps)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)
    unclipped = run(inner(0.05, **kwargs), [keras.Variable(w) for w in start], grad_steps)
    assert not np.allclose(unclipped[0], expected[0], rtol=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch _foreach")
@pytest.mark.parametrize("cls, kwargs", [
    (klb.LAMBMixed, {"weight_decay": 1e-2}),
    (klb.LARSMixed, {"weight_decay": 1e-2, "eta": 0.02, "nesterov": True}),
    (klb.LARSMixed, {"weight_decay": 1e-2, "eta": 0.02, "momentum": 0.0}),
])
def test_fused_torch_mixed_path_equals_generic_path(cls, kwargs, dense_bn_model):
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(7)
        model = dense_bn_model()
        variables = model.trainable_variables
        optimizer = cls(0.05, initial_scale=SCALE, **kwargs)
        optimizer.inner_optimizer.use_fused_path = fused
        grads = realistic_grads(variables, 3, seed=14)
        results.append(apply_scaled(optimizer, variables, grads, lambda o, g, v: o.apply(g, v)))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX only")
@pytest.mark.parametrize("cls", [klb.LAMBMixed, klb.LARSMixed])
def test_jitted_step_equals_eager_step_on_jax(cls, apply_step, dense_bn_model):
    grad_steps = realistic_grads(dense_bn_model().trainable_variables, 3, seed=15)
    grad_steps[1][0][0, 0] = np.inf
    results = []
    for eager in (True, False):
        keras.utils.set_random_seed(3)
        variables = dense_bn_model().trainable_variables
        optimizer = cls(0.05, weight_decay=1e-2, initial_scale=SCALE)
        step = (lambda o, g, v: o.apply(g, v)) if eager else apply_step
        results.append(apply_scaled(optimizer, variables, grad_steps, step)
                       + [float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))])
    assert results[0][-1] == results[1][-1] == SCALE / 2
    for a, b in zip(results[0][:-1], results[1][:-1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
