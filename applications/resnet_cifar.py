"""CIFAR-style ResNet (He et al. 2016, §4.2), for CPU-scale studies.

Three stages of `n` basic blocks at widths `w, 2w, 4w` (`w = width`,
16 in the paper), `depth = 6n + 2`:

```
conv3x3(w) -> BN -> ReLU                                     H x W
n x [conv3x3 -> BN -> ReLU -> conv3x3 -> BN, + shortcut, ReLU]   w,  H
n x [...], the first with stride 2                           2w, H/2
n x [...], the first with stride 2                           4w, H/4
global average pooling -> predictions
```

The shortcut is the paper's option A for CIFAR: the identity, subsampled
by 2 and zero-padded with the new channels where a stage begins, so it has
no parameters. Convolutions have no bias (a BN follows each). ResNet-20
(`depth=20, width=16`) at 32x32x3 with 10 classes has 269,722 trainable
parameters (0.27 M, the paper's Table 6) and 271,098 in all. Any input of
at least 4x4 works, any number of channels (28x28x1 for Fashion-MNIST).

References:
    He et al. 2016, "Deep Residual Learning for Image Recognition",
    arXiv:1512.03385, §4.2.
"""

import keras
from keras import ops

from keras_largebatch._shared import check_int
from keras_largebatch._shared import require
from keras_largebatch.layers import Activation
from keras_largebatch.layers import Add
from keras_largebatch.layers import BatchNormalization
from keras_largebatch.layers import Conv2D
from keras_largebatch.layers import MaxPooling2D

from . import common

MIN_SIZE = 4


@keras.saving.register_keras_serializable(package="keras_largebatch")
class PadChannels(keras.layers.Layer):
    """Zero-pads the channel axis with `pad` new channels at its end."""

    def __init__(self, pad, **kwargs):
        super().__init__(**kwargs)
        self.pad = int(pad)

    def call(self, x):
        axis = common.bn_axis() % len(x.shape)
        widths = [[0, 0]] * len(x.shape)
        widths[axis] = [0, self.pad]
        return ops.pad(x, widths)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        axis = common.bn_axis() % len(shape)
        shape[axis] += self.pad
        return tuple(shape)

    def get_config(self):
        return {**super().get_config(), "pad": self.pad}


def _block(x, filters, stride, name):
    axis = common.bn_axis()
    shortcut = x
    if stride != 1:
        # Option A: x[:, ::2, ::2] is a 1x1 pooling with stride 2.
        shortcut = MaxPooling2D(
            1, strides=stride, name=f"{name}_0_subsample")(shortcut)
    in_filters = x.shape[axis]
    if in_filters != filters:
        shortcut = PadChannels(filters - in_filters, name=f"{name}_0_pad")(
            shortcut)
    for i, s in ((1, stride), (2, 1)):
        x = Conv2D(
            filters, 3, strides=s, padding="same", use_bias=False,
            kernel_initializer="he_normal", name=f"{name}_{i}_conv")(x)
        x = BatchNormalization(
            axis=axis, epsilon=1e-5, name=f"{name}_{i}_bn")(x)
        if i == 1:
            x = Activation("relu", name=f"{name}_1_relu")(x)
    x = Add(name=f"{name}_add")([shortcut, x])
    return Activation("relu", name=f"{name}_out")(x)


def ResNetCIFAR(
    depth=20,
    width=16,
    include_top=True,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=10,
    classifier_activation="softmax",
    name=None,
):
    """Instantiates a CIFAR-style ResNet of `depth = 6n + 2` layers.

    Args:
        depth: Int, `6n + 2` with `n >= 1` (8, 14, 20, 32, 44, 56, 110).
            Defaults to 20.
        width: Int >= 1, channels of the first stage (then `2 * width`,
            `4 * width`). Defaults to 16, the paper's.
        include_top: Whether to end with global average pooling and the
            `predictions` dense layer. Defaults to `True`.
        input_tensor: Optional Keras tensor to build the model on.
        input_shape: Optional `(H, W, C)`, H and W at least 4, any C.
            Defaults to `(None, None, 3)`.
        pooling: `None`, `"avg"` or `"max"` when `include_top=False`.
        classes: Number of classes with the top. Defaults to 10.
        classifier_activation: Activation of `predictions`; `None` gives
            logits. The classifier computes in float32.
        name: Model name. Defaults to `"resnet{depth}_cifar"`.

    Returns:
        A `keras.Model`.
    """
    require(
        isinstance(depth, int) and not isinstance(depth, bool) and depth >= 8
        and (depth - 2) % 6 == 0,
        "depth", depth, "an int 6n + 2 with n >= 1 (8, 14, 20, 32, ...)",
    )
    check_int("width", width, 1)
    common.check_common_args(
        None, include_top, classes, pooling, classifier_activation)
    inputs, x = common.image_input(
        input_tensor, input_shape, 32, MIN_SIZE, static=False)
    n = (depth - 2) // 6
    x = Conv2D(
        width, 3, padding="same", use_bias=False,
        kernel_initializer="he_normal", name="conv1_conv")(x)
    x = BatchNormalization(
        axis=common.bn_axis(), epsilon=1e-5, name="conv1_bn")(x)
    x = Activation("relu", name="conv1_relu")(x)
    for stage in range(3):
        for i in range(n):
            x = _block(x, width * 2**stage, 2 if stage and not i else 1,
                       name=f"conv{stage + 2}_block{i + 1}")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dense(
            classes, activation=classifier_activation, dtype="float32",
            name="predictions")(x)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return keras.Model(inputs, x, name=name or f"resnet{depth}_cifar")
