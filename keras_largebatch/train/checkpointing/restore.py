"""Which checkpoint a run resumes from: the newest that loads whole.

    within_epoch.json and the weights it names   (`within_epoch.py`)
    training_metadata.json and latest.weights.h5 (`backup.py`)

The checkpoint within an epoch is taken when it is at least as new as the
epoch backup, else the backup. A checkpoint loads whole when its pointer
(the JSON file) parses, has every field, names a plain file in `backup/`,
and that file has the size and CRC-32 the pointer recorded (a file
written before they were recorded: every dataset reads). One that does
not is skipped for the next, and `choose` says which and why; the replay
from an older checkpoint is deterministic, so the run still ends with an
uninterrupted run's weights. The epoch checkpoints hold no optimizer
state: where neither loads, the run cannot go on (`NoCheckpoint`, exit
code 2, naming the folder and the files).
"""

import dataclasses
import json
import os

from keras_largebatch.train import layout
from keras_largebatch.train.checkpointing import files
from keras_largebatch.train.checkpointing.within_epoch import Position


class NoCheckpoint(ValueError):
    """Checkpoints in `backup/`, none of which loads (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Start:
    """A checkpoint that loads whole.

    Attributes:
        kind: "within_epoch" or "backup".
        weights: the path of its weights file (model and optimizer).
        epoch: the epochs finished before it.
        seed_states: the dropout seed states it recorded.
        position: the `Position` within epoch `epoch`, or None.
    """

    kind: str
    weights: str
    epoch: int
    seed_states: list
    position: Position = None

    def describe(self, model_dir):
        step = self.position.step if self.position else 0
        return (f"epoch {self.epoch + 1}, step {step} "
                f"({os.path.relpath(self.weights, model_dir)})")


def choose(model_dir):
    """(`Start` or None, [why each newer checkpoint was skipped]).

    None with nothing skipped: no checkpoint was written yet (a run killed
    in its first epoch without `--checkpoint_every_steps`); None with
    something skipped: only checkpoints of the first epoch were written and
    none loads, so the run starts over from its seed (what it replays is
    the uninterrupted run); raises `NoCheckpoint` where an epoch had
    finished and nothing of it loads."""
    folder = os.path.join(model_dir, layout.BACKUP)
    backup, backup_why = _backup(folder)
    within, within_why = _within(folder)
    skipped = []
    if within and (backup is None or within.epoch >= backup.epoch):
        if backup_why and (backup_why[1] is None
                           or backup_why[1] > within.epoch):
            skipped.append(backup_why[0])  # It was newer.
        return within, skipped
    if within_why and (backup is None or within_why[1] is None
                       or within_why[1] >= backup.epoch):
        skipped.append(within_why[0])
    if backup:
        return backup, skipped
    if backup_why:
        skipped.append(backup_why[0])
    if skipped and backup_why is None and not _epochs_finished(model_dir):
        # No epoch had finished: the run's start (its seed) is the newest
        # state that loads, and the replay from it is the uninterrupted run.
        return None, skipped
    if skipped:
        raise NoCheckpoint(
            f"no checkpoint in {folder} loads whole ({'; '.join(skipped)}), "
            f"and the epoch checkpoints in "
            f"{os.path.join(model_dir, layout.CHECKPOINTS)} hold no "
            f"optimizer state, so the run cannot go on as it would have. "
            f"Start it again in another --model_dir (--init_weights can "
            f"begin from an epoch checkpoint), or remove {folder} to start "
            f"over in this one")
    return None, skipped


def _epochs_finished(model_dir):
    """Whether an epoch checkpoint was written (an epoch finished)."""
    folder = os.path.join(model_dir, layout.CHECKPOINTS)
    return os.path.isdir(folder) and any(
        layout.EPOCH_RE.fullmatch(name) for name in os.listdir(folder))


def _read(path):
    """The JSON object at `path`: (dict, None), (None, why) or (None, None)
    when absent."""
    name = os.path.basename(path)
    if not os.path.exists(path):
        return None, None
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"{name} does not parse ({type(e).__name__})"
    if not isinstance(saved, dict):
        return None, f"{name} holds no JSON object"
    return saved, None


def _field(saved, name, kind, path):
    value = saved.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and (
            kind is int):
        raise ValueError(f"{os.path.basename(path)} has no valid `{name}`")
    return value


def _weights(folder, saved, path, key):
    name = saved.get(key)
    if not layout.plain(name):
        raise ValueError(f"{os.path.basename(path)} names {name!r}, not a "
                         f"file in {folder}")
    return os.path.join(folder, name)


def _backup(folder):
    """(`Start` of the epoch backup or None, (why, its epoch or None) or
    None)."""
    path = os.path.join(folder, layout.BACKUP_METADATA)
    saved, why = _read(path)
    latest = os.path.join(folder, layout.BACKUP_WEIGHTS)
    if saved is None:
        if why is None and os.path.exists(latest):
            why = f"{layout.BACKUP_WEIGHTS} has no {layout.BACKUP_METADATA}"
        return None, why and (f"the epoch backup: {why}", None)
    epoch = saved.get("epoch") if isinstance(saved.get("epoch"), int) else None
    try:
        epoch = _field(saved, "epoch", int, path)
        states = saved.get("seed_states", [])
        _field({"s": states}, "s", list, path)
        weights = latest
        if saved.get("staged") is not None:
            staged = _weights(folder, saved, path, "staged")
            if os.path.exists(staged):  # A kill left the rename undone.
                weights = staged
    except ValueError as e:
        return None, (f"the epoch backup: {e}", epoch)
    damage = files.check(weights, saved.get("written"))
    if damage:
        return None, (f"the epoch backup: {damage}", epoch)
    return Start("backup", weights, epoch, states), None


def _within(folder):
    """(`Start` within an epoch or None, (why, its epoch or None) or
    None)."""
    path = os.path.join(folder, layout.POINTER)
    saved, why = _read(path)
    if saved is None:
        return None, why and (why, None)
    epoch = saved.get("epoch") if isinstance(saved.get("epoch"), int) else None
    try:
        values = {}
        for field in dataclasses.fields(Position):
            kind = {"data": dict, "seed_states": list, "metrics": list,
                    "weights": str}.get(field.name, int)
            if field.name == "pending_accumulation_steps" and (
                    field.name in saved and saved[field.name] is None):
                values[field.name] = None
                continue
            values[field.name] = _field(saved, field.name, kind, path)
        values["weights"] = _weights(folder, saved, path, "weights")
    except ValueError as e:
        return None, (f"the checkpoint within epoch: {e}", epoch)
    position = Position(**values)
    damage = files.check(position.weights, saved.get("written"))
    if damage:
        return None, (f"the checkpoint within epoch {position.epoch + 1}: "
                      f"{damage}", position.epoch)
    return Start("within_epoch", position.weights, position.epoch,
                 position.seed_states, position), None
