"""Conv2D: Keras' layer, on torch's convolution over a channels_last view."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS


@keras_largebatch_export("keras_largebatch.layers.Conv2D")
class Conv2D(keras.layers.Conv2D):
    """`keras.layers.Conv2D`, with the same constructor, config, variables and
    variable names; on torch, one convolution without copies.

    On the torch backend with `data_format="channels_last"` (the default):

    ```
    w = kernel.permute(3, 2, 0, 1)        # (kh, kw, in, out) -> (out, in, kh, kw)
    y = conv2d(x.permute(0, 3, 1, 2), w, bias, strides, padding, dilation,
               groups).permute(0, 2, 3, 1)
    ```

    `x.permute(0, 3, 1, 2)` of an NHWC tensor is an NCHW tensor in
    channels_last memory, which torch's convolution takes without a copy;
    its result permuted back is the NHWC output, again without one. Keras
    3.15 copies the input twice and transposes the kernel's result back.
    `"same"` padding is Keras': where it is uneven (a stride that does not
    divide the input) the input is padded first, as in Keras. On JAX and
    TensorFlow, and with `channels_first`, this is Keras' own layer.

    Weights files and `.keras` files interchange with `keras.layers.Conv2D`:
    the class name, config and variables are the same
    (`keras_largebatch.layers.to_stock` / `swap_in` convert whole models).

    Args: those of `keras.layers.Conv2D`.
    """

    def call(self, inputs):
        ops = TORCH_OPS
        if ops is None or self.data_format != "channels_last":
            return super().call(inputs)
        kernel = self.kernel
        if isinstance(kernel, keras.Variable):  # Not LoRA's sum.
            kernel = kernel.value
        bias = self.bias.value if self.use_bias else None
        outputs = ops.conv2d(inputs, kernel, bias, self.strides, self.padding,
                             self.dilation_rate, self.groups)
        if self.activation is not None:
            return self.activation(outputs)
        return outputs
