"""Public-name export that also registers the object as Keras-serializable.

As keras-hub's `keras_hub_export`: the decorator records the public path of a
class or function, and registers the Keras objects among them under this
package's name, so configs saved with `model.save()` name
`keras_largebatch>ClassName` and load back after `import keras_largebatch`,
without `custom_objects`. A package's `__all__` is `public_names(__name__)`.
"""

import types

import keras

PACKAGE = "keras_largebatch"

# Public path ("keras_largebatch.LARS") -> the exported object.
EXPORTS = {}

# What `keras.saving` serializes by registered name; other exports (the
# tf.distribute strategy) are public names only.
_KERAS_OBJECTS = (
    keras.layers.Layer,
    keras.optimizers.Optimizer,
    keras.optimizers.schedules.LearningRateSchedule,
    keras.callbacks.Callback,
    keras.losses.Loss,
    keras.metrics.Metric,
    keras.initializers.Initializer,
    keras.regularizers.Regularizer,
    keras.constraints.Constraint,
)


def is_keras_serializable(symbol):
    """True for functions and Keras objects that have `get_config`."""
    if isinstance(symbol, types.FunctionType):
        return True
    return (isinstance(symbol, type) and issubclass(symbol, _KERAS_OBJECTS)
            and hasattr(symbol, "get_config"))


class keras_largebatch_export:
    """Makes a class or function public under `path`, e.g. `"keras_largebatch.LARS"`.

    Records it in `EXPORTS` and, when it is a function or a Keras object
    with `get_config`, registers it as `keras_largebatch>Name`.
    """

    def __init__(self, path):
        if not isinstance(path, str) or not path.startswith(PACKAGE + "."):
            raise ValueError(
                f"`path` must be a dotted name under `{PACKAGE}`. "
                f"Received: path={path!r}")
        self.path = path

    def __call__(self, symbol):
        name = self.path.rsplit(".", 1)[1]
        if name != symbol.__name__:
            raise ValueError(
                f"`path` must end with the exported name {symbol.__name__!r}. "
                f"Received: path={self.path!r}")
        EXPORTS[self.path] = symbol
        if is_keras_serializable(symbol):
            keras.saving.register_keras_serializable(package=PACKAGE)(symbol)
        return symbol


def public_names(module_name):
    """The names exported directly under `module_name`, sorted (its `__all__`)."""
    prefix = module_name + "."
    return sorted(path[len(prefix):] for path in EXPORTS
                  if path.startswith(prefix) and "." not in path[len(prefix):])
