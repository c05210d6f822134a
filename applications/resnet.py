"""ResNet-50 v1 / v1.5, weight-compatible with `keras.applications.ResNet50`.

Layer names, layer classes (`keras_largebatch.layers`' Conv2D,
BatchNormalization, MaxPooling2D, Activation, Add and ZeroPadding2D are
Keras' under the same names, fast on torch), their order and all weight
shapes are those of `keras.applications.ResNet50`, so Keras' official
ImageNet files and any `.weights.h5` saved from `keras.applications.ResNet50`
load unchanged.

Bottleneck block (v1), with `s` the block's stride:

```
y = relu(BN(conv1x1(x, stride=s)))   # v1.5: stride 1 here ...
y = relu(BN(conv3x3(y)))             # ... and stride s here
y = BN(conv1x1(y))                   # gamma starts at 0 if zero_init_residual
out = relu(y + shortcut(x))          # shortcut: BN(conv1x1(x, s)) or x
```

References:
    He et al. 2015, arXiv:1512.03385 (ResNet).
    Goyal et al. 2017, arXiv:1706.02677 (zero-init residual gamma).
    NVIDIA DeepLearningExamples, ResNet-50 v1.5 (stride on the 3x3 conv).
"""

import keras
from keras.applications import imagenet_utils

from keras_largebatch._shared import require
from keras_largebatch.layers import Activation
from keras_largebatch.layers import Add
from keras_largebatch.layers import BatchNormalization
from keras_largebatch.layers import Conv2D
from keras_largebatch.layers import MaxPooling2D
from keras_largebatch.layers import ZeroPadding2D

from . import common
from . import weights as weights_lib

# Keras' own URL and md5 hashes (keras/src/applications/resnet.py).
BASE_WEIGHTS_PATH = (
    "https://storage.googleapis.com/tensorflow/keras-applications/resnet/"
)
WEIGHTS_HASHES = {
    "resnet50": (
        "2cb95161c43110f7111970584f804107",
        "4d473c1dd8becc155b73f8504c6f6626",
    ),
}
# Smallest accepted input: the network's total stride. Smaller inputs still
# run (every conv is padded) but reach conv5 as the same 1x1 map; Keras
# rejects them too.
MIN_SIZE = 32
VARIANTS = ("v1", "v1.5")


def _block(x, filters, stride, conv_shortcut, variant, zero_init, bias, name):
    axis = common.bn_axis()

    def bn(y, suffix, gamma="ones"):
        return BatchNormalization(
            axis=axis,
            epsilon=1.001e-5,
            gamma_initializer=gamma,
            name=f"{name}_{suffix}_bn",
        )(y)

    if conv_shortcut:
        shortcut = Conv2D(
            4 * filters, 1, strides=stride, use_bias=bias, name=f"{name}_0_conv"
        )(x)
        shortcut = bn(shortcut, "0")
    else:
        shortcut = x
    stride1, stride2 = (stride, 1) if variant == "v1" else (1, stride)
    x = Conv2D(
        filters, 1, strides=stride1, use_bias=bias, name=f"{name}_1_conv"
    )(x)
    x = Activation("relu", name=f"{name}_1_relu")(bn(x, "1"))
    x = Conv2D(
        filters,
        3,
        strides=stride2,
        padding="same",
        use_bias=bias,
        name=f"{name}_2_conv",
    )(x)
    x = Activation("relu", name=f"{name}_2_relu")(bn(x, "2"))
    x = Conv2D(
        4 * filters, 1, use_bias=bias, name=f"{name}_3_conv"
    )(x)
    x = bn(x, "3", gamma="zeros" if zero_init else "ones")
    x = Add(name=f"{name}_add")([shortcut, x])
    return Activation("relu", name=f"{name}_out")(x)


def ResNet50(
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    name="resnet50",
    variant="v1",
    zero_init_residual=False,
    use_conv_bias=True,
):
    """Instantiates ResNet-50 (v1 or v1.5).

    Args:
        include_top: Whether to end with global average pooling and the
            `predictions` dense layer. Defaults to `True`.
        weights: `None` (random), `"imagenet"` (Keras' official file via
            `keras.utils.get_file`, cached in `~/.keras/models`) or a path to
            a `.h5`/`.hdf5`/`.weights.h5` file. Defaults to `None`.
        input_tensor: Optional Keras tensor to build the model on.
        input_shape: Optional `(H, W, 3)`; H and W at least 32. Defaults to
            `(224, 224, 3)` with the top, `(None, None, 3)` without.
        pooling: `None`, `"avg"` or `"max"` when `include_top=False`.
        classes: Number of classes with the top. Defaults to 1000.
        classifier_activation: Activation of `predictions`; `None` gives
            logits. The classifier always computes in float32, so under a
            mixed precision policy the output is float32.
        name: Model name. Defaults to `"resnet50"`.
        variant: `"v1"` (stride on the first 1x1 conv, as Keras) or `"v1.5"`
            (stride on the 3x3 conv). Weight shapes are the same.
        zero_init_residual: Start the last BN gamma of each block at zero.
        use_conv_bias: Give the convolutions biases, as Keras does. With
            `False` (each conv feeds a BN, which cancels a bias) biased files
            still load: each bias is folded into the next BN's moving mean.

    Returns:
        A `keras.Model`.
    """
    require(variant in VARIANTS, "variant", variant, f"one of {VARIANTS}")
    if weights not in (None, "imagenet"):
        weights_lib._check_filepath(weights)
    common.check_common_args(
        weights, include_top, classes, pooling, classifier_activation
    )
    inputs, x = common.image_input(
        input_tensor, input_shape, 224, MIN_SIZE, static=include_top
    )
    axis = common.bn_axis()
    x = ZeroPadding2D(3, name="conv1_pad")(x)
    x = Conv2D(
        64, 7, strides=2, use_bias=use_conv_bias, name="conv1_conv"
    )(x)
    x = BatchNormalization(
        axis=axis, epsilon=1.001e-5, name="conv1_bn"
    )(x)
    x = Activation("relu", name="conv1_relu")(x)
    x = ZeroPadding2D(1, name="pool1_pad")(x)
    x = MaxPooling2D(3, strides=2, name="pool1_pool")(x)
    for stage, (filters, blocks, stride) in enumerate(
        [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=2
    ):
        for i in range(1, blocks + 1):
            x = _block(
                x,
                filters,
                stride if i == 1 else 1,
                conv_shortcut=i == 1,
                variant=variant,
                zero_init=zero_init_residual,
                bias=use_conv_bias,
                name=f"conv{stage}_block{i}",
            )
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dense(
            classes,
            activation=classifier_activation,
            dtype="float32",
            name="predictions",
        )(x)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    model = keras.Model(inputs, x, name=name)

    if weights == "imagenet":
        weights = imagenet_weights_path(include_top)
    if weights is not None:
        weights_lib.load_weights(model, weights)
    return model


def imagenet_weights_path(include_top=True):
    """Returns Keras' official ResNet-50 file, downloading it if not cached.

    Goes through `keras.utils.get_file` with Keras' URL, md5 and cache
    (`$KERAS_HOME/models`, by default `~/.keras/models`): a cached file whose
    hash matches is used offline, any other file is downloaded again.
    """
    suffix = "" if include_top else "_notop"
    fname = f"resnet50_weights_tf_dim_ordering_tf_kernels{suffix}.h5"
    return keras.utils.get_file(
        fname,
        BASE_WEIGHTS_PATH + fname,
        cache_subdir="models",
        file_hash=WEIGHTS_HASHES["resnet50"][0 if include_top else 1],
    )


def preprocess_input(x, data_format=None):
    """Caffe-style preprocessing, as `keras.applications.resnet`.

    RGB to BGR, then subtracts the ImageNet channel means
    `[103.939, 116.779, 123.68]` (BGR order); no scaling.
    """
    return imagenet_utils.preprocess_input(
        x, data_format=data_format, mode="caffe"
    )
