#!/usr/bin/env bash
# Builds and runs the fusion kernels' device test (lb_fusion_device_test.cu.cc)
# with nvcc against Eigen's headers alone: no TensorFlow needed.
#
# Usage: bash native/tests/device_test.sh (--eigen DIR | --eigen-tar FILE)
#            [--arch sm_90] [--compile-only] [--cpu-only] [--out FILE]
#   --eigen DIR      a folder holding Eigen/ and unsupported/Eigen/ (and, from
#                    pack_eigen.py, tf_cflags.txt: TensorFlow's -D flags)
#   --eigen-tar FILE the tarball that native/tests/pack_eigen.py writes
#   --arch           the GPU architecture to compile for (default sm_90)
#   --compile-only   build, do not run
#   --cpu-only       build with the host compiler alone (no nvcc) and run the
#                    CPU functor against a scalar loop
#   --out FILE       also write the output to FILE
# CUDA is found as setup.py finds it: CUDA_HOME or CUDA_PATH, nvcc on the PATH,
# /usr/local/cuda. The kernels get setup.py's nvcc flags, the CPU reference
# its host compiler flags (KERAS_LARGEBATCH_NATIVE_CFLAGS, else -mavx -mf16c
# where the CPU has them).
# Exit status: 0 pass, 1 a bitwise mismatch, 2 bad arguments, 3 a CUDA error,
# 4 a failed build.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
eigen= tarball= arch=sm_90 compile_only=0 cpu_only=0 out=

usage() { echo "device_test.sh: $1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --eigen) eigen=${2:-}; shift 2 || usage "--eigen needs a folder" ;;
    --eigen-tar) tarball=${2:-}; shift 2 || usage "--eigen-tar needs a file" ;;
    --arch) arch=${2:-}; shift 2 || usage "--arch needs a value, e.g. sm_90" ;;
    --out) out=${2:-}; shift 2 || usage "--out needs a file" ;;
    --compile-only) compile_only=1; shift ;;
    --cpu-only) cpu_only=1; shift ;;
    *) usage "unknown argument '$1' (see the usage at the top of $0)" ;;
  esac
done
[[ "$arch" =~ ^sm_[0-9]+a?$ ]] || usage "--arch must look like sm_90. Received: --arch=$arch"
[ -n "$eigen$tarball" ] || usage "give --eigen DIR or --eigen-tar FILE"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/out.txt"
say() { echo "$*" | tee -a "$work/out.txt"; }
finish() {  # Copies the output to --out and exits with $1.
  [ -n "$out" ] && { mkdir -p "$(dirname "$out")"; cp "$work/out.txt" "$out"; }
  exit "$1"
}

if [ -n "$tarball" ]; then
  [ -f "$tarball" ] || usage "no Eigen tarball at $tarball"
  mkdir "$work/eigen"
  tar -xzf "$tarball" -C "$work/eigen" || usage "cannot extract $tarball"
  eigen=$work/eigen
fi
[ -f "$eigen/Eigen/Core" ] && [ -f "$eigen/unsupported/Eigen/CXX11/Tensor" ] \
  || usage "no Eigen headers in '$eigen' (needs Eigen/Core and unsupported/Eigen/CXX11/Tensor)"

# TensorFlow's -D flags (tf.sysconfig.get_compile_flags() of TensorFlow 2.21
# where pack_eigen.py did not record them).
defines="-D_GLIBCXX_USE_CXX11_ABI=1 -DEIGEN_MAX_ALIGN_BYTES=64"
[ -f "$eigen/tf_cflags.txt" ] && defines=$(cat "$eigen/tf_cflags.txt")
if [ -n "${KERAS_LARGEBATCH_NATIVE_CFLAGS+set}" ]; then
  host_flags=$KERAS_LARGEBATCH_NATIVE_CFLAGS
elif grep -qw avx /proc/cpuinfo 2>/dev/null && grep -qw f16c /proc/cpuinfo; then
  host_flags="-mavx -mf16c"
else
  host_flags=
fi
cxx=${CXX:-g++}
common="-std=c++17 -O2 -I$ROOT -I$eigen $defines"
src=$ROOT/native/tests
bin=$work/lb_fusion_device_test

build() {  # build NAME COMMAND...: runs a compile, its output kept in a log.
  local name=$1; shift
  "$@" > "$work/$name.log" 2>&1 || { echo "$name" >> "$work/failed"; return 1; }
}
# shellcheck disable=SC2086
build reference "$cxx" -c "$src/lb_fusion_device_test_cpu.cc" -o "$work/cpu.o" \
  $common $host_flags -Wno-interference-size &
if [ "$cpu_only" = 1 ]; then
  say "device_test.sh: host-only build ($cxx $host_flags), Eigen from $eigen"
  # shellcheck disable=SC2086
  build driver "$cxx" -x c++ -c "$src/lb_fusion_device_test.cu.cc" -o "$work/driver.o" \
    $common -DLB_DEVICE_TEST_CPU_ONLY &
  wait
  [ -f "$work/failed" ] || build link "$cxx" -o "$bin" "$work/driver.o" "$work/cpu.o" -lpthread
else
  if [ -n "${CUDA_HOME:-}" ]; then nvcc=$CUDA_HOME/bin/nvcc
  elif [ -n "${CUDA_PATH:-}" ]; then nvcc=$CUDA_PATH/bin/nvcc
  else nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  fi
  [ -x "$nvcc" ] || usage "nvcc not found at $nvcc (set CUDA_HOME, or put nvcc on the PATH)"
  release=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  say "device_test.sh: nvcc $release ($nvcc) for $arch, host $cxx $host_flags, Eigen from $eigen"
  # setup.py's nvcc flags for the CUDA kernels.
  nvflags="$common -DGOOGLE_CUDA=1 -DNDEBUG -x cu --expt-relaxed-constexpr
    -gencode=arch=compute_${arch#sm_},code=$arch -Wno-deprecated-declarations"
  # shellcheck disable=SC2086
  build kernels "$nvcc" -c "$ROOT/native/kernels/lb_fusion_kernels.cu.cc" \
    -o "$work/kernels.o" $nvflags &
  # shellcheck disable=SC2086
  build driver "$nvcc" -c "$src/lb_fusion_device_test.cu.cc" -o "$work/driver.o" $nvflags &
  wait
  [ -f "$work/failed" ] || build link "$nvcc" -o "$bin" "$work/driver.o" \
    "$work/kernels.o" "$work/cpu.o" -lpthread
fi
if [ -f "$work/failed" ]; then
  for name in $(cat "$work/failed"); do
    say "device_test.sh: the $name build failed; the end of its output:"
    grep -v "interference\|^ *|\|^ *[0-9]* |" "$work/$name.log" | tail -25 | tee -a "$work/out.txt"
  done
  finish 4
fi
say "device_test.sh: built"
[ "$compile_only" = 1 ] && finish 0
"$bin" 2>&1 | tee -a "$work/out.txt"
finish "${PIPESTATUS[0]}"
