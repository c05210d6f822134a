"""The network: `build_model` by name, its input size (`image_size_for`)
and channels, and `--init_weights` (`load_init_weights`); `build_network`, the
run's network from its `network` config."""

import keras

from keras_largebatch import applications
from keras_largebatch._shared import require

DEFAULT_IMAGE_SIZE = {"alexnet_bn": 67, "resnet50": 32, "resnet50_v1_5": 32,
                      "resnet_cifar": 32}
MIN_IMAGE_SIZE = {
    "alexnet_bn": applications.alexnet_bn.MIN_SIZE,
    "resnet50": applications.resnet.MIN_SIZE,
    "resnet50_v1_5": applications.resnet.MIN_SIZE,
    "resnet_cifar": applications.resnet_cifar.MIN_SIZE,
}


def image_size_for(model_name, native_size=None, image_size=0):
    """`--image_size`, or the model's default; resnet_cifar's is the data
    set's own size `native_size` (`data.registry.native_size`) where it has
    one (and it keeps the data's channels)."""
    if image_size:
        return image_size
    if model_name == "resnet_cifar" and native_size:
        return native_size
    return DEFAULT_IMAGE_SIZE[model_name]


def input_channels(model_name):
    """3 for the ImageNet models; None (the data's own) for resnet_cifar."""
    return None if model_name == "resnet_cifar" else 3


def build_network(network, spec):
    """The model of `network` (`RunConfig.network`) for the data set `spec`
    (`data.DataSpec`), `--init_weights` loaded; call it in the strategy's
    scope."""
    model = build_model(network.model, spec.image_size, spec.num_classes,
                        network.bn_momentum, spec.channels,
                        network.resnet_depth, network.resnet_width,
                        zero_init_residual=network.zero_init_residual)
    if network.init_weights:
        load_init_weights(model, network.init_weights)
    return model


def build_model(model_name, image_size, num_classes, bn_momentum=None,
                channels=3, depth=20, width=16, zero_init_residual=False):
    """Builds an untrained model under the current dtype policy
    (`zero_init_residual`: ResNet-50's, see `applications.ResNet50`)."""
    require(model_name in DEFAULT_IMAGE_SIZE, "model", model_name,
            "one of alexnet_bn, resnet50, resnet50_v1_5, resnet_cifar")
    shape = (image_size, image_size, channels)
    if model_name == "resnet_cifar":
        model = applications.ResNetCIFAR(
            depth, width, input_shape=shape, classes=num_classes)
    elif model_name == "alexnet_bn":
        model = applications.AlexNetBN(
            weights=None, input_shape=shape, classes=num_classes)
    else:
        variant = "v1" if model_name == "resnet50" else "v1.5"
        model = applications.ResNet50(
            weights=None, input_shape=shape, classes=num_classes,
            variant=variant, zero_init_residual=zero_init_residual)
    if bn_momentum is not None:
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = bn_momentum
    return model


def load_init_weights(model, path):
    """Loads `path` into `model`; the classifier too when its shape fits.

    Raises `ValueError` (naming the file and the first layer) for a file of
    another architecture.
    """
    try:
        applications.load_weights(model, path)
    except ValueError as e:
        if "`predictions`" not in str(e):
            raise
        applications.load_weights_except_classifier(model, path)
