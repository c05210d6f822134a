"""keras-largebatch: large-batch training for Keras 3.

LARS, LAMB and their mixed-precision variants LARSMixed and LAMBMixed (the
rule in float32 on unscaled gradients, dynamic loss scaling, float32 master
weights), weight-decay filtering for biases and batch-norm parameters,
warmup + polynomial-decay schedules. The `keras_largebatch.applications`
package holds AlexNet-BN and ResNet-50; `keras_largebatch.distribute`
(TensorFlow) the fused, hierarchical all-reduce.
"""

from keras_largebatch.decay import exclude_bias_and_norm
from keras_largebatch.decay import no_decay_variables
from keras_largebatch.optimizers import LAMB
from keras_largebatch.optimizers import LAMBMixed
from keras_largebatch.optimizers import LARS
from keras_largebatch.optimizers import LARSMixed
from keras_largebatch.schedules import WarmupPolynomialDecay
from keras_largebatch.schedules import mlperf_lars_rate
from keras_largebatch.schedules import scale_learning_rate

__version__ = "0.1.0"

__all__ = [
    "LAMB",
    "LAMBMixed",
    "LARS",
    "LARSMixed",
    "WarmupPolynomialDecay",
    "exclude_bias_and_norm",
    "mlperf_lars_rate",
    "no_decay_variables",
    "scale_learning_rate",
]
