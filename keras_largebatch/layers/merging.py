"""Add: Keras' layer, summing with torch's own `add`."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS


@keras_largebatch_export("keras_largebatch.layers.Add")
class Add(keras.layers.Add):
    """`keras.layers.Add`, with the same constructor and config; on torch,
    one `add` per further input.

    On the torch backend, once Keras has brought the inputs to one rank
    (`Merge.call`):

    ```
    y = x[0] + x[1] + ...     # left to right, as Keras adds them
    ```

    without the no-op conversions (`Tensor.to`) Keras' `ops.add` launches
    for each input. On JAX and TensorFlow this is Keras' own layer.

    Args: those of `keras.layers.Add`.
    """

    def _merge_function(self, inputs):
        if TORCH_OPS is None:
            return super()._merge_function(inputs)
        return TORCH_OPS.add_all(inputs)
