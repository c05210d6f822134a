"""Packs TensorFlow's Eigen headers for the device test on a machine without TF.

Usage: python native/tests/pack_eigen.py DEST   (e.g. .gpu_campaign/eigen.tar.gz)

Writes a `.tar.gz` of `Eigen/` and `unsupported/Eigen/` from
`tf.sysconfig.get_include()` (the headers TensorFlow's kernels, and so the
fusion kernels, are compiled against), with `tf_cflags.txt`: the `-D` flags of
`tf.sysconfig.get_compile_flags()`, which `device_test.sh` passes on.
"""

import io
import os
import sys
import tarfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
TREES = ("Eigen", os.path.join("unsupported", "Eigen"))


def pack(dest):
    """Writes the tarball to `dest`; returns its size in bytes."""
    import tensorflow as tf

    include = tf.sysconfig.get_include()
    defines = [f for f in tf.sysconfig.get_compile_flags() if f.startswith("-D")]
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with tarfile.open(dest, "w:gz", compresslevel=9) as tar:
        for tree in TREES:
            tar.add(os.path.join(include, tree), arcname=tree)
        flags = (" ".join(defines) + "\n").encode()
        info = tarfile.TarInfo("tf_cflags.txt")
        info.size = len(flags)
        tar.addfile(info, io.BytesIO(flags))
    return os.path.getsize(dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python native/tests/pack_eigen.py DEST.tar.gz")
    size = pack(sys.argv[1])
    print(f"pack_eigen: wrote {sys.argv[1]} ({size / 2**20:.1f} MiB)")
