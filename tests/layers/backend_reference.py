"""One backend's side of `test_layers_against_jax.py`: a small network of
every `keras_largebatch.layers` layer (an uneven `"same"` stride, dilation
with groups, batch norm, ReLU, a residual add, same-padded pooling, an
uneven zero padding, a valid rectangular stride), with fixed weights,
input and upstream gradient, takes three training passes through
`stateless_call` carrying the moving statistics; then one inference pass. Writes, per dtype policy,
the first pass's outputs and gradients (input and weights), the moving
statistics after the three and the inference outputs to
OUT/<backend>.npz. Runs on the backend `KERAS_BACKEND` names.

Usage: python backend_reference.py OUT
"""

import os
import sys

import numpy as np

POLICIES = ("float32", "mixed_float16")
STEPS = 3


def model():
    import keras

    from keras_largebatch import layers

    inputs = keras.Input((10, 10, 4))
    a = layers.Conv2D(6, 3, strides=2, padding="same", name="a")(inputs)
    b = layers.Activation("relu", name="relu")(
        layers.BatchNormalization(momentum=0.6, name="bn1")(a))
    c = layers.Conv2D(6, 3, dilation_rate=2, groups=2, padding="same",
                      name="c")(b)
    d = layers.Add(name="add")([c, a])
    e = layers.BatchNormalization(momentum=0.6, epsilon=1e-3, name="bn2")(d)
    f = layers.MaxPooling2D(3, strides=2, padding="same", name="pool")(e)
    f = layers.ZeroPadding2D(((1, 0), (2, 1)), name="pad")(f)
    g = layers.Conv2D(4, (3, 2), strides=(2, 1), padding="valid",
                      name="g")(f)
    return keras.Model(inputs, g)


def values(net, rng):
    """Fixed weights (moving variances positive), in `net.weights` order."""
    out = []
    for v in net.weights:
        value = rng.normal(size=v.shape).astype("float32")
        if v.name == "moving_variance":
            value = np.abs(value) + 0.5
        out.append(value)
    return out


def grad_step(net, trainable, frozen, x, upstream):
    """`(outputs, input gradient, weight gradients, new frozen)` of
    `sum(outputs * upstream)` on the running backend."""
    import keras

    def loss(trainable, x):
        y, new = net.stateless_call(trainable, frozen, x, training=True)
        y32 = keras.ops.cast(y, "float32")
        return keras.ops.sum(y32 * keras.ops.convert_to_tensor(upstream)), (
            y32, new)

    if keras.backend.backend() == "jax":
        import jax

        (_, (y, new)), (g, gx) = jax.value_and_grad(
            loss, argnums=(0, 1), has_aux=True)(trainable, x)
        return y, gx, g, new
    import torch

    trainable = [torch.tensor(t, requires_grad=True) for t in trainable]
    x = torch.tensor(x, requires_grad=True)
    value, (y, new) = loss(trainable, x)
    value.backward()
    return y.detach(), x.grad, [t.grad for t in trainable], new


def main(out):
    import keras

    backend = keras.backend.backend()
    arrays = {}
    for policy in POLICIES:
        keras.config.set_dtype_policy(policy)
        net = model()
        rng = np.random.default_rng(0)
        weights = values(net, rng)
        by_path = dict(zip([v.path for v in net.weights], weights))
        trainable = [by_path[v.path] for v in net.trainable_variables]
        frozen = [by_path[v.path] for v in net.non_trainable_variables]
        for step in range(STEPS):
            x = (rng.normal(size=(3, 10, 10, 4)) * 2 + 1).astype("float32")
            upstream = rng.normal(size=(3, 1, 5, 4)).astype("float32")
            y, gx, g, frozen = grad_step(net, trainable, frozen, x,
                                         upstream)
            if step == 0:
                arrays[f"{policy}/y"] = keras.ops.convert_to_numpy(y)
                arrays[f"{policy}/dx"] = keras.ops.convert_to_numpy(gx)
                for v, gv in zip(net.trainable_variables, g):
                    arrays[f"{policy}/d/{v.path}"] = (
                        keras.ops.convert_to_numpy(gv))
        for v, value in zip(net.non_trainable_variables, frozen):
            arrays[f"{policy}/{v.path}"] = keras.ops.convert_to_numpy(value)
        y, _ = net.stateless_call(trainable, frozen, x, training=False)
        arrays[f"{policy}/inference"] = keras.ops.convert_to_numpy(
            keras.ops.cast(y, "float32"))
    np.savez(os.path.join(out, f"{backend}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
