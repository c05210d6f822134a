"""Precise batch-norm statistics (Goyal et al. 2017, arXiv:1706.02677).

A large batch leaves few updates, so batch norm's moving averages are built
from few batches, and mostly from early weights: with momentum 0.9 the
statistics at evaluation are a mix of the last ~10 batches' weights, and at
the start of a run they trail the weights a long way. "Precise BN" replaces
them, before an evaluation, by the average over `num_batches` training
batches of the statistics batch norm computes in training mode, with the
weights as they are now (Wu & Johnson, arXiv:2105.07576, §3.1):

    mean     = (1 / N) * sum_i mean(batch_i)
    variance = (1 / N) * sum_i var(batch_i)      # biased, as in training

Each batch is one batch-norm batch: under gradient accumulation or on a
cluster, the per-replica (micro-)batch, not the global one.

    model.fit(train_ds, validation_data=val_ds, callbacks=[
        keras_largebatch.PreciseBatchNorm(train_ds.repeat(), num_batches=200)])

The recomputation runs the model forward in training mode, eagerly, on one
process; layers that are frozen (`trainable=False`) keep their statistics.
"""

import contextlib

import keras
import numpy as np

from keras_largebatch._shared import check_int
from keras_largebatch.api_export import keras_largebatch_export


def batch_norm_layers(model):
    """The model's `BatchNormalization` layers that update in training."""
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.BatchNormalization)
            and layer.trainable]


@keras_largebatch_export("keras_largebatch.recompute_batch_norm_statistics")
def recompute_batch_norm_statistics(model, batches, num_batches):
    """Sets every batch norm's moving statistics to their precise values.

    Args:
        model: A built Keras model.
        batches: An iterable of input batches, or of `(x, y[, w])` tuples
            (a `tf.data.Dataset`, a generator, a list).
        num_batches: Int >= 1, how many batches to average over.

    Returns:
        The number of batch-norm layers updated.

    Raises:
        ValueError: `num_batches` is not an int >= 1, or `batches` holds
            fewer batches; the statistics are then left as they were.
    """
    check_int("num_batches", num_batches, 1)
    layers = batch_norm_layers(model)
    if not layers:
        return 0
    saved = [(layer.momentum, keras.ops.convert_to_numpy(layer.moving_mean),
              keras.ops.convert_to_numpy(layer.moving_variance))
             for layer in layers]
    sums = [[np.zeros(m.shape, np.float64), np.zeros(v.shape, np.float64)]
            for _, m, v in saved]
    seen = 0
    try:
        # Momentum 0: after a forward pass in training mode the moving
        # statistics are that batch's; they are summed in float64 here.
        for layer in layers:
            layer.momentum = 0.0
        with _no_grad():
            for batch in batches:
                if seen == num_batches:
                    break
                model(_inputs(batch), training=True)
                for layer, (mean, variance) in zip(layers, sums):
                    mean += keras.ops.convert_to_numpy(layer.moving_mean)
                    variance += keras.ops.convert_to_numpy(
                        layer.moving_variance)
                seen += 1
    finally:
        for layer, (momentum, mean, variance) in zip(layers, saved):
            layer.momentum = momentum
            if seen < num_batches:  # Interrupted or too few: undo.
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(variance)
    if seen < num_batches:
        raise ValueError(
            f"`num_batches` is more than `batches` holds ({seen} batches); "
            "the statistics were left as they were. Received: "
            f"num_batches={num_batches}")
    for layer, (mean, variance) in zip(layers, sums):
        layer.moving_mean.assign(
            (mean / seen).astype(layer.moving_mean.dtype))
        layer.moving_variance.assign(
            (variance / seen).astype(layer.moving_variance.dtype))
    return len(layers)


@keras_largebatch_export("keras_largebatch.PreciseBatchNorm")
class PreciseBatchNorm(keras.callbacks.Callback):
    """Recomputes batch-norm statistics before every evaluation.

    In `fit`, that is before each epoch's validation (so the epoch's
    checkpoint, saved after it, holds them); in `evaluate(callbacks=[...])`,
    before the evaluation.

    Args:
        batches: An iterable of training batches (iterated anew each time),
            or a callable `epoch -> iterable`, for batches that depend on
            the epoch only (a resumed run then sees the same ones).
        num_batches: Int >= 1, batches averaged each time.
    """

    def __init__(self, batches, num_batches):
        super().__init__()
        self.batches = batches
        self.num_batches = check_int("num_batches", num_batches, 1)
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_test_begin(self, logs=None):
        batches = self.batches
        if callable(batches):
            batches = batches(self._epoch)
        recompute_batch_norm_statistics(self.model, batches, self.num_batches)


def _inputs(batch):
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    if keras.backend.backend() != "tensorflow" and hasattr(x, "numpy"):
        x = x.numpy()  # A tf.data tensor, on the JAX or torch backend.
    return x


def _no_grad():
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()
