"""Writing a checkpoint file, checking one read back, removing litter.

Every checkpoint goes through `save`: it refuses non-finite weights
(`Diverged`, the error `run.divergence` also raises), makes a weights
file in memory and checks the free space for it, writes it to a
temporary name in the same folder and renames it into place
(`_shared.atomic_path`, which removes the temporary on failure), and
returns the file's `fingerprint`, its size and CRC-32, which the pointer
naming it records. A write that fails (a full disk, an I/O error) raises
`SaveError`: one line naming the folder and the bytes needed; the
previous checkpoint is left whole. `check` says why a file does not load
whole, or None: against its fingerprint, or (a file written before
fingerprints) by reading every dataset of its HDF5 file. `tidy` removes
what a killed run left."""

import errno
import io
import os
import shutil
import zlib

import keras
from keras import ops

from keras_largebatch._shared import atomic_path
from keras_largebatch._shared import write_json
from keras_largebatch._wrappers import chain
from keras_largebatch.train import layout

# HDF5's own structures beside the variables' bytes, with a margin.
OVERHEAD = 1.1
OVERHEAD_BYTES = 1 << 16


class Diverged(RuntimeError):
    """The run's loss or weights turned non-finite; `str()` is one line
    saying where, at what rate, and what to try."""


def nonfinite_variables(model):
    """The paths of `model`'s float variables and its optimizer's holding a
    NaN or an inf, the loss scale of a mixed optimizer left out; [] when
    all are finite. One read from the device, on every backend."""
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        scales = loss_scales(optimizer)
        variables += [v for v in optimizer.variables
                      if not any(v is s for s in scales)]
    floats = [v for v in variables
              if keras.backend.is_float_dtype(v.dtype)]
    if not floats:
        return []
    finite = ops.convert_to_numpy(ops.stack(
        [ops.all(ops.isfinite(v.value)) for v in floats]))
    return [v.path for v, ok in zip(floats, finite) if not ok]


def loss_scales(optimizer):
    """The dynamic loss scales of the loss-scaling optimizers in the
    chain (`LARSMixed`, `LAMBMixed`)."""
    return [o.dynamic_scale for o in chain(optimizer)
            if getattr(o, "dynamic_scale", None) is not None]


class SaveError(OSError):
    """A checkpoint could not be written (the command exits with code 1)."""


def save(model, path, write=None):
    """Writes `model`'s weights file (what `model.save_weights` writes) to
    `path` atomically, or with `write(tmp)` another file of `model`;
    returns its `fingerprint`."""
    _refuse_nonfinite(model, path)
    folder = os.path.dirname(os.path.abspath(path))
    data = None if write else weights_bytes(model)
    needed = estimate(model) if write else len(data)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SaveError(
            f"not saving {path}: {folder} has {free} bytes free, the "
            f"checkpoint needs {'about ' if write else ''}{needed} bytes. "
            f"Free some space and run the same command again: it resumes "
            f"from the last checkpoint.")
    try:
        with atomic_path(path) as tmp:
            if write:
                write(tmp)
            else:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
    except OSError as e:
        raise SaveError(
            f"could not write {path} ({e.strerror or e}); {folder} needs "
            f"{needed} bytes free for the checkpoint, it had {free}. "
            f"The last complete checkpoint is kept: run the same command "
            f"again once the folder is writable.") from None
    if write:
        return fingerprint(path)
    return {"size": len(data), "crc32": zlib.crc32(data)}


def weights_bytes(model):
    """The bytes `model.save_weights` writes, made in memory.

    HDF5 then never writes to the disk: on a full or failing disk the
    plain write of these bytes fails with an `OSError`, where h5py would
    leave its file half-closed and crash the process when it flushes it
    again at exit. Keras' `save_weights_only` steps, on a `BytesIO` store
    (its private `H5IOStore` and `_save_state`; the file is compared with
    `save_weights`' in tests/train/checkpointing/test_checkpoint_faults.py).
    """
    from keras.src.saving import saving_lib

    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None,
                           inner_path="", visited_saveables=set())
    store.close()
    return buffer.getbuffer()  # No copy.


def save_json(path, obj):
    """Writes `obj` as JSON to `path` atomically (`_shared.write_json`);
    `SaveError` on failure."""
    try:
        write_json(path, obj)
    except OSError as e:
        raise SaveError(f"could not write {path} ({e.strerror or e}). The "
                        f"last complete checkpoint is kept.") from None


def estimate(model):
    """Bytes of a weights file of `model` (and its optimizer, if any)."""
    variables = list(model.weights)
    if getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    raw = 0
    for v in variables:
        size = 1
        for dim in v.shape:
            size *= int(dim)
        raw += size * _itemsize(v.dtype)
    return int(raw * OVERHEAD) + OVERHEAD_BYTES


def _itemsize(dtype):
    import numpy as np

    try:
        return np.dtype(str(dtype)).itemsize
    except TypeError:  # bfloat16 and the like
        return 2 if "16" in str(dtype) else 4


def _refuse_nonfinite(model, path):
    bad = nonfinite_variables(model)
    if bad:
        raise Diverged(
            f"not saving {path}: non-finite values in {len(bad)} "
            f"variable(s) ({', '.join(bad[:3])}); the last checkpoint "
            f"holds finite weights")


def fingerprint(path):
    """{"size": bytes, "crc32": CRC-32 of the bytes} of the file `path`."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
    return {"size": os.path.getsize(path), "crc32": crc}


def check(path, recorded=None):
    """Why the checkpoint file `path` does not load whole, or None.

    `recorded`: its `fingerprint` at save time, or None (then every
    dataset of the HDF5 file is read)."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return f"{name} is missing"
    size = os.path.getsize(path)
    if recorded:
        if size != recorded.get("size"):
            return (f"{name} has {size} bytes, {recorded.get('size')} were "
                    f"written")
        if fingerprint(path)["crc32"] != recorded.get("crc32"):
            return f"{name} has another CRC-32 than the one written"
        return None
    try:
        import h5py

        with h5py.File(path, "r") as f:
            f.visititems(lambda _, item: item[()] if isinstance(
                item, h5py.Dataset) else None)
    except Exception as e:  # h5py raises OSError, KeyError, RuntimeError.
        first = str(e).split("(")[0].strip() or type(e).__name__
        return f"{name} does not open ({first})"
    return None


def tidy(folder, pending=None):
    """Removes what a killed run left in `folder`: temporaries
    (`.tmp-PID-NAME`) and staged backups other than `pending` (the one
    the backup's metadata names). Returns the names removed."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in sorted(os.listdir(folder)):
        litter = layout.TEMPORARY_RE.fullmatch(name) or (
            layout.STAGED_RE.fullmatch(name) and name != pending)
        path = os.path.join(folder, name)
        if litter and os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
            removed.append(name)
    return removed


def full(error):
    """Whether `error` (an OSError) says the disk is full or failing."""
    return getattr(error, "errno", None) in (
        errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)
