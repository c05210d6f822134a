"""`bench/gpu_campaign.py --prepare DIR`: what the GPU machine lacks, in
DIR (the wheels of `WHEELS`, Fashion-MNIST, the Eigen headers for part
cuda), and the device command that installs and runs it."""

import glob
import os
import shutil
import subprocess
import sys

from runner import version  # The study's runner (bench/study/).

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPARED_LIMIT_MIB = 50

# Keras, Grain and what they need beyond the GPU image's Python packages as
# `bench/gpu_campaign_rehearsal.sh` rehearses them (jax, numpy, optax,
# absl-py, h5py, ml-dtypes, rich, matplotlib, tensorboard and its protobuf;
# the image also has torch, scikit-learn and Pillow).
WHEELS = ["keras", "namex", "optree", "grain", "array-record", "portpicker",
          "tensorboardX", "etils", "fsspec", "zipp", "cloudpickle", "psutil"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64"]


def prepare(folder):
    """Wheels and Fashion-MNIST for the GPU machine, in `folder`."""
    from keras_largebatch.train import data

    wheels = os.path.join(folder, "wheels")
    os.makedirs(wheels, exist_ok=True)
    pins = [f"{p}=={version(p)}" if version(p) else p for p in WHEELS]
    platforms = [x for tag in PLATFORMS for x in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", wheels, *pins],
                   check=True)
    source = data.find_fashion_mnist()
    if source is None:
        subprocess.run(["apt-get", "install", "-y", "dataset-fashion-mnist"],
                       check=True)
        source = data.find_fashion_mnist()
    if source is None:
        sys.exit("Fashion-MNIST not found (dataset-fashion-mnist installed?)")
    target = os.path.join(folder, "fashion-mnist")
    os.makedirs(target, exist_ok=True)
    for name in data.FASHION_MNIST_FILES:
        shutil.copy(os.path.join(source, name), target)
    # Part cuda's Eigen headers, from TensorFlow's include folder here.
    subprocess.run([sys.executable, os.path.join(
        ROOT, "native", "tests", "pack_eigen.py"),
        os.path.join(folder, "eigen.tar.gz")], check=True)
    size = sum(os.path.getsize(p) for p in glob.glob(
        os.path.join(folder, "**"), recursive=True) if os.path.isfile(p))
    mib = size / 2**20
    if mib > PREPARED_LIMIT_MIB:
        sys.exit(f"{folder} holds {mib:.1f} MiB, over {PREPARED_LIMIT_MIB}")
    rel = os.path.relpath(os.path.abspath(folder), ROOT)
    print(f"\n{folder}: {mib:.1f} MiB "
          f"({len(os.listdir(wheels))} wheels, Fashion-MNIST, Eigen)\n")
    print("Device command (run it until it prints 'campaign complete'; "
          f"carry [\"{rel}\"]; each call resumes from "
          "bench/results/gpu_campaign.json: copy the call's gpu_campaign.json,"
          " .md and _study.md into bench/results/ before the next):\n")
    # Install the wheels, run the campaign (its default budget), bring back
    # its record and report.
    print("python3 -m pip install -q --no-index --no-deps --no-compile "
          f"--no-cache-dir --upgrade --target /tmp/site {rel}/wheels/*.whl && "
          "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; "
          f"python3 bench/gpu_campaign.py --data_dir {rel}/fashion-mnist "
          f"--eigen {rel}/eigen.tar.gz 2>&1 | tee $OUT/campaign.log; "
          "cp bench/results/gpu_campaign* bench/results/lars_depth_study.json"
          " $OUT/ 2>/dev/null")
