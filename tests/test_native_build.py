"""A library built with `KERAS_LARGEBATCH_BUILD_NATIVE=cuda` holds device code.

Run where that variable is set, as the CUDA job of `tests/run.sh` does: the
`.nv_fatbin` section of `_lb_fusion_ops.so` holds device code (cubins or PTX)
for TensorFlow's GPU architectures, the library loads into TensorFlow (a CPU
machine is enough), and both ops have CPU and GPU kernels registered.
Elsewhere the module is skipped.
"""

import os
import struct

import keras
import pytest

if os.environ.get("KERAS_LARGEBATCH_BUILD_NATIVE") != "cuda":
    pytest.skip("checks a build made with KERAS_LARGEBATCH_BUILD_NATIVE=cuda",
                allow_module_level=True)
if keras.backend.backend() != "tensorflow":
    pytest.skip("native ops are TensorFlow-only", allow_module_level=True)

import tensorflow as tf
from tensorflow.python.framework import kernels

from keras_largebatch.distribute import native

FATBIN_MAGIC = 0xBA55ED50
CUBIN, PTX = 2, 1


def elf_section(path, name):
    """The bytes of section `name` of a 64-bit little-endian ELF, or None."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path}: not an ELF64 file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):  # (name offset, file offset, size)
        entry = shoff + i * shentsize
        return (struct.unpack_from("<I", data, entry)[0],
                *struct.unpack_from("<QQ", data, entry + 0x18))

    _, names_at, _ = header(shstrndx)
    for i in range(shnum):
        name_at, offset, size = header(i)
        end = data.index(b"\0", names_at + name_at)
        if data[names_at + name_at:end].decode() == name:
            return data[offset:offset + size]
    return None


def fatbin_entries(blob):
    """(kind, sm) of each device image in a fatbin: kind 2 cubin, 1 PTX."""
    entries, at = [], 0
    while at + 16 <= len(blob):
        magic, _, header_size, size = struct.unpack_from("<IHHQ", blob, at)
        if magic != FATBIN_MAGIC:
            break
        entry, end = at + header_size, at + header_size + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            sm, = struct.unpack_from("<I", blob, entry + 28)
            entries.append((kind, sm))
            entry += entry_header + payload
        at = end
    return entries


def test_library_holds_device_code_for_tensorflows_architectures():
    blob = elf_section(native.library_path(), ".nv_fatbin")
    assert blob, f"{native.library_path()} has no .nv_fatbin section"
    assert struct.unpack_from("<I", blob)[0] == FATBIN_MAGIC
    entries = fatbin_entries(blob)
    archs = tf.sysconfig.get_build_info()["cuda_compute_capabilities"]
    wanted = {int(a.split("_")[1]) for a in archs}
    assert entries and {sm for _, sm in entries} <= wanted, (entries, archs)
    assert {kind for kind, _ in entries} <= {CUBIN, PTX}


def test_library_loads_with_cpu_and_gpu_kernels():
    assert native.native_ops_available(), native.load_error()
    for op in ("LbFusionPack", "LbFusionUnpack"):
        devices = {k.device_type
                   for k in kernels.get_registered_kernels_for_op(op).kernel}
        assert devices == {"CPU", "GPU"}, (op, devices)
