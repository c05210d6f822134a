"""MaxPooling2D: Keras' layer, on torch's pooling over a channels_last view."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS


@keras_largebatch_export("keras_largebatch.layers.MaxPooling2D")
class MaxPooling2D(keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D`, with the same constructor and config; on
    torch, one pooling kernel without transposes.

    On the torch backend with `data_format="channels_last"`:

    ```
    y = max_pool2d(x.permute(0, 3, 1, 2), pool_size, strides,
                   padding).permute(0, 2, 3, 1)
    ```

    on a channels_last view, as `Conv2D`. `"valid"`, and `"same"` where it
    pads as much before as after (torch pads with `-inf`, as Keras' max
    pooling ignores its padding); uneven `"same"` padding, `channels_first`,
    JAX and TensorFlow are Keras' own layer.

    Args: those of `keras.layers.MaxPooling2D`.
    """

    def call(self, inputs):
        ops = TORCH_OPS
        pad = None
        if ops is not None and self.data_format == "channels_last":
            pad = self._torch_padding(ops, inputs.shape)
        if pad is None:
            return super().call(inputs)
        return ops.max_pool2d(inputs, self.pool_size, self.strides, pad)

    def _torch_padding(self, ops, shape):
        """The symmetric padding torch's pooling takes; None where there is
        none such."""
        if self.padding.lower() == "valid":
            return (0, 0)
        pads = [ops.same_padding(shape[1 + i], self.pool_size[i],
                                 self.strides[i]) for i in range(2)]
        if all(a == b and 2 * a <= k
               for (a, b), k in zip(pads, self.pool_size)):
            return tuple(a for a, _ in pads)
        return None
