import keras
import pytest


def small_model(model_name, image_size, num_classes, bn_momentum=None,
                channels=3, *args, **kwargs):
    """A 1.5 k-parameter stand-in for `recipe.models.build_model` (fast tests).

    Convolution, batch norm, dropout and a classifier: every kind of state
    the real models have (moving statistics, a dropout seed).
    """
    inputs = keras.Input((image_size, image_size, channels))
    x = keras.layers.Conv2D(8, 3, strides=4, name="conv1")(inputs)
    x = keras.layers.BatchNormalization(momentum=bn_momentum or 0.9,
                                        name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.25, name="dropout")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax",
                                 name="predictions")(x)
    return keras.Model(inputs, outputs, name=model_name)


@pytest.fixture
def small(monkeypatch):
    """keras-largebatch-train builds `small_model` instead of the real one."""
    from keras_largebatch.train.recipe import models

    monkeypatch.setattr(models, "build_model", small_model)
