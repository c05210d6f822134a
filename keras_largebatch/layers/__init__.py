"""Drop-in layers: Keras' Conv2D, BatchNormalization and MaxPooling2D, on
torch's own kernels over channels_last views without activation copies,
Activation and Add without Keras' per-call conversions, and
ZeroPadding2D with a gradient that is a view;
Keras' own layers on JAX and TensorFlow. `swap_in(model)` and
`to_stock(model)` convert a model's layers either way, weights included."""

from keras_largebatch import api_export as _api_export
from keras_largebatch.layers.activation import Activation
from keras_largebatch.layers.batch_normalization import BatchNormalization
from keras_largebatch.layers.conv import Conv2D
from keras_largebatch.layers.merging import Add
from keras_largebatch.layers.pooling import MaxPooling2D
from keras_largebatch.layers.swap import swap_in
from keras_largebatch.layers.swap import to_stock
from keras_largebatch.layers.zero_padding import ZeroPadding2D

__all__ = _api_export.public_names(__name__)
