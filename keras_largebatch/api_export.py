"""Public-name export that also registers the object as Keras-serializable."""

import keras

PACKAGE = "keras_largebatch"


def keras_largebatch_export(path):
    """Registers a class or function public under `path` as serializable.

    `path` documents where users import it from. Registration uses this package's name, so configs saved with
    `model.save()` name `keras_largebatch>ClassName` and load back without
    `custom_objects`.
    """

    del path
    return keras.saving.register_keras_serializable(package=PACKAGE)
