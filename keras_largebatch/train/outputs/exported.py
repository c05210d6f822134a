"""The saved model takes the data set's own images: `exported(model, spec)`.

The command trains on images it has resized, repeated to three channels
and scaled to [-1, 1] in its input pipeline. The `.keras` files it writes
(`save_keras`) do the same inside, in stock Keras layers, so that
the data set's images as it gives them (`DataSpec.raw`) score as in
training:

    images (H, W, C) in [0, max_value]      e.g. digits 8x8x1 in 0..16,
      -> Rescaling(2 / max_value, -1)         Fashion-MNIST 28x28x1 uint8
      -> Resizing(size, size, "bilinear")   where H, W differ from the size
      -> Concatenate([x, x, x])             where C is 1 and the model's 3
      -> the trained layers

The trained layers are inserted with `keras.models.clone_model`'s
`call_function`, so the file's weights sit under the same layer names as
the training model's: resuming, evaluating and `--init_weights` read them
as before. A data set without `raw` (ImageNet TFRecords, normalized while
decoding) keeps the model's input. Where `keras_largebatch.layers.to_stock`
exists, the layers are first copied, the package's own as stock ones, with
the weights' current values (no buffer shared with the training model), so
that loading needs no package (the CIFAR ResNet's `PadChannels` still does).
"""

import keras

from keras_largebatch.train.checkpointing import epochs as checkpoints

# The preprocessing layers' dtype: scaling 0..255 in float16 would round.
DTYPE = "float32"


def exported(model, spec):
    """`model` taking `spec.raw` images (itself where `spec.raw` is None),
    its layers stock where the package can say."""
    model = _stock(model)
    raw = getattr(spec, "raw", None)
    if raw is None:
        return model
    size = spec.image_size
    channels = model.inputs[0].shape[-1]
    images = keras.Input(raw.shape, name="images")
    x = keras.layers.Rescaling(2.0 / raw.max_value, -1.0, dtype=DTYPE,
                               name="scale_to_unit_range")(images)
    if tuple(raw.shape[:2]) != (size, size):
        x = keras.layers.Resizing(size, size, "bilinear", dtype=DTYPE,
                                  name="resize")(x)
    if raw.shape[-1] == 1 and channels == 3:
        x = keras.layers.Concatenate(dtype=DTYPE, name="grey_to_rgb")(
            [x, x, x])
    prepared = x

    def call(layer, *args, **kwargs):
        args = keras.tree.map_structure(
            lambda t: prepared if t is images else t, args)
        return layer(*args, **kwargs)

    return keras.models.clone_model(
        model, input_tensors=images, clone_function=lambda layer: layer,
        call_function=call)


def _stock(model):
    """`keras_largebatch.layers.to_stock(model)` where the package has it,
    else `model`."""
    try:
        from keras_largebatch.layers import to_stock
    except ImportError:
        return model
    return to_stock(model)


def save_keras(model, spec, path):
    """Writes `model` as a `.keras` file at `path` taking the data set's
    own images (`exported`, `spec` a `DataSpec`), atomically,
    without optimizer: every `.keras` file of the command is written
    here."""
    checkpoints.save_model(exported(model, spec), path)
