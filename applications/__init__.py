"""Models for large-batch training: ResNet-50 (v1, v1.5) and AlexNet-BN.

`ResNet50` is weight-compatible with `keras.applications.ResNet50`;
`AlexNetBN` follows Jia et al. 2018 (arXiv:1807.11205). Neither imports the
optimizers or the distribution code.
"""

from . import alexnet_bn
from . import resnet
from .alexnet_bn import AlexNetBN
from .resnet import ResNet50
from .weights import load_weights
from .weights import load_weights_except_classifier

__all__ = [
    "AlexNetBN",
    "ResNet50",
    "alexnet_bn",
    "load_weights",
    "load_weights_except_classifier",
    "resnet",
]
