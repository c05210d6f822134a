"""Where the layers' torch path is: chosen once, by the backend, when the
package is imported (a lookup at call time would stop `torch.compile`)."""

import importlib

import keras

# `keras_largebatch.layers.torch_ops` on the torch backend; None on the
# others, where the layers are Keras' own.
TORCH_OPS = (importlib.import_module("keras_largebatch.layers.torch_ops")
             if keras.backend.backend() == "torch" else None)
