"""Argument checks and the input layer shared by the applications."""

import keras

from keras_largebatch._shared import require


def check_common_args(weights, include_top, classes, pooling, activation):
    imagenet_top = weights == "imagenet" and include_top
    require(
        not include_top or (isinstance(classes, int)
                            and not isinstance(classes, bool) and classes >= 1),
        "classes", classes, "a positive integer when `include_top=True`",
    )
    require(not imagenet_top or classes == 1000, "classes", classes,
            "1000 with `weights='imagenet'` and `include_top=True`")
    require(pooling in (None, "avg", "max"), "pooling", pooling,
            "one of None, 'avg' or 'max'")
    require(not imagenet_top or activation in (None, "softmax"),
            "classifier_activation", activation,
            "None or 'softmax' with `weights='imagenet'`")


def image_input(input_tensor, input_shape, default_size, min_size, static):
    """Returns `(inputs, x)` for an image model.

    Args:
        input_tensor: Optional Keras tensor to build on.
        input_shape: Optional `(H, W, C)` (or `(C, H, W)` for
            `channels_first`).
        default_size: Height and width used when no shape is given.
        min_size: Smallest accepted height and width.
        static: Whether height and width must be known (a `Flatten` head).
    """
    channels_first = keras.config.image_data_format() == "channels_first"
    if input_tensor is not None:
        shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and tuple(input_shape) != shape:
            raise ValueError(
                "`input_shape` does not match the shape of `input_tensor`. "
                f"Received: input_shape={input_shape}, "
                f"input_tensor.shape={tuple(input_tensor.shape)}"
            )
        input_shape = shape
    elif input_shape is None:
        spatial = (default_size, default_size) if static else (None, None)
        input_shape = (3,) + spatial if channels_first else spatial + (3,)
    input_shape = tuple(input_shape)
    require(len(input_shape) == 3, "input_shape", input_shape,
            "three entries (height, width, channels)")
    spatial = input_shape[1:] if channels_first else input_shape[:2]
    if static and None in spatial:
        raise ValueError(
            "With `include_top=True` this model needs a known height and "
            f"width. Received: input_shape={input_shape}"
        )
    if any(s is not None and s < min_size for s in spatial):
        raise ValueError(
            f"The input must be at least {min_size}x{min_size} for this "
            f"model. Received: input_shape={input_shape}"
        )
    if input_tensor is None:
        x = keras.layers.Input(shape=input_shape)
        return x, x
    if not keras.backend.is_keras_tensor(input_tensor):
        x = keras.layers.Input(tensor=input_tensor, shape=input_shape)
        return x, x
    return keras.utils.get_source_inputs(input_tensor), input_tensor


def bn_axis():
    return 1 if keras.config.image_data_format() == "channels_first" else -1
