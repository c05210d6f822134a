"""A model's layers as the package's or as Keras' own: `swap_in`, `to_stock`.

Both rebuild the model with `keras.models.clone_model`, each swapped layer
from its config in the other class (same config, same variables, same
names), and copy every weight (a copy of its own, no buffer shared with
`model`); other layers are rebuilt as they are. The result is a new,
uncompiled model that computes what `model` computes.
"""

import keras

from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.layers.activation import Activation
from keras_largebatch.layers.batch_normalization import BatchNormalization
from keras_largebatch.layers.conv import Conv2D
from keras_largebatch.layers.merging import Add
from keras_largebatch.layers.pooling import MaxPooling2D
from keras_largebatch.layers.zero_padding import ZeroPadding2D

# (Keras' class, the package's): swapped by exact class, so that another
# subclass of Keras' layer, with its own behaviour, is left as it is.
PAIRS = (
    (keras.layers.Conv2D, Conv2D),
    (keras.layers.BatchNormalization, BatchNormalization),
    (keras.layers.MaxPooling2D, MaxPooling2D),
    (keras.layers.Activation, Activation),
    (keras.layers.Add, Add),
    (keras.layers.ZeroPadding2D, ZeroPadding2D),
)


@keras_largebatch_export("keras_largebatch.layers.swap_in")
def swap_in(model):
    """`model` with `keras_largebatch.layers` in place of Keras' `Conv2D`,
    `BatchNormalization`, `MaxPooling2D`, `Activation`, `Add` and
    `ZeroPadding2D`, weights copied.

    Changes only what runs on the torch backend (torch's kernels on
    channels_last views); on JAX and TensorFlow the layers are Keras' own.

    Args:
        model: A Functional or Sequential Keras model (nested ones too).

    Returns:
        A new, uncompiled model with the same layer names and weights.
    """
    return _converted(model, {stock: ours for stock, ours in PAIRS})


@keras_largebatch_export("keras_largebatch.layers.to_stock")
def to_stock(model):
    """`model` with Keras' own `Conv2D`, `BatchNormalization`,
    `MaxPooling2D`, `Activation`, `Add` and `ZeroPadding2D` in place of
    `keras_largebatch.layers`', weights copied:
    a `.keras` file saved from it names only Keras' classes for these
    layers, and loads where keras_largebatch is not installed.

    Args:
        model: A Functional or Sequential Keras model (nested ones too).

    Returns:
        A new, uncompiled model with the same layer names and weights.
    """
    return _converted(model, {ours: stock for stock, ours in PAIRS})


def _converted(model, classes):
    if not isinstance(model, keras.Model):
        raise ValueError(
            "`model` must be a Functional or Sequential Keras model. "
            f"Received: model={model!r}")

    def clone(layer):
        cls = classes.get(type(layer), type(layer))
        return cls.from_config(layer.get_config())

    new = _uncompiled_clone(model, clone)
    pairs = list(zip(model.weights, new.weights))
    if len(model.weights) != len(new.weights) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in pairs):
        raise ValueError(
            f"`model` {model.name!r} did not clone with the same weights "
            f"({len(model.weights)} variables, the clone "
            f"{len(new.weights)}); is it built? Received: model={model.name!r}")
    # Copied, not shared: on JAX a buffer shared by the two models would
    # be deleted under one of them when the other's jitted step donates it.
    for source, target in pairs:
        target.assign(keras.ops.copy(source.value))
    return new


def _uncompiled_clone(model, clone):
    """`keras.models.clone_model(model)` with `clone`, recursively, but
    uncompiled and with `model`'s input names.

    `clone_model` compiles the clone of a compiled model from its compile
    config (`to_stock` of a model compiled with `LARSMixed` would save that
    optimizer, and load nowhere without the package), unless `model.compiled`
    reads False: so it does, for this call alone. And it names a Functional
    model's new input layers after their tensors (`keras_tensor_3`), not
    as `model` named them: here they get `model`'s names.
    """
    inputs = None
    if not isinstance(model, keras.Sequential):  # It keeps its input's name.
        names = {id(layer.output): layer.name for layer in model.layers
                 if isinstance(layer, keras.layers.InputLayer)}
        inputs = keras.tree.map_structure(
            lambda x: keras.Input(batch_shape=x.shape, dtype=x.dtype,
                                  name=names.get(id(x), x.name)),
            model.input)
    compiled, model.compiled = model.compiled, False
    try:
        return keras.models.clone_model(model, input_tensors=inputs,
                                        clone_function=clone, recursive=True)
    finally:
        model.compiled = compiled
