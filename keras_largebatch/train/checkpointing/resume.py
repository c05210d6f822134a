"""Resuming a run in its `model_dir`: what may change, and how.

A run is resumed from `backup/`: the state at the end of its last finished
epoch (an epoch interrupted half-way is replayed from its start, with the
same data and augmentation, see `data.tf_pipeline.batch`), or, with
`--checkpoint_every_steps`, the newer state within the epoch after it
(`within_epoch.py`), whichever is the newest that loads whole
(`restore.choose`, which says what it skipped). Every flag
must match the original run's `run_config.json`, except those the caller
names in `may_differ` (the command's free and raise-only flags,
`config.FREE` and `config.RAISABLE`); of those, `epochs` may be raised to
train on. The warmup is kept and the polynomial decay is stretched to end
at the new last epoch: from the restored step on, the rate follows the
schedule of a run planned for the new number of epochs (so it rises from
where the shorter schedule had brought it). The command says so, with the
rates before and after.

`run_config.json` keeps the original flags; each raise of `--epochs` is
recorded in `epochs_raised.json`, and the latest raise is the number of
epochs a later resume is checked against.

The caller reads the recorded run once (`read_run_config`, `read_raises`,
an older version's record in today's flags through its own
`config.migration.upgrade`: this package knows no flag table) and hands
it in as `Recorded`.
"""

import dataclasses
import json
import os

from keras_largebatch._shared import atomic_write
from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import disk
from keras_largebatch.train.checkpointing import restore


class ResumeError(ValueError):
    """A flag that differs from the run being resumed (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The run recorded in a `model_dir`, read once per invocation."""

    flags: dict             # run_config.json, in today's flags
    raises: list            # the records of epochs_raised.json

    @property
    def epochs(self):
        """The epochs the run was last set to train for: its latest raise,
        else its flags' (None where neither says)."""
        return (self.raises[-1]["epochs"] if self.raises
                else self.flags.get("epochs"))


@dataclasses.dataclass
class Resume:
    """What resuming `model_dir` means for this invocation."""

    original: dict          # run_config.json, in today's flags
    epochs_before: int      # the epochs the run was last set to train for
    epochs: int             # --epochs now
    finished_epochs: int    # epochs in backup/ (0 before the first ends)
    raises: list            # the records of epochs_raised.json
    within_epoch: object = None  # a `within_epoch.Position`, or None
    start: object = None    # the `restore.Start` loaded, or None
    skipped: str = None     # one line: the damaged checkpoints passed over

    @property
    def raised(self):
        return self.epochs > self.epochs_before


def check_model_dir(model_dir, run_config, recorded, may_differ=(),
                    train=True):
    """Refuses a `model_dir` that is no writable folder (`disk.py`);
    returns `check`'s `Resume`, or None for a new run."""
    disk.check_model_dir(model_dir)
    return check(model_dir, run_config, recorded, may_differ, train)


def check(model_dir, run_config, recorded, may_differ=(), train=True):
    """Returns `Resume`, or None for a new run (`recorded` None); raises
    `ResumeError`, or `restore.NoCheckpoint` when `train`ing and no
    checkpoint loads. Where a damaged checkpoint was passed over,
    `Resume.skipped` says so in one line, for the caller to show.

    `run_config` ({flag: value}, as run_config.json records them) must
    equal the flags of the run `recorded` in `model_dir` (a `Recorded`),
    but for the names in `may_differ`; of those, `epochs` may only be
    raised. A run_config.json that came or went since `recorded` was read
    (before this run took the folder's lock) is refused.
    """
    path = os.path.join(model_dir, layout.RUN_CONFIG)
    if (recorded is None) == os.path.exists(path):
        raise ResumeError(
            f"{path} was {'written' if recorded is None else 'removed'} "
            "after this command read `model_dir` (by another run there?): "
            "start it again to go on from what is there now. Received: "
            f"model_dir={model_dir!r}")
    if recorded is None:
        return None
    original, raises = recorded.flags, recorded.raises
    epochs_before = (run_config["epochs"] if recorded.epochs is None
                     else recorded.epochs)
    _refuse_changes(original, run_config, may_differ)
    epochs = run_config["epochs"]
    if epochs < epochs_before:
        raise ResumeError(
            f"`epochs` can only be raised when resuming: the run in "
            f"`model_dir` trains for epochs={epochs_before}; fewer would "
            f"change its schedule. Received: epochs={epochs}")
    if not train:  # --mode=eval reads checkpoints/ only.
        return Resume(original, epochs_before, epochs, 0, raises)
    start, skipped = restore.choose(model_dir)
    if skipped:
        where = (f"resuming at {start.describe(model_dir)}" if start else
                 "no epoch had finished: starting the run over from its "
                 "beginning")
        skipped = f"skipped {'; '.join(skipped)}; {where}"
    return Resume(original, epochs_before, epochs,
                  start.epoch if start else 0, raises,
                  start.position if start else None, start, skipped or None)


def _refuse_changes(original, run_config, may_differ):
    for key, old in original.items():
        new = run_config.get(key)
        if key in may_differ or old == new:
            continue
        if isinstance(old, (int, float)) and isinstance(new, (int, float)) \
                and not isinstance(old, bool) and float(old) == float(new):
            continue
        raise ResumeError(
            f"`{key}` differs from the run in `model_dir`, which has "
            f"{key}={old!r}; resuming with {key}={new!r} would change the "
            f"model, data, schedule or optimizer. Use the same value or "
            f"another --model_dir. Received: {key}={new!r}")


def record_raise(model_dir, resume, message):
    """Appends this raise of `--epochs` to `epochs_raised.json`."""
    entry = {"epochs": resume.epochs, "from_epochs": resume.epochs_before,
             "at_epoch": resume.finished_epochs, "schedule": message}
    atomic_write(os.path.join(model_dir, layout.RAISES),
                 json.dumps(resume.raises + [entry], indent=2,
                            sort_keys=True) + "\n")


# What every run's run_config.json holds: a file without them is no run's.
REQUIRED = ("model", "dataset", "global_batch_size", "optimizer")


def read_run_config(model_dir):
    """The flags in `model_dir`'s run_config.json: a JSON object holding
    `REQUIRED`; else a `ResumeError` naming the file (damaged, truncated,
    `{}`), so that no run is resumed against it."""
    path = os.path.join(model_dir, layout.RUN_CONFIG)
    config = _load(path)
    if not isinstance(config, dict):
        raise _damaged(path, model_dir, "not a JSON object of the run's "
                                        "flags")
    missing = [name for name in REQUIRED if name not in config]
    if missing:
        raise _damaged(path, model_dir, "no " + ", ".join(missing))
    return config


def read_raises(model_dir):
    """The records of `model_dir`'s epochs_raised.json ([] where there is
    none); a `ResumeError` naming it where it is damaged."""
    path = os.path.join(model_dir, layout.RAISES)
    if not os.path.exists(path):
        return []
    raises = _load(path)
    if not (isinstance(raises, list) and all(
            isinstance(r, dict) and isinstance(r.get("epochs"), int)
            for r in raises)):
        raise _damaged(path, model_dir, "not a list of the raises of "
                                        "--epochs")
    return raises


def _load(path):
    """The JSON in `path`; None where it is not JSON text."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def _damaged(path, model_dir, why):
    return ResumeError(
        f"{path} is damaged ({why}): the run in `model_dir` cannot be "
        "resumed against it. Restore the file, move it away to start a new "
        "run there, or use another --model_dir. Received: "
        f"model_dir={model_dir!r}")
