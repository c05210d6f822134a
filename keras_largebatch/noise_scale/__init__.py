"""The gradient noise scale, measured during `fit`: how far the batch can grow.

Where each part lives:

- `estimator.py`: the statistics (`Statistics`), the estimator of B_simple
  (McCandlish et al., 2018, arXiv:1812.06162) and its moving averages;
- `sources.py`: where the gradients come from (a strategy's replicas, or
  gradient accumulation on the innermost optimizer of a chain);
- `optimizer.py`: `NoiseScaleOptimizer`, which measures as it applies the
  gradients and saves the statistics (and the adaptive batch's state) with
  the optimizer;
- `callback.py`: `GradientNoiseScale`, which logs them each epoch.
"""

from keras_largebatch.noise_scale.callback import MONITOR_INTERVAL
from keras_largebatch.noise_scale.callback import GradientNoiseScale
from keras_largebatch.noise_scale.estimator import DEFAULT_BETA
from keras_largebatch.noise_scale.estimator import LOG_NAMES
from keras_largebatch.noise_scale.estimator import STATISTIC_VARIABLES
from keras_largebatch.noise_scale.estimator import Statistics
from keras_largebatch.noise_scale.optimizer import DEFAULT_INTERVAL
from keras_largebatch.noise_scale.optimizer import NoiseScaleOptimizer
from keras_largebatch.noise_scale.optimizer import find_noise_scale_optimizer
from keras_largebatch.noise_scale.optimizer import wrap_optimizer
from keras_largebatch.noise_scale.sources import accumulating_optimizer
from keras_largebatch.noise_scale.sources import check_measurable
