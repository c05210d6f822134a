"""The large-batch recipe: model, precision, learning rate, optimizer.

The peak learning rate comes from one of these rules (`--lr_scaling`):

- `mlperf` (the default for LARS and LARSMixed): MLPerf's reference LARS
  table, a function of the global batch alone (`mlperf_lars_rate`: 10 below
  16K, 25 below 32K, 31.2 above; below 4,096, the smallest batch it ran,
  `10 * sqrt(batch / 4096)`), with its warmup kept as the same fraction
  of the run (5 of 42 ImageNet epochs below 32K, 25 of 90 above), so an
  8-epoch run on a small data set warms up for 8 * 5 / 42 = 0.95 epochs.
- `linear` (the default for SGD): Goyal et al. (arXiv:1706.02677), a base
  rate tuned at `base_batch_size` (0.1 per 256 for SGD) times
  `global_batch / base_batch_size`, with 5 of 90 epochs of warmup.
- `sqrt` (Krizhevsky, arXiv:1404.5997; the default for LAMB, 0.002 per
  256, as You et al. 2019 scale it) and `none` (the base rate is the
  peak) for sweeps.

Then `WarmupPolynomialDecay`: linear warmup, then `(1 - t) ** power` decay
to `end_learning_rate` (You et al., arXiv:1708.03888). Biases and
batch-norm parameters are never decayed and, under LARS, not adapted (Jia
et al., arXiv:1807.11205).
"""

import keras

import keras_largebatch
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
DEFAULT_BASE_LR = {"sgd": 0.1, "lars": 2.0, "lars_mixed": 2.0,
                   "lamb": 0.002, "lamb_mixed": 0.002}
SGD_WARMUP_FRACTION = 5 / 90  # Goyal et al.: 5 of 90 epochs.


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


def resolve_precision(precision):
    """`auto` is mixed_float16 on a GPU and float32 elsewhere."""
    if precision != "auto":
        return precision
    return "mixed_float16" if _has_gpu() else "float32"


def make_deterministic():
    """Deterministic kernels (what `--deterministic` changes)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    elif backend == "torch":
        import torch

        torch.use_deterministic_algorithms(True)


def _has_gpu():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def build_model(model_name, image_size, num_classes, bn_momentum=None,
                channels=3, depth=20, width=16):
    """Builds an untrained model under the current dtype policy."""
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
            variant=variant)
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


def lr_rule(optimizer, scaling="auto"):
    """`--lr_scaling` resolved: `auto` is mlperf for LARS, linear for SGD,
    sqrt for LAMB (You et al. 2019 scale LAMB's rate with the square root
    of the batch)."""
    if scaling != "auto":
        return scaling
    return {"sgd": "linear", "lamb": "sqrt", "lamb_mixed": "sqrt"}.get(
        optimizer, "mlperf")


def check_lr_rule(optimizer, base_learning_rate, scaling="auto"):
    """Refuses `mlperf` for other optimizers than LARS, and a base rate it
    would not use (a rule of the flag table, `flags.RULES`)."""
    if lr_rule(optimizer, scaling) != "mlperf":
        return
    if optimizer not in ("lars", "lars_mixed"):
        raise ValueError(
            "`lr_scaling=mlperf` is MLPerf's LARS table; other optimizers "
            "use linear (Goyal et al.), sqrt or none. Received: "
            f"lr_scaling=mlperf, optimizer={optimizer}")
    if base_learning_rate:
        raise ValueError(
            "`base_learning_rate` is not used by lr_scaling=mlperf (the "
            "table gives the peak rate); to set the peak yourself use "
            "--lr_scaling=none. Received: "
            f"base_learning_rate={base_learning_rate}")


def peak_learning_rate(optimizer, base_learning_rate, global_batch_size,
                       base_batch_size=256, scaling="auto"):
    """The peak rate of the schedule under `lr_rule(optimizer, scaling)`."""
    check_lr_rule(optimizer, base_learning_rate, scaling)
    rule = lr_rule(optimizer, scaling)
    if rule == "mlperf":
        return keras_largebatch.mlperf_lars_rate(global_batch_size)[0]
    base = base_learning_rate or DEFAULT_BASE_LR[optimizer]
    if rule == "none":
        return base
    return keras_largebatch.scale_learning_rate(
        base, global_batch_size, base_batch_size, rule=rule)


def warmup_epochs_for(optimizer, scaling, global_batch_size, epochs,
                      warmup_epochs=None):
    """`--warmup_epochs`, or the rule's warmup as a fraction of `epochs`."""
    if warmup_epochs is not None:
        return warmup_epochs
    if lr_rule(optimizer, scaling) == "mlperf":
        fraction = keras_largebatch.mlperf_lars_rate(global_batch_size)[1]
    else:
        fraction = SGD_WARMUP_FRACTION
    return epochs * fraction


def schedule(peak, steps_per_epoch, epochs, warmup_epochs,
             end_learning_rate=1e-4, power=2.0):
    total = max(1, int(steps_per_epoch * epochs))
    warmup = min(int(round(steps_per_epoch * warmup_epochs)), total - 1)
    return keras_largebatch.WarmupPolynomialDecay(
        peak, warmup_steps=max(0, warmup), decay_steps=max(1, total - warmup),
        end_learning_rate=min(end_learning_rate, peak), power=power)


def build_optimizer(name, learning_rate, model, momentum=0.9, eta=0.001,
                    weight_decay=0.0, gradient_accumulation_steps=1,
                    nesterov=False):
    """SGD (decay filtered), LARS, LARSMixed, LAMB or LAMBMixed; bias/BN
    never decayed (nor adapted by the layer-wise ones). `nesterov`: SGD's
    and LARS's Nesterov momentum (LAMB has none).

    With `gradient_accumulation_steps > 1` the optimizer averages that many
    batches' gradients before each update, as Keras' optimizers do.
    """
    require(name in DEFAULT_BASE_LR, "optimizer", name,
            "one of lars_mixed, lars, lamb_mixed, lamb, sgd")
    kwargs = {}
    if gradient_accumulation_steps > 1:
        kwargs["gradient_accumulation_steps"] = gradient_accumulation_steps
    if name == "sgd":
        opt = keras.optimizers.SGD(
            learning_rate, momentum=momentum, nesterov=nesterov,
            weight_decay=weight_decay or None, **kwargs)
        if weight_decay:
            keras_largebatch.exclude_bias_and_norm(opt, model)
        return opt
    if name in ("lamb", "lamb_mixed"):
        cls = keras_largebatch.LAMB if name == "lamb" else (
            keras_largebatch.LAMBMixed)
        return cls(learning_rate, weight_decay=weight_decay, **kwargs)
    cls = {"lars": keras_largebatch.LARS,
           "lars_mixed": keras_largebatch.LARSMixed}[name]
    return cls(learning_rate, momentum=momentum, eta=eta,
               weight_decay=weight_decay, nesterov=nesterov, **kwargs)


def compile_model(model, optimizer, label_smoothing=0.0, top5=False):
    """Cross-entropy, accuracy and, with `top5`, top-5 accuracy."""
    metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
    if top5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(
            k=5, name="top5_accuracy"))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(
            label_smoothing=label_smoothing),
        metrics=metrics,
    )
    return model
