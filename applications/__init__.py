"""Models for large-batch training: ResNet-50 (v1, v1.5), AlexNet-BN, and a
CIFAR-style ResNet for CPU-scale studies.

`ResNet50` is weight-compatible with `keras.applications.ResNet50`;
`AlexNetBN` follows Jia et al. 2018 (arXiv:1807.11205). Neither imports the
optimizers or the distribution code.
"""

from . import alexnet_bn
from . import resnet
from . import resnet_cifar
from .alexnet_bn import AlexNetBN
from .resnet import ResNet50
from .resnet_cifar import ResNetCIFAR
from .weights import load_weights
from .weights import load_weights_except_classifier

__all__ = [
    "AlexNetBN",
    "ResNet50",
    "ResNetCIFAR",
    "alexnet_bn",
    "load_weights",
    "load_weights_except_classifier",
    "resnet",
    "resnet_cifar",
]
