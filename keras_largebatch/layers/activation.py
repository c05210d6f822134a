"""Activation: Keras' layer, with ReLU as one torch op."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS


@keras_largebatch_export("keras_largebatch.layers.Activation")
class Activation(keras.layers.Activation):
    """`keras.layers.Activation`, with the same constructor and config; on
    torch, `"relu"` in one op.

    On the torch backend, for `keras.activations.relu` with its defaults
    (what `Activation("relu")` holds):

    ```
    y = torch.relu(x)
    ```

    which is what Keras computes, without the no-op conversions
    (`Tensor.to`) its `convert_to_tensor` launches on the way. Any other
    activation, and JAX and TensorFlow, is Keras' own layer.

    Args: those of `keras.layers.Activation`.
    """

    def call(self, inputs):
        if TORCH_OPS is None or self.activation is not keras.activations.relu:
            return super().call(inputs)
        return TORCH_OPS.relu(inputs)
