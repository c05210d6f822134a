"""BatchNormalization: Keras' layer, as one fused batch-norm kernel on torch."""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.fast_path import TORCH_OPS

_FAST_DTYPES = ("float32", "float16", "bfloat16")


@keras_largebatch_export("keras_largebatch.layers.BatchNormalization")
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization`, with the same constructor, config,
    variables and variable names; on torch, one fused kernel.

    On the torch backend, in training (`training=True` and the layer
    trainable):

    ```
    y, mean, invstd = native_batch_norm(x.movedim(axis, 1), gamma, beta,
                                        training=True, eps=epsilon)
    variance = invstd**-2 - epsilon               # biased, as Keras'
    moving_mean = moving_mean * momentum + mean * (1 - momentum)
    moving_variance = moving_variance * momentum + variance * (1 - momentum)
    ```

    and in inference one `batch_norm` with the moving statistics. For an
    NHWC input with `axis=-1`, `x.movedim(-1, 1)` is a channels_last view,
    which the kernel takes without a copy (a contiguous one goes in as the
    2-D view `x.view(-1, channels)`, the same kernel). The moving statistics
    are written in place, one `lerp_` each, as Keras' own
    `Variable.assign` writes them outside a stateless scope, and through
    `assign` inside one, so `stateless_call` and `torch.compile` see the
    update; the statistics and the normalization are computed in float32
    for float16 and bfloat16 inputs (torch's mixed-type kernel), as Keras
    computes them. Keras 3.15 instead computes the moments and then five
    elementwise ops. With `renorm`, a mask, or variables not in float32,
    and on JAX and TensorFlow, this is Keras' own layer.

    The batch variance comes back from the inverse standard deviation: it
    is exact to float32 rounding of `variance + epsilon`, which is all that
    the moving variance is used in.

    Args: those of `keras.layers.BatchNormalization`.

    Reference:
        Ioffe & Szegedy 2015, arXiv:1502.03167.
    """

    def call(self, inputs, training=None, mask=None):
        ops = TORCH_OPS
        if (ops is None or mask is not None or self.renorm
                or len(inputs.shape) < 2
                or self.variable_dtype != "float32"
                or self.compute_dtype not in _FAST_DTYPES
                or keras.backend.standardize_dtype(inputs.dtype)
                != self.compute_dtype):
            return super().call(inputs, training=training, mask=mask)
        gamma = self.gamma.value if self.scale else None
        beta = self.beta.value if self.center else None
        if training and self.trainable:
            outputs, mean, variance = ops.batch_norm_train(
                inputs, self.axis, gamma, beta, self.epsilon)
            ops.update_moving(self.moving_mean, mean, self.momentum)
            ops.update_moving(self.moving_variance, variance, self.momentum)
            return outputs
        return ops.batch_norm_infer(inputs, self.axis, self.moving_mean.value,
                                    self.moving_variance.value, gamma, beta,
                                    self.epsilon)
