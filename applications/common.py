"""Argument checks and the input layer shared by the applications."""

import keras


def check_common_args(weights, include_top, classes, pooling, activation):
    if include_top and (not isinstance(classes, int) or classes < 1):
        raise ValueError(
            "`classes` must be a positive integer when `include_top=True`. "
            f"Received: classes={classes}"
        )
    if weights == "imagenet" and include_top and classes != 1000:
        raise ValueError(
            "With `weights='imagenet'` and `include_top=True`, `classes` "
            f"must be 1000. Received: classes={classes}"
        )
    if pooling not in (None, "avg", "max"):
        raise ValueError(
            "`pooling` must be one of None, 'avg' or 'max'. "
            f"Received: pooling={pooling}"
        )
    if weights == "imagenet" and include_top and activation not in (
        None,
        "softmax",
    ):
        raise ValueError(
            "With `weights='imagenet'`, `classifier_activation` must be "
            "None or 'softmax'. "
            f"Received: classifier_activation={activation}"
        )


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
    if len(input_shape) != 3:
        raise ValueError(
            "`input_shape` must have three entries (height, width, channels)."
            f" Received: input_shape={input_shape}"
        )
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
