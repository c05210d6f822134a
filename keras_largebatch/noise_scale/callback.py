"""`GradientNoiseScale`: the callback that logs the noise scale each epoch."""

import keras

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch.api_export import keras_largebatch_export
from keras_largebatch.noise_scale.optimizer import wrap_optimizer
from keras_largebatch.noise_scale.sources import check_measurable

# GradientNoiseScale's own wrappers measure every MONITOR_INTERVAL-th update:
# at most 3% of a step on bench/micro/noise_scale_cost.py's 3.2M-weight MLP on
# every backend (docs/benchmarks.md); the averages see 1/n of the updates.
MONITOR_INTERVAL = 8


@keras_largebatch_export("keras_largebatch.GradientNoiseScale")
class GradientNoiseScale(keras.callbacks.Callback):
    """Logs the gradient noise scale B_simple each epoch, from any `fit`.

    Reads the statistics a `NoiseScaleOptimizer` keeps (see there for the
    sources, replicas or gradient accumulation, and the estimator). If the
    compiled optimizer holds none, `set_model` wraps `model.optimizer` in
    one, which stays: the statistics are then saved with the optimizer and
    go on over later fits.

    At each epoch's end it adds to the logs (history, CSV, TensorBoard; put
    it before those callbacks) `gradient_noise_scale` = ema(trace) /
    ema(grad_sq), `gns_grad_sq_norm` and `gns_trace_cov`.

    Args:
        batch_size: Int >= 1, the global batch of one step of `fit` (one
            micro-batch under accumulation).
        beta: Float in [0, 1), the moving averages' decay, for a wrapper
            this callback creates; `None` (the default) takes the
            compiled `NoiseScaleOptimizer`'s, else `0.99`.
        interval: Int >= 1, measure every `interval`-th update, likewise;
            `None` (the default): the compiled one's, else `8`
            (`MONITOR_INTERVAL`: at most 3% of a step, see
            docs/benchmarks.md; the averages then see 1/8 of the updates,
            so at the same `beta` they span 8 times as many).

    Raises:
        ValueError: in `fit`, without accumulation or replicas, or when
            `beta` or `interval` disagrees with the compiled wrapper's.

    References:
        - McCandlish et al., 2018, "An Empirical Model of Large-Batch
          Training", arXiv:1812.06162 (Appendix A).
    """

    def __init__(self, batch_size, beta=None, interval=None):
        super().__init__()
        check_int("batch_size", batch_size, 1)
        if beta is not None:
            check_number("beta", beta, lambda x: 0 <= x < 1, "in [0, 1)")
            beta = float(beta)
        if interval is not None:
            check_int("interval", interval, 1)
        self.batch_size = batch_size
        self.beta = beta
        self.interval = interval
        self.state = None

    def set_model(self, model):
        super().set_model(model)
        self.state = wrap_optimizer(model, self.beta, self.interval,
                                    default_interval=MONITOR_INTERVAL)
        self.source = check_measurable(
            self.state.inner_optimizer,
            model.distribute_strategy
            if keras.backend.backend() == "tensorflow" else None)

    def result(self):
        """`{name: value}` for the three log names, bias-corrected; NaNs
        before the first measured update."""
        return self.state.result(self.batch_size)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.result())

    def get_config(self):
        return {"batch_size": self.batch_size, "beta": self.beta,
                "interval": self.interval}
