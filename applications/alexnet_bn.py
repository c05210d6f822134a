"""AlexNet with batch normalization (AlexNet-BN), as trained by Jia et al.

Intel Caffe's `alexnet_bn` (used by You et al. for LARS) without LRN, plus
the BN after pool5 that Jia et al. add. Default input 227x227x3:

```
conv1 96 11x11/4 valid, ReLU -> pool1 3x3/2 -> bn1          55 -> 27
conv2 256 5x5 same, groups=2, ReLU -> pool2 3x3/2 -> bn2    27 -> 13
conv3 384 3x3 same, ReLU -> bn3
conv4 384 3x3 same, groups=2, ReLU -> bn4
conv5 256 3x3 same, groups=2, ReLU -> pool5 3x3/2 -> bn5    13 -> 6
flatten -> fc6 4096 ReLU, dropout -> fc7 4096 ReLU, dropout -> predictions
```

With 1000 classes at 227x227: 60,970,728 parameters, 60,967,976 trainable.

References:
    Krizhevsky et al. 2012 (AlexNet); Ioffe & Szegedy 2015,
    arXiv:1502.03167 (BN); You et al. 2017, arXiv:1708.03888 (LARS);
    Jia et al. 2018, arXiv:1807.11205 (BN after pool5).
"""

import keras
from keras.applications import imagenet_utils

from keras_largebatch._shared import require
from keras_largebatch.layers import BatchNormalization
from keras_largebatch.layers import Conv2D
from keras_largebatch.layers import MaxPooling2D

from . import common
from . import weights as weights_lib

# The smallest input for which pool5 still gets a 3x3 map:
# 67 -conv1-> 15 -pool1-> 7 -pool2-> 3 -pool5-> 1 (66 gives 14, 6, 2, 0).
MIN_SIZE = 67


def AlexNetBN(
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    dropout=0.5,
    name="alexnet_bn",
):
    """Instantiates AlexNet-BN.

    Args:
        include_top: Whether to end with `flatten`, `fc6`, `fc7` and
            `predictions`. Defaults to `True`.
        weights: `None` (random) or a path to a `.h5`/`.hdf5`/`.weights.h5`
            checkpoint of this architecture. There are no official ImageNet
            weights, so `"imagenet"` is refused.
        input_tensor: Optional Keras tensor to build the model on.
        input_shape: Optional `(H, W, 3)`; H and W at least 67. Defaults to
            `(227, 227, 3)` with the top, `(None, None, 3)` without.
        pooling: `None`, `"avg"` or `"max"` after bn5 when
            `include_top=False`.
        classes: Number of classes with the top. Defaults to 1000.
        classifier_activation: Activation of `predictions`; `None` gives
            logits. The classifier computes in float32.
        dropout: Dropout rate after fc6 and fc7, in `[0, 1)`.
        name: Model name. Defaults to `"alexnet_bn"`.

    Returns:
        A `keras.Model`.
    """
    if weights == "imagenet":
        raise ValueError(
            "There are no official ImageNet weights for AlexNetBN; pass None "
            "or the path to your own checkpoint. Received: weights=imagenet"
        )
    if weights is not None:
        weights_lib._check_filepath(weights)
    require(0 <= dropout < 1, "dropout", dropout, "in [0, 1)")
    common.check_common_args(
        weights, include_top, classes, pooling, classifier_activation
    )
    inputs, x = common.image_input(
        input_tensor, input_shape, 227, MIN_SIZE, static=include_top
    )
    layers = keras.layers
    axis = common.bn_axis()
    convs = [
        # name, filters, kernel, strides, padding, groups, pool
        ("1", 96, 11, 4, "valid", 1, True),
        ("2", 256, 5, 1, "same", 2, True),
        ("3", 384, 3, 1, "same", 1, False),
        ("4", 384, 3, 1, "same", 2, False),
        ("5", 256, 3, 1, "same", 2, True),
    ]
    for i, filters, kernel, strides, padding, groups, pool in convs:
        x = Conv2D(
            filters,
            kernel,
            strides=strides,
            padding=padding,
            groups=groups,
            activation="relu",
            name=f"conv{i}",
        )(x)
        if pool:
            x = MaxPooling2D(3, strides=2, name=f"pool{i}")(x)
        x = BatchNormalization(axis=axis, name=f"bn{i}")(x)
    if include_top:
        x = layers.Flatten(name="flatten")(x)
        for fc in ("fc6", "fc7"):
            x = layers.Dense(4096, activation="relu", name=fc)(x)
            x = layers.Dropout(dropout, name=f"{fc}_dropout")(x)
        x = layers.Dense(
            classes,
            activation=classifier_activation,
            dtype="float32",
            name="predictions",
        )(x)
    elif pooling == "avg":
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = layers.GlobalMaxPooling2D(name="max_pool")(x)
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        weights_lib.load_weights(model, weights)
    return model


def preprocess_input(x, data_format=None):
    """Caffe-style preprocessing (RGB to BGR, minus the ImageNet BGR means).

    The Caffe AlexNet recipes subtract the ImageNet mean; this is the same
    function as `keras_largebatch.applications.resnet.preprocess_input`.
    """
    return imagenet_utils.preprocess_input(
        x, data_format=data_format, mode="caffe"
    )
