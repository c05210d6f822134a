"""Learning-rate schedules for large-batch training."""

import math

import keras
from keras import ops

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import require
from keras_largebatch.api_export import keras_largebatch_export


@keras_largebatch_export("keras_largebatch.WarmupPolynomialDecay")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then polynomial decay (You et al.; MLPerf LARS).

    ```python
    if step < warmup_steps:
        lr = initial_lr + (peak_lr - initial_lr) * step / warmup_steps
    else:
        t = min(step - warmup_steps, decay_steps) / decay_steps
        lr = end_lr + (peak_lr - end_lr) * (1 - t) ** power
    ```

    Args:
        peak_learning_rate: Float > 0, the rate reached at the end of warmup.
        warmup_steps: Int >= 0.
        decay_steps: Int >= 1, steps of decay after warmup (the rate stays at
            `end_learning_rate` after them).
        end_learning_rate: Float >= 0. Defaults to `0.0001`.
        power: Float > 0. Defaults to `2.0`.
        initial_learning_rate: Float >= 0, the rate at step 0. Defaults to
            `0.0`.
        name: Defaults to `"warmup_polynomial_decay"`.
    """

    def __init__(
        self,
        peak_learning_rate,
        warmup_steps,
        decay_steps,
        end_learning_rate=0.0001,
        power=2.0,
        initial_learning_rate=0.0,
        name="warmup_polynomial_decay",
    ):
        require(peak_learning_rate > 0, "peak_learning_rate", peak_learning_rate, "> 0")
        check_int("warmup_steps", warmup_steps, 0)
        check_int("decay_steps", decay_steps, 1)
        require(end_learning_rate >= 0, "end_learning_rate", end_learning_rate, ">= 0")
        require(power > 0, "power", power, "> 0")
        require(
            initial_learning_rate >= 0,
            "initial_learning_rate", initial_learning_rate, ">= 0",
        )
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = warmup_steps
        self.decay_steps = decay_steps
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.initial_learning_rate = float(initial_learning_rate)
        self.name = name

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak = self.peak_learning_rate
        warmup = float(max(self.warmup_steps, 1))
        warm = self.initial_learning_rate + (
            peak - self.initial_learning_rate
        ) * ops.minimum(step / warmup, 1.0)
        t = ops.clip(
            (step - self.warmup_steps) / float(self.decay_steps), 0.0, 1.0
        )
        decayed = self.end_learning_rate + (
            peak - self.end_learning_rate
        ) * ops.power(1.0 - t, self.power)
        return ops.where(step < self.warmup_steps, warm, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "initial_learning_rate": self.initial_learning_rate,
            "name": self.name,
        }


@keras_largebatch_export("keras_largebatch.schedules.ScaledLearningRate")
class ScaledLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """`factor * base(step)`: a schedule (or a callable of no argument,
    as Keras' optimizers take) times a constant. `AdaptiveBatch` puts it
    on the optimizer when its rate rule scales a schedule.

    Args:
        base: A `LearningRateSchedule` or a callable.
        factor: Float > 0.
    """

    def __init__(self, base, factor):
        check_number("factor", factor, lambda x: x > 0, "> 0")
        self.base = base
        self.factor = float(factor)

    def __call__(self, step):
        if isinstance(self.base, keras.optimizers.schedules.LearningRateSchedule):
            return self.base(step) * self.factor
        return self.base() * self.factor

    def get_config(self):
        return {"base": keras.saving.serialize_keras_object(self.base),
                "factor": self.factor}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["base"] = keras.saving.deserialize_keras_object(config["base"])
        return cls(**config)


@keras_largebatch_export("keras_largebatch.scale_learning_rate")
def scale_learning_rate(base_learning_rate, batch_size, base_batch_size=256, rule="linear"):
    """Scales a learning rate tuned at `base_batch_size` to `batch_size`.

    `rule="linear"`: `lr = base_lr * batch_size / base_batch_size` (Goyal et
    al., 2017, arXiv:1706.02677). `rule="sqrt"`:
    `lr = base_lr * sqrt(batch_size / base_batch_size)` (Krizhevsky, 2014,
    arXiv:1404.5997; Hoffer et al., 2017).
    """
    require(base_learning_rate > 0, "base_learning_rate", base_learning_rate, "> 0")
    check_int("batch_size", batch_size, 1)
    check_int("base_batch_size", base_batch_size, 1)
    require(rule in ("linear", "sqrt"), "rule", rule, "'linear' or 'sqrt'")
    ratio = batch_size / base_batch_size
    if rule == "linear":
        return base_learning_rate * ratio
    return base_learning_rate * math.sqrt(ratio)


# MLPerf's reference LARS for ResNet-50 (mlcommons/training,
# image_classification/tensorflow2/lars_util.py): the peak rate and warmup
# epochs as a function of the global batch, with the ImageNet epochs of the
# runs they were tuned for (the 4,096 reference run trained 42 epochs; the
# 64K record runs about 90).
MLPERF_LARS_TABLE = (
    # (global batch below, peak rate, warmup epochs, of epochs)
    (16_384, 10.0, 5, 42),
    (32_768, 25.0, 5, 42),
    (None, 31.2, 25, 90),
)
MLPERF_SMALLEST_BATCH = 4096
# Goyal et al. (arXiv:1706.02677): 0.1 per 256 images, 5 warmup epochs of 90.
GOYAL_SGD = (0.1, 256, 5, 90)


@keras_largebatch_export("keras_largebatch.mlperf_lars_rate")
def mlperf_lars_rate(global_batch_size):
    """MLPerf's LARS peak rate and warmup for a global batch.

    Returns `(peak_learning_rate, warmup_fraction)`: the peak is 10 below a
    global batch of 16,384, 25 below 32,768 and 31.2 from there on; the
    warmup is 5 of 42 epochs below 32,768 and 25 of 90 from there on. The
    peak does not grow linearly with the batch: LARS' trust ratio already
    makes each layer's step relative to its weight norm. On a data set other
    than ImageNet the warmup is kept as the same fraction of the run.

    Below 4,096, the smallest global batch MLPerf's reference ran, the table
    is extrapolated with the square-root rule, `10 * sqrt(batch / 4096)`
    (0.88 at 32, 2.5 at 256): the table's 10 at a batch of 32 diverges.
    """
    check_int("global_batch_size", global_batch_size, 1)
    for below, peak, warmup, epochs in MLPERF_LARS_TABLE:
        if below is None or global_batch_size < below:
            scale = min(1.0, global_batch_size / MLPERF_SMALLEST_BATCH)
            return peak * math.sqrt(scale), warmup / epochs
