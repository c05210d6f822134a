"""LARS against an independent float64 NumPy reference of the formula."""

import keras
import numpy as np
import pytest

import keras_largebatch as klb


def reference_lars(weights, grad_steps, lr, momentum, eta, weight_decay,
                   epsilon, nesterov, decayed, adapted):
    """The LARS rule in float64, written from the paper, one variable at a
    time. `grad_steps` is a list (steps) of lists (variables)."""
    w = [np.array(x, np.float64) for x in weights]
    v = [np.zeros_like(x) for x in w]
    for step, grads in enumerate(grad_steps):
        rate = lr(step) if callable(lr) else lr
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            wd = weight_decay if decayed[i] else 0.0
            w_norm, g_norm = np.linalg.norm(w[i]), np.linalg.norm(g)
            if adapted[i] and w_norm > 0 and g_norm > 0:
                trust = eta * w_norm / (g_norm + wd * w_norm + epsilon)
            else:
                trust = 1.0
            u = g + wd * w[i]
            v[i] = momentum * v[i] + rate * trust * u
            if nesterov:
                w[i] = w[i] - (momentum * v[i] + rate * trust * u)
            else:
                w[i] = w[i] - v[i]
    return w


# Paths: body/kernel body/bias bn/gamma bn/beta zero/kernel zero/bias
#        head/kernel head/bias
KERNEL = [True, False, False, False, True, False, True, False]


def assert_close_to_reference(variables, expected):
    for v, e in zip(variables, expected):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(v), e, rtol=2e-5, atol=1e-7,
            err_msg=v.path,
        )


def random_grads(variables, steps, rng, zero_grad_for=None):
    out = []
    for step in range(steps):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        if zero_grad_for is not None and step == 1:
            grads[zero_grad_for] = np.zeros_like(grads[zero_grad_for])
        out.append(grads)
    return out


@pytest.mark.parametrize(
    "momentum, nesterov, weight_decay, epsilon",
    [
        (0.9, False, 1e-2, 0.0),
        (0.9, True, 1e-2, 1e-3),
        (0.0, False, 5e-2, 0.0),
        (0.5, False, 0.0, 0.0),
    ],
)
def test_matches_float64_reference_over_several_steps(
    momentum, nesterov, weight_decay, epsilon
, dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    assert [v.path for v in variables] == [
        "body/kernel", "body/bias", "bn/gamma", "bn/beta",
        "zero/kernel", "zero/bias", "head/kernel", "head/bias",
    ]
    rng = np.random.default_rng(0)
    grad_steps = random_grads(variables, 4, rng, zero_grad_for=6)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]

    optimizer = klb.LARS(
        0.1, momentum=momentum, eta=0.02, weight_decay=weight_decay,
        epsilon=epsilon, nesterov=nesterov,
    )
    for grads in grad_steps:
        optimizer.apply(grads, variables)

    expected = reference_lars(
        initial, grad_steps, 0.1, momentum, 0.02, weight_decay, epsilon,
        nesterov, decayed=KERNEL, adapted=KERNEL,
    )
    assert_close_to_reference(variables, expected)
    # The zero-initialised kernel moved (trust 1 at zero norm), and the
    # step with a zero gradient for head/kernel did not produce NaN.
    assert np.abs(keras.ops.convert_to_numpy(variables[4])).max() > 0
    assert all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in variables)


def test_exclusion_patterns_match_variable_paths(dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    rng = np.random.default_rng(1)
    grad_steps = random_grads(variables, 3, rng)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]

    optimizer = klb.LARS(
        0.1, momentum=0.9, eta=0.02, weight_decay=1e-2,
        exclude_from_weight_decay=["^head/"],
        exclude_from_layer_adaptation=["body/kernel"],
    )
    for grads in grad_steps:
        optimizer.apply(grads, variables)

    decayed = list(KERNEL)
    decayed[6] = False  # head/kernel
    adapted = list(KERNEL)
    adapted[0] = False  # body/kernel
    expected = reference_lars(
        initial, grad_steps, 0.1, 0.9, 0.02, 1e-2, 0.0, False, decayed, adapted
    )
    assert_close_to_reference(variables, expected)


def test_keras_exclude_from_weight_decay_is_honoured(dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    rng = np.random.default_rng(2)
    grad_steps = random_grads(variables, 2, rng)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]

    optimizer = klb.LARS(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2)
    optimizer.exclude_from_weight_decay(var_list=[variables[0]])
    for grads in grad_steps:
        optimizer.apply(grads, variables)

    decayed = list(KERNEL)
    decayed[0] = False
    expected = reference_lars(
        initial, grad_steps, 0.1, 0.9, 0.02, 1e-2, 0.0, False, decayed, KERNEL
    )
    assert_close_to_reference(variables, expected)


def test_schedule_learning_rate_is_read_each_step(dense_bn_model):
    model = dense_bn_model()
    variables = model.trainable_variables
    rng = np.random.default_rng(3)
    grad_steps = random_grads(variables, 5, rng)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    schedule = klb.WarmupPolynomialDecay(0.2, warmup_steps=2, decay_steps=3)

    optimizer = klb.LARS(schedule, momentum=0.9, eta=0.02, weight_decay=1e-3)
    for grads in grad_steps:
        optimizer.apply(grads, variables)

    def lr(step):
        if step < 2:
            return 0.2 * step / 2
        t = min(step - 2, 3) / 3
        return 1e-4 + (0.2 - 1e-4) * (1 - t) ** 2

    expected = reference_lars(
        initial, grad_steps, lr, 0.9, 0.02, 1e-3, 0.0, False, KERNEL, KERNEL
    )
    assert_close_to_reference(variables, expected)


def test_no_decoupled_weight_decay_on_top_of_coupled():
    # With eta large and a tiny gradient, trust = eta*|w|/(|g| + wd*|w|);
    # applying the base class's decoupled decay as well would shrink the
    # weight by lr*wd*w on top: the reference would not match.
    w0 = np.full((4, 4), 2.0, "float32")
    var = keras.Variable(w0, name="kernel")
    grad = np.full((4, 4), 1e-3, "float32")
    optimizer = klb.LARS(0.5, momentum=0.0, eta=1.0, weight_decay=0.1)
    optimizer.apply([grad], [var])
    expected = reference_lars(
        [w0], [[grad]], 0.5, 0.0, 1.0, 0.1, 0.0, False, [True], [True]
    )[0]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(var), expected, rtol=1e-6)


def test_integer_and_non_trainable_variables_are_left_alone():
    kernel = keras.Variable(np.ones((3, 3), "float32"), name="kernel")
    counter = keras.Variable(np.array([3, 4], "int32"), name="counter", trainable=False)
    frozen = keras.Variable(np.ones((3, 3), "float32"), name="frozen", trainable=False)
    optimizer = klb.LARS(0.1, weight_decay=1e-2)
    optimizer.apply(
        [np.ones((3, 3), "float32"), np.ones((2,), "int32"), np.ones((3, 3), "float32")],
        [kernel, counter, frozen],
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(counter), [3, 4])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(frozen), np.ones((3, 3)))
    assert not np.allclose(keras.ops.convert_to_numpy(kernel), 1.0)


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="IndexedSlices are TF's"
)
def test_sparse_embedding_gradient_is_densified():
    import tensorflow as tf

    layer = keras.layers.Embedding(10, 4)
    layer.build((None,))
    ids = tf.constant([1, 3, 3, 7])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids) ** 2)
    (grad,) = tape.gradient(loss, [layer.embeddings.value])
    assert isinstance(grad, tf.IndexedSlices)
    before = keras.ops.convert_to_numpy(layer.embeddings)

    optimizer = klb.LARS(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2)
    optimizer.apply([grad], [layer.embeddings])

    dense = tf.convert_to_tensor(grad).numpy()
    expected = reference_lars(
        [before], [[dense]], 0.1, 0.9, 0.02, 1e-2, 0.0, False, [True], [True]
    )[0]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer.embeddings), expected, rtol=2e-5
    )


@pytest.mark.skipif(
    keras.backend.backend() == "jax", reason="no fused path on JAX (XLA fuses)"
)
@pytest.mark.parametrize("momentum, nesterov, weight_decay", [
    (0.9, False, 1e-2), (0.9, True, 1e-2), (0.0, False, 1e-2), (0.9, False, 0.0),
])
def test_fused_backend_path_equals_generic_path(momentum, nesterov, weight_decay, dense_bn_model):
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(7)
        model = dense_bn_model()
        variables = model.trainable_variables
        optimizer = klb.LARS(
            0.1, momentum=momentum, eta=0.02, weight_decay=weight_decay,
            nesterov=nesterov, exclude_from_layer_adaptation=["head"],
        )
        optimizer.use_fused_path = fused
        for grads in random_grads(variables, 3, np.random.default_rng(5), 6):
            optimizer.apply(grads, variables)
        results.append([keras.ops.convert_to_numpy(v) for v in variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch path")
@pytest.mark.parametrize("nesterov", [False, True])
def test_torch_multi_tensor_path_leaves_gradients_alone(nesterov, dense_bn_model):
    # The caller's gradient tensors are applied twice here, so an update
    # that scaled or unscaled them in place would make the second step wrong.
    import torch

    model = dense_bn_model()
    variables = model.trainable_variables
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    rng = np.random.default_rng(9)
    grads_np = [
        (10.0 ** rng.uniform(-6, -2, v.shape) * rng.choice([-1, 1], v.shape))
        .astype("float32")
        for v in variables
    ]
    grads = [torch.tensor(g) for g in grads_np]
    optimizer = klb.LARS(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2,
                         nesterov=nesterov)
    for _ in range(2):
        optimizer.apply(grads, variables)
    for g, g_np in zip(grads, grads_np):
        np.testing.assert_array_equal(g.numpy(), g_np)
    expected = reference_lars(
        initial, [grads_np, grads_np], 0.1, 0.9, 0.02, 1e-2, 0.0, nesterov,
        KERNEL, KERNEL,
    )
    assert_close_to_reference(variables, expected)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TF kernel")
@pytest.mark.parametrize("fused", [True, False])
def test_tensorflow_kernel_is_chosen_through_fused_paths(monkeypatch, fused, dense_bn_model):
    # `LARS.fused_paths["tensorflow"]` puts each float32 variable's momentum
    # step in `tf_lars`'s kernel; `use_fused_path = False` leaves it out.
    from keras_largebatch.optimizers import tf_lars

    calls = []
    kernel = tf_lars.apply_step
    monkeypatch.setattr(
        tf_lars, "apply_step", lambda *a: calls.append(1) or kernel(*a)
    )
    model = dense_bn_model()
    variables = model.trainable_variables
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    grad_steps = random_grads(variables, 2, np.random.default_rng(14))
    optimizer = klb.LARS(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2)
    optimizer.use_fused_path = fused
    for grads in grad_steps:
        optimizer.apply(grads, variables)
    assert len(calls) == (2 * len(variables) if fused else 0)
    expected = reference_lars(
        initial, grad_steps, 0.1, 0.9, 0.02, 1e-2, 0.0, False, KERNEL, KERNEL
    )
    assert_close_to_reference(variables, expected)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TF kernels")
@pytest.mark.parametrize("shape", [(3,), (5, 7), (64, 64), (64, 65), (3, 3, 16, 32)])
@pytest.mark.parametrize("jit", [False, True])
def test_tensorflow_squared_norm_paths_equal_float64(shape, jit):
    # Eager and graph: L2Loss. XLA on a CPU: trace(XᵀX) for sizes that are
    # multiples of 8 (from 4,096), a dot product otherwise.
    import tensorflow as tf

    from keras_largebatch.optimizers import norms

    rng = np.random.default_rng(11)
    x = (10.0 ** rng.uniform(-6, -2, shape) * rng.choice([-1, 1], shape))
    x32 = x.astype("float32")
    got = tf.function(norms.squared_norm, jit_compile=jit)(tf.constant(x32))
    expected = np.sum(x32.astype(np.float64) ** 2)
    np.testing.assert_allclose(float(got), expected, rtol=2e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="XLA via TF")
@pytest.mark.parametrize("mixed", [False, True])
def test_tensorflow_xla_step_with_large_kernels_matches_reference(mixed):
    # Kernels of 8,192 and 4,104 values take the XLA:CPU norm paths (the
    # matrix product and the dot); LARSMixed takes its gradient norms from
    # the finiteness check.
    import tensorflow as tf

    inputs = keras.Input((64,))
    x = keras.layers.Dense(128, name="wide")(inputs)
    outputs = keras.layers.Dense(3, name="head")(
        keras.layers.Dense(57, name="odd")(keras.layers.Dense(72, name="mid")(x))
    )
    variables = keras.Model(inputs, outputs).trainable_variables
    rng = np.random.default_rng(12)
    grad_steps = [
        [(10.0 ** rng.uniform(-6, -2, v.shape) * rng.choice([-1, 1], v.shape))
         .astype("float32") for v in variables]
        for _ in range(3)
    ]
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    kwargs = dict(momentum=0.9, eta=0.02, weight_decay=1e-2)
    scale = 2.0**10 if mixed else 1.0
    optimizer = (klb.LARSMixed(0.1, initial_scale=scale, **kwargs) if mixed
                 else klb.LARS(0.1, **kwargs))
    optimizer.build(variables)
    step = tf.function(lambda g: optimizer.apply(g, variables), jit_compile=True)
    for grads in grad_steps:
        step([tf.constant(g * np.float32(scale)) for g in grads])
    kernel = [v.path.endswith("kernel") for v in variables]
    expected = reference_lars(
        initial, grad_steps, 0.1, 0.9, 0.02, 1e-2, 0.0, False, kernel, kernel
    )
    assert_close_to_reference(variables, expected)


def test_mixed_takes_gradient_norms_from_the_finiteness_check(monkeypatch, dense_bn_model):
    # One read of each gradient serves the check and the trust ratio: the
    # rule computes only weight norms (the generic path; torch's fused path
    # reads the same sums through `torch_foreach.norms`).
    from keras_largebatch.optimizers import norms

    calls = []
    norm = norms.norm
    monkeypatch.setattr(norms, "norm", lambda x: calls.append(1) or norm(x))
    model = dense_bn_model()
    variables = model.trainable_variables
    optimizer = klb.LARSMixed(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2,
                              initial_scale=2.0**10)
    optimizer.inner_optimizer.use_fused_path = False
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    grads = random_grads(variables, 1, np.random.default_rng(13))[0]
    grads = [g * np.float32(1e-3) for g in grads]
    optimizer.apply([g * np.float32(2.0**10) for g in grads], variables)
    assert len(calls) == sum(KERNEL)  # one norm per adapted weight, no more
    expected = reference_lars(
        initial, [grads], 0.1, 0.9, 0.02, 1e-2, 0.0, False, KERNEL, KERNEL
    )
    assert_close_to_reference(variables, expected)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="XLA via TF")
def test_tensorflow_step_compiles_with_xla_and_matches_reference(dense_bn_model):
    # Keras' TF trainer jit-compiles the train step on GPUs.
    import tensorflow as tf

    model = dense_bn_model()
    variables = model.trainable_variables
    grad_steps = random_grads(variables, 3, np.random.default_rng(6), 6)
    initial = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer = klb.LARS(0.1, momentum=0.9, eta=0.02, weight_decay=1e-2, nesterov=True)
    optimizer.build(variables)
    step = tf.function(lambda g: optimizer.apply(g, variables), jit_compile=True)
    for grads in grad_steps:
        step([tf.constant(g) for g in grads])
    expected = reference_lars(
        initial, grad_steps, 0.1, 0.9, 0.02, 1e-2, 0.0, True, KERNEL, KERNEL
    )
    assert_close_to_reference(variables, expected)
