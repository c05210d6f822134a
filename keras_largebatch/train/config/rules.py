"""The checks of the flags' values: each value against its flag of
`table.TABLE` (`check`), then `RULES`, the checks that read several
flags together (or a flag and the file system), among them the adaptive
batch's settings as `AdaptiveBatch` checks them; and the fields of a
recorded run's run_config.json against their flags' types
(`check_recorded`).

Each raises the Keras-style `ValueError` naming a flag and echoing its
value as the command line wrote it. The rules that read the recipe import
it when they run (a run is configured), so that importing `config/`
imports no Keras. The values are those `RunConfig`
holds: `--batch_schedule` already parsed (`load.config`).
"""

import dataclasses
import math
import os

from keras_largebatch._shared import check_int
from keras_largebatch._shared import check_number
from keras_largebatch._shared import is_number
from keras_largebatch._shared import require
from keras_largebatch.adaptive_batch import batches as adaptive_batches
from keras_largebatch.adaptive_batch import defaults as adaptive_defaults
from keras_largebatch.adaptive_batch import policies as adaptive_policies
from keras_largebatch.train.config.table import BY_NAME
from keras_largebatch.train.data import registry


@dataclasses.dataclass(frozen=True)
class Rule:
    """A check that reads several flags (or a flag and the file system).

    Attributes:
        reads: the flags it reads.
        check: `values -> None`; raises the Keras-style `ValueError`.
        after_resume: checked once the flags have been compared with the
            run in `model_dir` (`check_after_resume`), so that resuming
            with a changed flag names the change first.
    """

    reads: tuple
    check: object
    after_resume: bool = False


def _requires(name, reads, holds, expected, **kwargs):
    """A rule on `name`: `holds(values)`, else `must be <expected>`
    (`expected` a string or `values -> str`)."""
    def check(values):
        shown = expected(values) if callable(expected) else expected
        require(holds(values), name, values[name], shown)

    return Rule((name, *reads), check, **kwargs)


def _image_size_fits_the_model(values):
    from keras_largebatch.train.recipe import models

    size = models.image_size_for(values["model"],
                                 registry.native_size(values["dataset"]),
                                 values["image_size"])
    minimum = models.MIN_IMAGE_SIZE[values["model"]]
    require(size >= minimum, "image_size", size,
            f"at least {minimum} for {values['model']}")


def _lr_rule_fits_the_optimizer(values):
    from keras_largebatch.train.recipe import rates

    rates.check_lr_rule(values["optimizer"], values["base_learning_rate"],
                        values["lr_scaling"])


def _init_weights_is_a_file(values):
    path = values["init_weights"]
    if path and not os.path.isfile(path):
        raise ValueError(
            f"`init_weights` is not a file. Received: init_weights={path!r}")


def _model_dir_is_given(values):
    if not values["model_dir"]:
        raise ValueError("`model_dir` is required. Received: "
                         f"model_dir={values['model_dir']!r}")


def _micro_batch(values):
    return values["global_batch_size"] // values["gradient_accumulation_steps"]


# `AdaptiveBatch`'s arguments as the command's flags name them.
ADAPTIVE_FLAG_NAMES = {
    "max_batch_size": "max_global_batch_size", "policy": "adaptive_batch",
    "c": "noise_scale_multiple", "schedule": "batch_schedule",
    "learning_rate_rule": "adaptive_learning_rate",
    "start_multiple": "adaptive_start_multiple",
    "anneal_fraction": "adaptive_anneal_fraction",
    "anneal_multiple": "adaptive_anneal_multiple",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
}


def _adaptive_batch_fits(values):
    """`--adaptive_batch`'s flags together: here what the command alone
    knows (the schedule's epochs below `--epochs`, the flags a policy
    does not read left at their defaults), then `AdaptiveBatch`'s
    own checks (`adaptive_batch.batches`), naming the flags."""
    name = values["adaptive_batch"]
    policy = adaptive_policies.POLICIES.get(name)
    steps = values["batch_schedule"]
    if not (policy and policy.takes_multiple):
        multiple = values["noise_scale_multiple"]
        require(multiple == adaptive_defaults.NOISE_SCALE_MULTIPLE,
                "noise_scale_multiple", multiple,
                f"{adaptive_defaults.NOISE_SCALE_MULTIPLE:g} without "
                f"--adaptive_batch={_policies_where('takes_multiple')}")
    if policy is None:
        _unused_without_adaptive_batch(values, steps)
        return
    if steps:
        require(steps[-1][0] < values["epochs"], "batch_schedule",
                _shown(values, "batch_schedule"),
                f"epochs below `epochs` ({values['epochs']})")
    flag_of = ADAPTIVE_FLAG_NAMES
    names = adaptive_batches.Names(
        flag_of,
        {argument: f"--{flag}" for argument, flag in flag_of.items()}
        | {"batch_size": "--global_batch_size / "
                         "--gradient_accumulation_steps"},
        {argument: _shown(values, flag)
         for argument, flag in flag_of.items()})
    settings = adaptive_batches.resolve(adaptive_batches.Settings(
        _micro_batch(values), values["max_global_batch_size"] or None, name,
        values["noise_scale_multiple"], steps or None,
        values["adaptive_learning_rate"],
        values["adaptive_start_multiple"] or None,
        values["adaptive_anneal_fraction"],
        values["adaptive_anneal_multiple"]), names)
    adaptive_batches.check_compiled(
        settings, values["gradient_accumulation_steps"], names)


def _unused_without_adaptive_batch(values, steps):
    """Without `--adaptive_batch`, its flags keep their defaults
    (`--adaptive_anneal_multiple` a power of 2)."""
    require(not values["max_global_batch_size"], "max_global_batch_size",
            values["max_global_batch_size"], "0 without --adaptive_batch")
    require(not steps, "batch_schedule", _shown(values, "batch_schedule"),
            f"empty without --adaptive_batch="
            f"{_policies_where('takes_schedule')}")
    multiple = values["adaptive_start_multiple"]
    require(multiple in (0, 1), "adaptive_start_multiple", multiple,
            "0 or 1 without --adaptive_batch="
            f"{_policies_where('takes_multiple')}")
    fraction = values["adaptive_anneal_fraction"]
    require(fraction == adaptive_defaults.ANNEAL_FRACTION,
            "adaptive_anneal_fraction", fraction,
            f"{adaptive_defaults.ANNEAL_FRACTION:g} without "
            f"--adaptive_batch={_policies_where('takes_multiple')}")
    multiple = values["adaptive_anneal_multiple"]
    require(adaptive_batches.is_power_of_2(multiple),
            "adaptive_anneal_multiple", multiple, "a power of 2")


def _shown(values, name):
    """The value of flag `name` as the command line writes it."""
    return BY_NAME[name].show(values[name])


def _policies_where(attribute):
    """`noise_scale`: the `--adaptive_batch` choices whose policy has
    `attribute`, joined by `/`."""
    return "/".join(name for name, policy
                    in adaptive_policies.POLICIES.items()
                    if getattr(policy, attribute))

RULES = (
    Rule(("image_size", "model", "dataset"), _image_size_fits_the_model),
    Rule((*ADAPTIVE_FLAG_NAMES.values(), "global_batch_size", "epochs"),
         _adaptive_batch_fits),
    # Each worker would compute statistics of its own batches and assign
    # them to mirrored variables: they would differ between workers.
    _requires("precise_bn_batches", ("distribution",),
              lambda v: not v["precise_bn_batches"]
              or v["distribution"] != "multi_worker",
              "0 with --distribution=multi_worker (each worker would set "
              "different statistics)"),
    _requires("evals_per_epoch", ("precise_bn_batches",),
              lambda v: v["evals_per_epoch"] == 1
              or not v["precise_bn_batches"],
              "1 with --precise_bn_batches (the evaluations within an "
              "epoch would read the moving averages)"),
    _requires("nesterov", ("optimizer", "momentum"),
              lambda v: not v["nesterov"] or (
                  v["optimizer"] in ("sgd", "lars", "lars_mixed")
                  and v["momentum"] > 0),
              "false unless --optimizer is sgd, lars or lars_mixed with "
              "--momentum > 0 (LAMB has no Nesterov step)"),
    _requires("zero_init_residual", ("model",),
              lambda v: not v["zero_init_residual"]
              or v["model"] in ("resnet50", "resnet50_v1_5"),
              "false unless --model is resnet50 or resnet50_v1_5 (the "
              "blocks that take it)"),
    Rule(("init_weights",), _init_weights_is_a_file),
    Rule(("model_dir",), _model_dir_is_given),
    _requires("warmup_epochs", ("epochs",),
              lambda v: v["warmup_epochs"] is None
              or v["warmup_epochs"] < v["epochs"],
              lambda v: f"less than `epochs` ({v['epochs']}): the warmup "
                        "would never end", after_resume=True),
    Rule(("lr_scaling", "optimizer", "base_learning_rate"),
         _lr_rule_fits_the_optimizer, after_resume=True),
)


def check(values):
    """Checks each value of `values` ({name: value}) against its flag,
    then, given every flag, the `RULES` not `after_resume`; raises the
    Keras-style `ValueError` naming the first bad one."""
    for name, value in values.items():
        flag = BY_NAME[name]
        if value is None:
            continue
        if flag.kind == "float":
            require(math.isfinite(value), name, value, "a finite float")
        if flag.minimum is not None:
            check_int(name, value, flag.minimum)
        if flag.valid is not None:
            valid, expected = flag.valid
            if flag.kind == "float":
                check_number(name, value, valid, expected)
            else:
                require(valid(value), name, value, expected)
    if values.keys() >= BY_NAME.keys():
        for rule in RULES:
            if not rule.after_resume:
                rule.check(values)


# What run_config.json holds for a flag of each kind: (holds, expected).
RECORDED_KINDS = {
    "integer": (lambda v: isinstance(v, int) and not isinstance(v, bool),
                "an int"),
    "float": (is_number, "a float"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "string": (lambda v: isinstance(v, str), "a string"),
}


def check_recorded(recorded, path):
    """Checks each field of the run_config.json at `path` (`recorded`, as
    read) that is a flag of today against the flag's type (an enum's: one
    of its choices; null only where the default is None), so that a run is
    neither resumed nor evaluated against a value of another type; raises
    the Keras-style `ValueError` naming the field."""
    for name, value in recorded.items():
        flag = BY_NAME.get(name)
        if flag is None or (value is None and flag.default is None):
            continue
        if flag.kind == "enum":
            holds = isinstance(value, str) and value in flag.values
            expected = f"one of {', '.join(flag.values)}"
        else:
            of_kind, expected = RECORDED_KINDS[flag.kind]
            holds = of_kind(value)
        if flag.default is None:
            expected += " or null"
        if not holds:
            raise ValueError(
                f"`{name}` in {path} must be {expected}, as --{name} is: "
                "the run in `model_dir` cannot be resumed or evaluated "
                "against it. Restore the file or use another --model_dir. "
                f"Received: {name}={value!r}")


def check_after_resume(config):
    """The `RULES` checked once `config` (a `RunConfig`) has been compared
    with the run it resumes, if any."""
    values = config.flat()
    for rule in RULES:
        if rule.after_resume:
            rule.check(values)

