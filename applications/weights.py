"""Checked, by-name weight loading for the applications.

Two file formats are read, both straight from HDF5 so that every backend
takes the same path:

- legacy `.h5` / `.hdf5` (Keras 2, and the official
  `keras.applications` ImageNet files): one group per layer *name*, with
  a `weight_names` attribute giving the order of the arrays;
- Keras 3 `.weights.h5`: one group per layer under `layers/`, keyed by the
  layer's class in snake case plus a per-class counter in the order of
  `model.layers` (`conv2d`, `conv2d_1`, ...), which is how
  `model.save_weights` writes them. Two models with the same layer classes
  in the same order therefore exchange `.weights.h5` files. A `.keras`
  file holds one such file (`model.weights.h5`), read from the archive.

Before any variable is written, every layer that holds weights is checked
against the file (present, same number of arrays, same shapes); the first
mismatch raises a `ValueError` naming the file and the layer, so a file from
another architecture never leaves a model half loaded.
"""

import io
import os
import re
import zipfile

import h5py
import numpy as np


_WEIGHTS_SUFFIXES = (".weights.h5", ".h5", ".hdf5", ".keras")
_KERAS_WEIGHTS = "model.weights.h5"  # The weights inside a `.keras` file.


def _snake_case(name):
    # Same rule as `keras.src.utils.naming.to_snake_case`.
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    name = re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
    return name


def _weights_h5_keys(model):
    """Maps layer name -> group key used by `model.save_weights`."""
    used, keys = {}, {}
    for layer in model.layers:
        base = _snake_case(layer.__class__.__name__)
        if base in used:
            used[base] += 1
            keys[layer.name] = f"{base}_{used[base]}"
        else:
            used[base] = 0
            keys[layer.name] = base
    return keys


def _check_filepath(filepath):
    try:
        filepath = os.fspath(filepath)
    except TypeError:
        raise ValueError(
            "`weights` must be None, a path to a weights file, or (ResNet50 "
            f"only) 'imagenet'. Received: weights={filepath!r}"
        ) from None
    if not str(filepath).endswith(_WEIGHTS_SUFFIXES):
        raise ValueError(
            "The `weights` file must end in `.weights.h5`, `.h5`, `.hdf5` or "
            "`.keras`. "
            f"Received: weights={filepath}"
        )
    if not os.path.isfile(filepath):
        raise ValueError(
            f"The `weights` file {filepath} does not exist. Pass `None`, a "
            "path to an existing weights file, or (ResNet50 only) "
            f"'imagenet'. Received: weights={filepath}"
        )
    return filepath


def read_layer_weights(model, filepath):
    """Reads the arrays that `filepath` holds for each layer of `model`.

    Returns:
        A dict from layer name to a list of NumPy arrays, in the order of
        `layer.weights`; layers that the file does not hold are absent.
    """
    filepath = _check_filepath(filepath)
    arrays = {}
    keras_file = filepath.endswith(".keras")
    try:
        if keras_file:
            with zipfile.ZipFile(filepath) as archive:
                f = h5py.File(io.BytesIO(archive.read(_KERAS_WEIGHTS)), "r")
        else:
            f = h5py.File(filepath, "r")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        kind = "`.keras` file with weights" if keras_file else "HDF5 file"
        raise ValueError(
            f"The `weights` file {filepath} is not a readable {kind} "
            f"({e}). Received: weights={filepath}"
        ) from e
    with f:
        if keras_file or filepath.endswith(".weights.h5"):
            layers = f["layers"] if "layers" in f else {}
            for name, key in _weights_h5_keys(model).items():
                if key in layers and "vars" in layers[key]:
                    group = layers[key]["vars"]
                    arrays[name] = [
                        np.asarray(group[str(i)]) for i in range(len(group))
                    ]
        else:
            if "layer_names" not in f.attrs and "model_weights" in f:
                f = f["model_weights"]
            for layer in model.layers:
                if layer.name not in f:
                    continue
                group = f[layer.name]
                names = [
                    n.decode("utf8") if isinstance(n, bytes) else n
                    for n in group.attrs.get("weight_names", [])
                ]
                arrays[layer.name] = [np.asarray(group[n]) for n in names]
    return arrays


def load_weights(model, filepath, skip_layers=()):
    """Loads `filepath` into `model` after checking every layer.

    Args:
        model: A Keras model.
        filepath: A legacy `.h5`/`.hdf5` file (matched by layer name), or a
            Keras 3 `.weights.h5` or `.keras` file (matched by layer class
            and order).
        skip_layers: Names of layers left as they are (for example
            `("predictions",)` to keep a new classifier).

    Raises:
        ValueError: if the file is missing, is not HDF5, or does not hold
            weights of the right shapes for a layer of `model`; the message
            names the file and the first such layer. Nothing is written then.
    """
    filepath = os.fspath(filepath)
    skip_layers = set(skip_layers)
    unknown = skip_layers - {layer.name for layer in model.layers}
    if unknown:
        raise ValueError(
            f"`skip_layers` names layers that `{model.name}` does not have: "
            f"{sorted(unknown)}. Received: skip_layers={sorted(skip_layers)}"
        )
    file_weights = read_layer_weights(model, filepath)
    plan, folds = [], {}
    for layer in model.layers:
        if not layer.weights or layer.name in skip_layers:
            continue
        expected = [tuple(v.shape) for v in layer.weights]
        if layer.name not in file_weights:
            raise ValueError(
                f"The `weights` file {filepath} does not match model "
                f"`{model.name}`: it has no weights for layer `{layer.name}` "
                f"(expected shapes {expected}). Received: weights={filepath}"
            )
        got_arrays = file_weights[layer.name]
        got = [a.shape for a in got_arrays]
        if (
            # A biased file into a bias-free ResNet conv: BN(conv(x) + b)
            # equals BN(conv(x)) with moving_mean - b, and in training BN
            # subtracts the batch mean, which removes b anyway.
            getattr(layer, "use_bias", None) is False
            and layer.name.endswith("_conv")
            and len(got) == len(expected) + 1
            and got[:-1] == expected
        ):
            folds[layer.name[: -len("_conv")] + "_bn"] = got_arrays[1]
            got_arrays, got = got_arrays[:-1], got[:-1]
        if got != expected:
            raise ValueError(
                f"The `weights` file {filepath} does not match model "
                f"`{model.name}`: layer `{layer.name}` expects shapes "
                f"{expected} but the file holds {got}. "
                f"Received: weights={filepath}"
            )
        plan.append((layer, got_arrays))
    missing = set(folds) - {layer.name for layer, _ in plan}
    if missing:
        raise ValueError(
            f"The `weights` file {filepath} has conv biases that cannot be "
            f"folded: model `{model.name}` has no batch norm layers "
            f"{sorted(missing)}. Received: weights={filepath}"
        )
    for layer, values in plan:
        if layer.name in folds:
            # gamma, beta, moving_mean, moving_variance
            values = list(values)
            values[2] = values[2] - folds[layer.name]
        for variable, value in zip(layer.weights, values):
            variable.assign(value)
    return model


def load_weights_except_classifier(model, filepath, classifier="predictions"):
    """Loads every layer of a checkpoint except the classifier.

    The usual fine-tuning start: the checkpoint was trained with, say,
    1000 classes, `model` was built with another number; all layers but
    `classifier` are loaded and checked, `classifier` keeps its fresh
    initialization.

    Args:
        model: A model built by `ResNet50` or `AlexNetBN` (or any model
            whose layers match the checkpoint).
        filepath: `.h5`, `.hdf5`, `.weights.h5` or `.keras` file.
        classifier: Name of the layer to leave out. Defaults to
            `"predictions"`.
    """
    names = {layer.name for layer in model.layers}
    skip = (classifier,) if classifier in names else ()
    return load_weights(model, filepath, skip_layers=skip)
