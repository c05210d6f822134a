"""The layers' torch path against Keras' own layers on torch: outputs,
gradients and moving statistics, float32 and mixed precision, compiled and
eager, and the aten ops and copies one forward and backward pass launches."""

import collections

import keras
import numpy as np
import pytest

from keras_largebatch import layers

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the layers' torch path")

if keras.backend.backend() == "torch":
    import torch

STOCK = {layers.Conv2D: keras.layers.Conv2D,
         layers.BatchNormalization: keras.layers.BatchNormalization,
         layers.MaxPooling2D: keras.layers.MaxPooling2D,
         layers.Activation: keras.layers.Activation,
         layers.ZeroPadding2D: keras.layers.ZeroPadding2D}
COPIES = ("aten::copy_", "aten::clone", "aten::contiguous")


def _pair(cls, shape, seed=0, **kwargs):
    """Ours and Keras' layer, built for `shape`, with the same random
    weights (moving variances positive)."""
    rng = np.random.default_rng(seed)
    ours, stock = cls(**kwargs), STOCK[cls](**kwargs)
    ours.build(shape)
    stock.build(shape)
    for a, b in zip(ours.weights, stock.weights):
        value = rng.normal(size=a.shape).astype("float32")
        if a.name == "moving_variance":
            value = np.abs(value) + 0.5
        a.assign(value)
        b.assign(value)
    return ours, stock


def _forward_backward(layer, x, upstream, training=True):
    """Outputs, input gradient and trainable variables' gradients."""
    x = torch.tensor(x, requires_grad=True)
    y = layer(x, training=training)
    for v in layer.trainable_weights:
        v.value.grad = None
    (y.float() * torch.tensor(upstream)).sum().backward()
    grads = [v.value.grad.numpy() for v in layer.trainable_weights]
    return y.detach().float().numpy(), x.grad.numpy(), grads


def _assert_same(ours, stock, x, training=True, rtol=1e-5, atol=1e-5):
    upstream = np.random.default_rng(9).normal(
        size=stock.compute_output_shape(x.shape)).astype("float32")
    got = _forward_backward(ours, x, upstream, training)
    want = _forward_backward(stock, x, upstream, training)
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    np.testing.assert_allclose(got[1], want[1], rtol=rtol, atol=atol)
    for g, w in zip(got[2], want[2]):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * 10)


CONVS = [
    dict(filters=6, kernel_size=3, padding="same"),
    dict(filters=6, kernel_size=3, strides=2, padding="same"),  # uneven pad
    dict(filters=5, kernel_size=(3, 2), strides=(2, 1), padding="valid"),
    dict(filters=6, kernel_size=3, dilation_rate=2, padding="same"),
    dict(filters=6, kernel_size=(1, 4), padding="same"),  # even kernel
    dict(filters=6, kernel_size=3, groups=2, padding="same",
         activation="relu"),
    dict(filters=4, kernel_size=1, strides=2, use_bias=False),
]


@pytest.mark.parametrize("kwargs", CONVS, ids=lambda k: str(sorted(k.items())))
def test_conv2d_matches_keras_outputs_and_gradients(kwargs):
    x = np.random.default_rng(1).normal(size=(3, 7, 8, 4)).astype("float32")
    ours, stock = _pair(layers.Conv2D, x.shape, **kwargs)
    _assert_same(ours, stock, x)


@pytest.mark.parametrize("kwargs", [
    dict(pool_size=3, strides=2),
    dict(pool_size=2),
    dict(pool_size=3, strides=1, padding="same"),
    dict(pool_size=2, padding="same"),  # uneven: Keras' path
    dict(pool_size=(3, 1), strides=(2, 1), padding="same"),
])
def test_max_pooling_matches_keras_outputs_and_gradients(kwargs):
    x = np.random.default_rng(2).normal(size=(2, 7, 6, 3)).astype("float32")
    ours, stock = _pair(layers.MaxPooling2D, x.shape, **kwargs)
    _assert_same(ours, stock, x)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_activation_matches_keras_outputs_and_gradients(activation):
    x = np.random.default_rng(2).normal(size=(2, 5, 4, 3)).astype("float32")
    ours, stock = _pair(layers.Activation, x.shape, activation=activation)
    _assert_same(ours, stock, x, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs", [
    dict(padding=1),
    dict(padding=((1, 2), (0, 3))),
    dict(padding=(2, 1), data_format="channels_first"),
    dict(padding=-1),  # a crop: Keras' path
])
def test_zero_padding_matches_keras_outputs_and_gradients(kwargs):
    x = np.random.default_rng(2).normal(size=(2, 5, 4, 3)).astype("float32")
    ours, stock = _pair(layers.ZeroPadding2D, x.shape, **kwargs)
    _assert_same(ours, stock, x, rtol=0, atol=0)


def test_zero_padding_gradient_is_a_view_of_the_padded_gradient():
    x = torch.zeros(2, 5, 4, 3, requires_grad=True)
    y = layers.ZeroPadding2D(((1, 2), (0, 3)))(x)
    upstream = torch.randn(tuple(y.shape))
    (dx,) = torch.autograd.grad(y, x, upstream)
    assert dx.untyped_storage().data_ptr() == (
        upstream.untyped_storage().data_ptr())
    torch.testing.assert_close(dx, upstream[:, 1:6, 0:4], rtol=0, atol=0)


def test_add_matches_keras_outputs_and_gradients():
    rng = np.random.default_rng(2)
    xs = [rng.normal(size=(2, 5, 4, 3)).astype("float32") for _ in range(3)]
    upstream = torch.tensor(rng.normal(size=xs[0].shape).astype("float32"))
    results = []
    for layer in (layers.Add(), keras.layers.Add()):
        inputs = [torch.tensor(x, requires_grad=True) for x in xs]
        y = layer(inputs)
        (y * upstream).sum().backward()
        results.append([y.detach().numpy()]
                       + [t.grad.numpy() for t in inputs])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape,axis", [((2, 3, 3, 5), -1), ((4, 6), -1),
                                        ((2, 5, 3, 4), 1), ((3, 4, 5), 1)])
def test_batch_norm_matches_keras_over_steps(shape, axis, training):
    # Few values per channel (18 for NHWC): the unbiased variance would be
    # 6% off; momentum 0.6 makes a swapped convention visible in 3 steps.
    ours, stock = _pair(layers.BatchNormalization, shape, axis=axis,
                        momentum=0.6, epsilon=1e-3)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = (rng.normal(size=shape) * 2 + 1).astype("float32")
        # Keras' variance is E[x^2] - E[x]^2, torch's Welford's: they
        # differ in the last float32 digits.
        _assert_same(ours, stock, x, training=training, rtol=1e-4, atol=1e-4)
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(getattr(ours, name).numpy(),
                                   getattr(stock, name).numpy(),
                                   rtol=1e-5, atol=1e-6)
    if training:
        assert not np.allclose(ours.moving_mean.numpy(), 0.0)


def test_batch_norm_without_scale_or_center_and_frozen_matches_keras():
    x = np.random.default_rng(4).normal(size=(2, 4, 4, 3)).astype("float32")
    ours, stock = _pair(layers.BatchNormalization, x.shape, scale=False,
                        center=False)
    _assert_same(ours, stock, x, rtol=1e-4, atol=1e-4)
    ours, stock = _pair(layers.BatchNormalization, x.shape)
    ours.trainable = stock.trainable = False  # inference statistics
    before = ours.moving_mean.numpy()
    _assert_same(ours, stock, x, training=True, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ours.moving_mean.numpy(), before)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_matches_keras(policy):
    keras.config.set_dtype_policy(policy)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 6, 6, 4)).astype("float32")
    tol = 2e-2 if policy == "mixed_bfloat16" else 2e-3
    conv, conv_stock = _pair(layers.Conv2D, x.shape, filters=4,
                             kernel_size=3, padding="same")
    bn, bn_stock = _pair(layers.BatchNormalization, x.shape, momentum=0.6)
    for ours, stock in ((conv, conv_stock), (bn, bn_stock)):
        _assert_same(ours, stock, x, rtol=tol, atol=tol)
        y = ours(torch.tensor(x), training=False)
        assert keras.backend.standardize_dtype(y.dtype) == ours.compute_dtype
    assert bn.moving_mean.dtype == "float32"
    np.testing.assert_allclose(bn.moving_variance.numpy(),
                               bn_stock.moving_variance.numpy(), rtol=1e-3)


def test_channels_first_runs_keras_path_and_matches():
    x = np.random.default_rng(6).normal(size=(2, 3, 6, 6)).astype("float32")
    for cls, kwargs in ((layers.Conv2D, dict(filters=4, kernel_size=3)),
                        (layers.MaxPooling2D, dict(pool_size=2)),
                        (layers.BatchNormalization, dict(axis=1))):
        ours, stock = _pair(cls, x.shape, data_format="channels_first",
                            **kwargs) if cls is not layers.BatchNormalization \
            else _pair(cls, x.shape, **kwargs)
        _assert_same(ours, stock, x)


def _model():
    inputs = keras.Input((8, 8, 3))
    x = layers.ZeroPadding2D(1, name="conv_pad")(inputs)
    x = layers.Conv2D(4, 3, strides=2, padding="same", name="conv")(x)
    y = layers.Activation("relu", name="relu")(
        layers.BatchNormalization(momentum=0.5, name="bn")(x))
    x = layers.Add(name="add")([y, x])
    x = layers.ZeroPadding2D(((1, 0), (0, 1)), name="pool_pad")(x)
    x = layers.MaxPooling2D(2, name="pool")(x)
    return keras.Model(inputs, x)


def test_compiled_equals_eager_without_graph_breaks():
    model = _model()
    trainable = [v.value.detach().clone() for v in model.trainable_variables]
    frozen = [v.value.detach().clone() for v in model.non_trainable_variables]
    x = torch.tensor(np.random.default_rng(7).normal(
        size=(4, 8, 8, 3)).astype("float32"))

    def forward(trainable, frozen, x):
        return model.stateless_call(trainable, frozen, x, training=True)

    def step(forward):
        leaves = [t.clone().requires_grad_() for t in trainable]
        y, new_frozen = forward(leaves, frozen, x)
        y.square().sum().backward()
        return [y, *[t.grad for t in leaves], *new_frozen]

    eager = step(forward)
    torch._dynamo.reset()
    # fullgraph: a graph break anywhere in the layers raises.
    compiled = step(torch.compile(forward, backend="aot_eager",
                                  fullgraph=True))
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
    # The moving statistics come back from stateless_call, updated, and
    # the model's own are left as they were.
    assert not np.allclose(eager[-2].numpy(), frozen[0].numpy())
    for v, before in zip(model.non_trainable_variables, frozen):
        np.testing.assert_array_equal(v.numpy(), before.numpy())


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_compiled_fit_equals_eager_fit(policy):
    # Keras' torch trainer: jit_compile=True runs the train step under
    # torch.compile, writing the moving statistics in place.
    keras.config.set_dtype_policy(policy)
    tol = 1e-4 if policy == "float32" else 2e-2
    rng = np.random.default_rng(10)
    x = rng.normal(size=(16, 8, 8, 3)).astype("float32")
    y = rng.normal(size=(16, 3, 3, 4)).astype("float32")
    results = []
    for jit_compile in (False, True):
        torch._dynamo.reset()
        keras.utils.set_random_seed(0)
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss="mse", jit_compile=jit_compile)
        history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False,
                            verbose=0)
        results.append((history.history["loss"],
                        {v.path: v.numpy() for v in model.weights}))
    (eager_loss, eager), (compiled_loss, compiled) = results
    np.testing.assert_allclose(compiled_loss, eager_loss, rtol=tol / 10)
    assert compiled.keys() == eager.keys()
    for path, value in eager.items():
        np.testing.assert_allclose(compiled[path], value, rtol=tol,
                                   atol=tol / 10, err_msg=path)
    assert not np.allclose(eager["bn/moving_mean"], 0.0)


def test_keras_stateless_scope_test_is_where_torch_ops_reads_it():
    # torch_ops imports Keras' private `in_stateless_scope` (no public one).
    from keras_largebatch.layers import torch_ops

    assert not torch_ops.in_stateless_scope()
    with keras.StatelessScope():
        assert torch_ops.in_stateless_scope()


def _count(layer, x, training=True):
    """aten ops and copies (by kind) of one forward and backward pass."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    x = torch.tensor(x, requires_grad=True)
    upstream = torch.randn(tuple(layer(x, training=training).shape))

    def step():
        for v in layer.trainable_weights:
            v.value.grad = None
        (layer(x, training=training) * upstream).sum().backward()

    step()
    with profile(activities=[ProfilerActivity.CPU],
                 record_shapes=True) as prof:
        step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    kinds = collections.Counter()
    for e in events:
        if e.name in COPIES:
            shape = tuple(e.input_shapes[0])
            kinds["activation" if shape[:1] == (x.shape[0],) and len(shape)
                  == 4 else "parameter" if len(shape) == 4 else
                  "statistic" if len(shape) == 1 else "scalar"] += 1
    return len(events), dict(kinds)


# (layer, kwargs, training): (at most this many aten ops, copies by kind),
# counted with torch 2.13 on a CPU, a forward and backward pass of a
# (4, 9, 9, 8) input. Parameter copies: the kernel into torch's layout and
# its gradient back; the moving statistics are written in place (`lerp_`,
# no copy); ZeroPadding2D's one activation copy is the pad itself, writing
# the input into the padded tensor. Keras' own layers, for comparison:
# Conv2D 71 ops, 6 activation copies; BatchNormalization 177 ops
# (training), 3 activation copies, 52 and 2 (inference); MaxPooling2D 42
# ops, 10 activation copies; Activation("relu") 15 ops; ZeroPadding2D 47
# ops, 3 activation copies (the pad, and its gradient's `clone`).
BUDGETS = [
    (layers.Conv2D, dict(filters=8, kernel_size=3, padding="same"), True,
     (51, {"parameter": 4})),
    (layers.BatchNormalization, {}, True, (50, {})),
    (layers.BatchNormalization, {}, False, (42, {})),
    (layers.MaxPooling2D, dict(pool_size=3, strides=2), True, (24, {})),
    (layers.Activation, dict(activation="relu"), True, (15, {})),
    (layers.ZeroPadding2D, dict(padding=1), True, (35, {"activation": 1})),
]


@pytest.mark.parametrize("cls,kwargs,training,budget", BUDGETS,
                         ids=lambda v: getattr(v, "__name__", None))
def test_forward_backward_launches_no_activation_copy_and_few_ops(
        cls, kwargs, training, budget):
    x = np.random.default_rng(8).normal(size=(4, 9, 9, 8)).astype("float32")
    ours, stock = _pair(cls, x.shape, **kwargs)
    ops, copies = _count(ours, x, training)
    stock_ops, _ = _count(stock, x, training)
    assert ops <= budget[0] and copies == budget[1], (ops, copies)
    assert ops < stock_ops
