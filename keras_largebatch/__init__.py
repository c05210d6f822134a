"""keras-largebatch: large-batch training for Keras 3.

LARS, LAMB and their mixed-precision variants LARSMixed and LAMBMixed (the
rule in float32 on unscaled gradients, dynamic loss scaling, float32 master
weights), weight-decay filtering for biases and batch-norm parameters,
warmup + polynomial-decay schedules, precise batch-norm statistics, the
gradient noise scale measured during `fit`. The
`keras_largebatch.applications` package holds AlexNet-BN, ResNet-50 and a
CIFAR ResNet; `keras_largebatch.distribute` (TensorFlow) the fused,
hierarchical all-reduce.
"""

import importlib.util as _util
import os as _os
import sys as _sys

from keras_largebatch import _backend  # imports nothing of Keras

__version__ = "0.1.0"

# The command `keras-largebatch-train` (or `python -m
# keras_largebatch.train.cli`): Ctrl-C or SIGTERM while Keras is imported
# ends it with one line (train/cli.py), not an import's traceback; its
# `--help` is answered from the flags' declarations, with no Keras imported.
_HELP = False
if any(_os.path.basename(arg) in ("keras-largebatch-train",
                                  "keras_largebatch.train.cli")
       for arg in getattr(_sys, "orig_argv", [])[1:4]):
    # Not `train.cli`: `python -m` runs that module after this import.
    from keras_largebatch import train as _train

    _train.stop_while_starting()
    _HELP = _train.asks_for_help(_sys.argv)

_MISSING = _backend.missing()
if _MISSING:
    # Importing Keras would fail on its backend: import none of it, so that
    # `keras-largebatch-train` (train/cli.py) says so in one line; any name
    # of the package raises that line.
    def __getattr__(name):
        raise ImportError(_MISSING)
elif not _HELP:
    from keras_largebatch import api_export as _api_export
    from keras_largebatch.adaptive_batch import AdaptiveBatch
    from keras_largebatch.decay import exclude_bias_and_norm
    from keras_largebatch.decay import no_decay_variables
    from keras_largebatch import layers
    from keras_largebatch.noise_scale import GradientNoiseScale
    from keras_largebatch.noise_scale import NoiseScaleOptimizer
    from keras_largebatch.optimizers import LAMB
    from keras_largebatch.optimizers import LAMBMixed
    from keras_largebatch.optimizers import LARS
    from keras_largebatch.optimizers import LARSMixed
    from keras_largebatch.precise_bn import PreciseBatchNorm
    from keras_largebatch.precise_bn import recompute_batch_norm_statistics
    from keras_largebatch.schedules import WarmupPolynomialDecay
    from keras_largebatch.schedules import mlperf_lars_rate
    from keras_largebatch.schedules import scale_learning_rate

    __all__ = _api_export.public_names(__name__)


def _map_applications():
    """`keras_largebatch.applications` is the top-level `applications/`.

    `pip install .` (or `-e .`) maps it there. Imported from a source
    checkout (the repository on `sys.path`), nothing does: load it from
    beside this package, or say how to install.
    """
    name = __name__ + ".applications"
    if name in _sys.modules or _util.find_spec(name) is not None:
        return
    folder = _os.path.join(_os.path.dirname(_os.path.dirname(__file__)),
                           "applications")
    init = _os.path.join(folder, "__init__.py")
    if not _os.path.isfile(init):
        raise ImportError(
            "keras_largebatch.applications is not installed; run `pip install "
            "-e .` in the repository (it maps applications/ into the package)")
    spec = _util.spec_from_file_location(
        name, init, submodule_search_locations=[folder])
    module = _util.module_from_spec(spec)
    _sys.modules[name] = module
    spec.loader.exec_module(module)


if not (_MISSING or _HELP):
    _map_applications()
    # Registers the applications' layers (`keras_largebatch>PadChannels`),
    # so a model that uses them loads after `import keras_largebatch` alone.
    from keras_largebatch import applications  # noqa: E402,F401
