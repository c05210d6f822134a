"""Builds the native fusion ops (`native/`) into the package, if it can.

pip builds in an isolated environment where TensorFlow is not importable, so
the target interpreter (`sys.executable`, or `KERAS_LARGEBATCH_TF_PYTHON`) is
asked for `tf.sysconfig` in a subprocess without pip's isolation variables.
No TensorFlow, or a failed compile, prints a warning and installs the package
without the library: `keras_largebatch.distribute.native` then falls back to
pure TensorFlow. `KERAS_LARGEBATCH_BUILD_NATIVE=0` skips the build.

The CUDA kernels (`*.cu.cc`) are built only when `nvcc` is found and
TensorFlow is built with CUDA (`tf.test.is_built_with_cuda()`). `-mavx -mf16c`
are added when the build CPU has them (`KERAS_LARGEBATCH_NATIVE_CFLAGS`
overrides), so build wheels for other machines with that set to "".
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "keras_largebatch.distribute._lb_fusion_ops"
SOURCES = ["native/ops/lb_fusion_ops.cc", "native/kernels/lb_fusion_kernels.cc"]
CUDA_SOURCES = ["native/kernels/lb_fusion_kernels.cu.cc"]
HEADERS = ["native/kernels/lb_fusion_kernels.h"]

_QUERY = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
print("LB_TF_INFO=" + json.dumps({
    "version": tf.__version__,
    "cflags": tf.sysconfig.get_compile_flags(),
    "lflags": tf.sysconfig.get_link_flags(),
    "cuda": tf.test.is_built_with_cuda(),
}))
"""


def _log(message):
    print(f"keras-largebatch native build: {message}", file=sys.stderr)


def query_tensorflow():
    """`tf.sysconfig` of the target environment's TensorFlow, or None."""
    python = os.environ.get("KERAS_LARGEBATCH_TF_PYTHON", sys.executable)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")
    }
    try:
        out = subprocess.run(
            [python, "-c", _QUERY],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        _log(f"could not run {python}: {e}")
        return None
    for line in out.stdout.splitlines():
        if line.startswith("LB_TF_INFO="):
            return json.loads(line[len("LB_TF_INFO="):])
    _log(f"TensorFlow is not importable by {python}: {out.stderr.strip()[-300:]}")
    return None


def arch_flags():
    """F16C float16 conversions (6x faster casts) when the build CPU has them.

    `KERAS_LARGEBATCH_NATIVE_CFLAGS` replaces them (e.g. "" for a portable
    build). Rounding is the same either way (round to nearest even).
    """
    if "KERAS_LARGEBATCH_NATIVE_CFLAGS" in os.environ:
        return shlex.split(os.environ["KERAS_LARGEBATCH_NATIVE_CFLAGS"])
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return []
    return ["-mavx", "-mf16c"] if {"avx", "f16c"} <= flags else []


def compile_commands(info, build_temp, output):
    """The compile and link commands, as lists, for `info` from TensorFlow."""
    cxx = os.environ.get("CXX", "g++")
    tf_cflags = [f for f in info["cflags"] if not f.lstrip("-").startswith("std=")]
    cflags = tf_cflags + [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-I" + ROOT,
        f'-DLB_TF_VERSION="{info["version"]}"',
        "-Wno-deprecated-declarations",
    ] + arch_flags()
    lflags = list(info["lflags"])
    nvcc = shutil.which("nvcc")
    cuda = bool(info["cuda"] and nvcc)
    if cuda:
        cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        cflags += ["-DGOOGLE_CUDA=1", "-I" + os.path.join(cuda_home, "include")]
        lflags += ["-L" + os.path.join(cuda_home, "lib64"), "-lcudart"]
    compiles, objects = [], []
    for source in SOURCES:
        obj = os.path.join(build_temp, os.path.basename(source) + ".o")
        compiles.append([cxx, "-c", os.path.join(ROOT, source), "-o", obj] + cflags)
        objects.append(obj)
    if cuda:
        for source in CUDA_SOURCES:
            obj = os.path.join(build_temp, os.path.basename(source) + ".o")
            compiles.append(
                [nvcc, "-c", os.path.join(ROOT, source), "-o", obj]
                + tf_cflags
                + ["-std=c++17", "-O2", "-I" + ROOT, "-DGOOGLE_CUDA=1",
                   "-x", "cu", "-Xcompiler", "-fPIC",
                   "--expt-relaxed-constexpr", "-DNDEBUG"]
            )
            objects.append(obj)
    link = [cxx, "-shared", "-o", output] + objects + lflags + ["-O2"]
    return compiles, link, cuda


class BuildNative(build_ext):
    """Compiles the op library with flags from `tf.sysconfig`, or skips it."""

    def get_ext_filename(self, fullname):
        # A plain `.so` name, without the Python ABI suffix: it is a TensorFlow
        # plugin (tf.load_op_library), not a Python extension module.
        filename = super().get_ext_filename(fullname)
        if LIBRARY.endswith(fullname):
            filename = filename[: filename.index("_lb_fusion_ops")] + "_lb_fusion_ops.so"
        return filename

    def build_extensions(self):
        built = []
        for ext in self.extensions:
            if self._build_native(ext):
                built.append(ext)
            elif os.path.exists(self.get_ext_fullpath(ext.name)):
                os.remove(self.get_ext_fullpath(ext.name))  # Stale, from build/.
        self.extensions[:] = built

    def _build_native(self, ext):
        if os.environ.get("KERAS_LARGEBATCH_BUILD_NATIVE", "1") == "0":
            _log("skipped (KERAS_LARGEBATCH_BUILD_NATIVE=0)")
            return False
        info = query_tensorflow()
        if info is None:
            _log("WARNING: TensorFlow not found; installing without the native "
                 "ops (the pure-TensorFlow fallback will be used).")
            return False
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        os.makedirs(self.build_temp, exist_ok=True)
        compiles, link, cuda = compile_commands(info, self.build_temp, output)
        _log(f"TensorFlow {info['version']}, CUDA kernels: {cuda}")
        try:
            workers = max(1, min(len(compiles), os.cpu_count() or 1))
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(self._run, compiles))
            self._run(link)
        except (OSError, subprocess.CalledProcessError) as e:
            _log(f"WARNING: compiling the native ops failed ({e}); installing "
                 "without them (the pure-TensorFlow fallback will be used).")
            return False
        return True

    def _run(self, command):
        _log(shlex.join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode:
            _log(result.stderr[-4000:])
            result.check_returncode()


setup(
    ext_modules=[Extension(LIBRARY, sources=SOURCES + CUDA_SOURCES, depends=HEADERS)],
    cmdclass={"build_ext": BuildNative},
)
