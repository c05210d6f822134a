"""ZeroPadding2D: Keras' layer, with a gradient that is a view, not a copy."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS


@keras_largebatch_export("keras_largebatch.layers.ZeroPadding2D")
class ZeroPadding2D(keras.layers.ZeroPadding2D):
    """`keras.layers.ZeroPadding2D`, with the same constructor and config; on
    torch, a backward pass without a copy.

    On the torch backend, for either data format:

    ```
    y = pad(x, padding)              # one constant_pad_nd, as Keras
    dx = dy[:, top:top + h, left:left + w, :]   # a view (channels_last)
    ```

    Keras' `ops.pad` is torch's `pad`, whose gradient (`constant_pad_nd`
    with negative pads) copies `dy`'s interior into a new tensor; here it is
    a view of `dy`, which the next layer's gradient reads as it is. The
    forward pass writes `x` into the padded tensor, as Keras' does. A
    negative `padding` (a crop, which Keras does not check for) and JAX and
    TensorFlow are Keras' own layer.

    Args: those of `keras.layers.ZeroPadding2D`.
    """

    def call(self, inputs):
        (top, bottom), (left, right) = self.padding
        if TORCH_OPS is None or min(top, bottom, left, right) < 0:
            return super().call(inputs)
        if self.data_format == "channels_first":
            pads = (left, right, top, bottom)
        else:
            pads = (0, 0, left, right, top, bottom)
        return TORCH_OPS.zero_pad(inputs, pads)
