"""The large-batch recipe: model, precision, learning rate, optimizer.

The learning rate is tuned at `base_batch_size` and scaled to the global
batch (`linear`: Goyal et al., arXiv:1706.02677; `sqrt`: Krizhevsky,
arXiv:1404.5997), then follows `WarmupPolynomialDecay`: linear warmup for
`warmup_epochs`, then `(1 - t) ** power` decay to `end_learning_rate`
(You et al., arXiv:1708.03888). Biases and batch-norm parameters are never
decayed and, under LARS, not adapted (Jia et al., arXiv:1807.11205).
"""

import keras

import keras_largebatch
from keras_largebatch import applications

DEFAULT_IMAGE_SIZE = {"alexnet_bn": 67, "resnet50": 32, "resnet50_v1_5": 32}
MIN_IMAGE_SIZE = {
    "alexnet_bn": applications.alexnet_bn.MIN_SIZE,
    "resnet50": applications.resnet.MIN_SIZE,
    "resnet50_v1_5": applications.resnet.MIN_SIZE,
}
DEFAULT_BASE_LR = {"sgd": 0.1, "lars": 2.0, "lars_mixed": 2.0}


def resolve_precision(precision):
    """`auto` is mixed_float16 on a GPU and float32 elsewhere."""
    if precision != "auto":
        return precision
    return "mixed_float16" if _has_gpu() else "float32"


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


def build_model(model_name, image_size, num_classes, bn_momentum=None):
    """Builds an untrained model under the current dtype policy."""
    shape = (image_size, image_size, 3)
    if model_name == "alexnet_bn":
        model = applications.AlexNetBN(
            weights=None, input_shape=shape, classes=num_classes)
    elif model_name in ("resnet50", "resnet50_v1_5"):
        variant = "v1" if model_name == "resnet50" else "v1.5"
        model = applications.ResNet50(
            weights=None, input_shape=shape, classes=num_classes,
            variant=variant)
    else:
        raise ValueError(
            "`model` must be one of alexnet_bn, resnet50, resnet50_v1_5. "
            f"Received: model={model_name!r}"
        )
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


def peak_learning_rate(optimizer, base_learning_rate, global_batch_size,
                       base_batch_size=256, scaling="linear"):
    base = base_learning_rate or DEFAULT_BASE_LR[optimizer]
    if scaling == "none":
        return base
    return keras_largebatch.scale_learning_rate(
        base, global_batch_size, base_batch_size, rule=scaling)


def schedule(peak, steps_per_epoch, epochs, warmup_epochs,
             end_learning_rate=1e-4, power=2.0):
    total = max(1, int(steps_per_epoch * epochs))
    warmup = min(int(round(steps_per_epoch * warmup_epochs)), total - 1)
    return keras_largebatch.WarmupPolynomialDecay(
        peak, warmup_steps=max(0, warmup), decay_steps=max(1, total - warmup),
        end_learning_rate=min(end_learning_rate, peak), power=power)


def build_optimizer(name, learning_rate, model, momentum=0.9, eta=0.001,
                    weight_decay=0.0):
    """SGD (decay filtered), LARS or LARSMixed; bias/BN never decayed."""
    if name == "sgd":
        opt = keras.optimizers.SGD(
            learning_rate, momentum=momentum, weight_decay=weight_decay or None)
        if weight_decay:
            keras_largebatch.exclude_bias_and_norm(opt, model)
        return opt
    cls = {"lars": keras_largebatch.LARS,
           "lars_mixed": keras_largebatch.LARSMixed}.get(name)
    if cls is None:
        raise ValueError(
            "`optimizer` must be one of lars_mixed, lars, sgd. "
            f"Received: optimizer={name!r}"
        )
    return cls(learning_rate, momentum=momentum, eta=eta,
               weight_decay=weight_decay)


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
