"""The optimizer by name (`build_optimizer`: SGD, LARS, LARSMixed, LAMB,
LAMBMixed; bias and batch-norm parameters never decayed) and the compiled
model (`compile_model`)."""

import keras

import keras_largebatch
from keras_largebatch._shared import require
from keras_largebatch.train.recipe.rates import DEFAULT_BASE_LR


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
