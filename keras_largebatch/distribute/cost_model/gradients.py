"""Gradient sets: the bytes of each trainable tensor of a model."""

import os

import numpy as np

from keras_largebatch._shared import require


def resnet50_shapes(classes=1000):
    """Trainable shapes of `keras.applications.ResNet50`, in its order.

    Keras lists a functional model's layers topologically: in a block with
    a projection shortcut, `0_conv` and `3_conv` come after `2_bn`, then
    `0_bn` and `3_bn`.
    """

    def conv(k, c_in, c_out):
        return [(k, k, c_in, c_out), (c_out,)]

    def bn(c):
        return [(c,), (c,)]

    shapes = conv(7, 3, 64) + bn(64)
    cin = 64
    for f, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            shapes += conv(1, cin, f) + bn(f) + conv(3, f, f) + bn(f)
            if block == 0:
                shapes += conv(1, cin, 4 * f) + conv(1, f, 4 * f) + bn(4 * f) * 2
            else:
                shapes += conv(1, f, 4 * f) + bn(4 * f)
            cin = 4 * f
    return shapes + [(2048, classes), (classes,)]


def alexnet_bn_shapes(classes=1000):
    """Trainable shapes of AlexNet-BN at 227x227 (grouped conv2, 4, 5).

    Conv kernels (kh, kw, cin / groups, cout) with biases, batch-norm gamma
    and beta after conv1-5, then fc6-8 with biases.
    """
    shapes = []
    convs = ((11, 3, 96), (5, 48, 256), (3, 256, 384), (3, 192, 384), (3, 192, 256))
    for k, cin, cout in convs:
        shapes += [(k, k, cin, cout), (cout,), (cout,), (cout,)]
    for fin, fout in ((6 * 6 * 256, 4096), (4096, 4096), (4096, classes)):
        shapes += [(fin, fout), (fout,)]
    return shapes


def saved_model_shapes(path):
    """Trainable shapes of a saved `.keras` (or `.h5`) model."""
    require(
        os.path.isfile(path), "model", path,
        "`resnet50`, `alexnet_bn` or the path of a saved Keras model",
    )
    import keras

    model = keras.saving.load_model(path, compile=False)
    return [tuple(int(d) for d in w.shape) for w in model.trainable_weights]


def gradient_bytes(model, bytes_per_element=4):
    """Bytes of each gradient tensor of `model`, in forward order."""
    require(
        bytes_per_element in (2, 4), "bytes_per_element", bytes_per_element,
        "2 (float16) or 4 (float32)",
    )
    if model == "resnet50":
        shapes = resnet50_shapes()
    elif model == "alexnet_bn":
        shapes = alexnet_bn_shapes()
    else:
        shapes = saved_model_shapes(model)
    return [int(np.prod(s)) * bytes_per_element for s in shapes]
