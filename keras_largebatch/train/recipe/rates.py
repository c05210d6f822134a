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

`plan` makes the run's `Schedule` of these from its `learning_rate` and
`training` config, and stretches it where `--epochs` is raised on resume.
"""

import dataclasses

import keras_largebatch

DEFAULT_BASE_LR = {"sgd": 0.1, "lars": 2.0, "lars_mixed": 2.0,
                   "lamb": 0.002, "lamb_mixed": 0.002}
SGD_WARMUP_FRACTION = 5 / 90  # Goyal et al.: 5 of 90 epochs.


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The learning rate of the run (`plan`).

    Attributes:
        peak: the peak rate, `--lr_scaling`'s rule applied.
        warmup_epochs: `--warmup_epochs`, or the rule's fraction of the run.
        learning_rate: the Keras schedule (warmup, polynomial decay).
        raise_message: the line that says how raising `--epochs` on
            resume stretches the schedule; None when it is not raised.
        rule: the rule that gave the peak, `--lr_scaling` resolved
            (`lr_rule`).
    """

    peak: float
    warmup_epochs: float
    learning_rate: object
    raise_message: str = None
    rule: str = None


def plan(learning_rate, training, optimizer, steps_per_epoch,
         resuming=None):
    """The `Schedule` of `learning_rate` (`RunConfig.learning_rate`) for
    the batch and epochs of `training` and the `optimizer` (its name,
    which picks the default rule); resuming (a `checkpointing.resume.Resume`)
    with `--epochs` raised, the one of a run planned for the new number of
    epochs."""
    lr, batch = learning_rate, training.global_batch_size
    peak = peak_learning_rate(optimizer, lr.base_learning_rate, batch,
                              lr.base_batch_size, lr.lr_scaling)
    raised = resuming is not None and resuming.raised
    # A default warmup is a fraction of the run: of the original one when
    # --epochs is raised on resume, so the steps already taken keep theirs.
    warmup = warmup_epochs_for(
        optimizer, lr.lr_scaling, batch,
        resuming.epochs_before if raised else training.epochs,
        lr.warmup_epochs)

    def planned(epochs):
        # Keras calls a schedule with its step counter, which counts
        # batches, not updates, under gradient accumulation.
        return schedule(peak, steps_per_epoch, epochs, warmup,
                        lr.end_learning_rate, lr.poly_power)

    rate = planned(training.epochs)
    message = None
    if raised:
        message = raise_message(resuming, planned(resuming.epochs_before),
                                rate, steps_per_epoch)
    return Schedule(peak, warmup, rate, message,
                    lr_rule(optimizer, lr.lr_scaling))


def raise_message(resume, old_schedule, new_schedule, steps_per_epoch):
    """One line: how raising `--epochs` (`resume`, a
    `checkpointing.resume.Resume`) extends the schedule."""
    step = resume.finished_epochs * steps_per_epoch
    before = float(old_schedule(step))
    after = float(new_schedule(step))
    return (
        f"--epochs raised from {resume.epochs_before} to {resume.epochs}: "
        f"warmup kept, polynomial decay stretched to end at epoch "
        f"{resume.epochs} (step {resume.epochs * steps_per_epoch} instead "
        f"of {resume.epochs_before * steps_per_epoch}); at the restored "
        f"step {step} (epoch {resume.finished_epochs}) the learning rate "
        f"goes from {before:.4g} to {after:.4g}")


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
    would not use (a rule of the flag table, `config.rules.RULES`)."""
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
