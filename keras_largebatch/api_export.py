"""Public-name export that also registers the object as Keras-serializable."""

import keras

PACKAGE = "keras_largebatch"


def keras_largebatch_export(path):
    """Marks a class or function public under `path` and registers it.

    Registration uses this package's name, so configs saved with
    `model.save()` name `keras_largebatch>ClassName` and load back without
    `custom_objects`.
    """

    def decorator(symbol):
        symbol._keras_largebatch_public_name = path
        return keras.saving.register_keras_serializable(package=PACKAGE)(
            symbol
        )

    return decorator
