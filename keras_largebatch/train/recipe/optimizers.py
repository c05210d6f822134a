"""The optimizer by name (`build_optimizer`: SGD, LARS, LARSMixed, LAMB,
LAMBMixed; bias and batch-norm parameters never decayed) and the compiled
model (`compile_model`); `compile_run`, the run's model compiled from its
`optimization` config."""

import keras

import keras_largebatch
from keras_largebatch._shared import require
from keras_largebatch.train.recipe.rates import DEFAULT_BASE_LR


def compile_run(model, optimization, schedule, gradient_accumulation_steps,
                top5=False, noise_scale=False, strategy=None):
    """Compiles `model` with the optimizer and loss of `optimization`
    (`RunConfig.optimization`) on `schedule` (`rates.Schedule`), averaging
    `gradient_accumulation_steps` batches per update, and builds the
    optimizer's state (what `fit` would build: the first checkpoint's
    size). With `noise_scale` (`--gradient_noise_scale`), refuses an
    optimizer and `strategy` that take one batch size per step. Call it in
    the strategy's scope."""
    optimizer = build_optimizer(
        optimization.optimizer, schedule.learning_rate, model,
        optimization.momentum, optimization.eta, optimization.weight_decay,
        gradient_accumulation_steps, nesterov=optimization.nesterov)
    compile_model(model, optimizer, optimization.label_smoothing, top5=top5)
    # What compile made of it: under mixed_float16, Keras may wrap it in a
    # LossScaleOptimizer, whose state the checkpoints hold too.
    compiled = model.optimizer
    if not compiled.built:
        compiled.build(model.trainable_variables)
    if noise_scale:
        _check_noise_scale(compiled, strategy, gradient_accumulation_steps)
    return model


def _check_noise_scale(optimizer, strategy, gradient_accumulation_steps):
    from keras_largebatch import noise_scale

    try:
        noise_scale.check_measurable(optimizer, strategy)
    except ValueError:
        raise ValueError(
            "`gradient_noise_scale` needs two batch sizes in one "
            "step: --gradient_accumulation_steps >= 2 or several "
            "replicas (--distribution=multi_worker). Received: "
            "gradient_noise_scale=True, gradient_accumulation_steps="
            f"{gradient_accumulation_steps}") from None


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
