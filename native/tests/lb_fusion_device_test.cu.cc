// Device test of the fusion ops' CUDA kernels, without TensorFlow.
//
// Runs Convert<Eigen::GpuDevice, In, Out> (lb_fusion_kernels.cu.cc) for every
// pair of half, bfloat16, float and double, with scale 1, 2^-10 and 1/3, on
// lengths 1, 7, 1023 and 100003 starting 0, 1 and 3 elements into a buffer,
// and compares the whole output buffer bit for bit with the CPU functor
// (lb_fusion_device_test_cpu.cc) on the same input. Inputs hold zeros of both
// signs, subnormals, values that overflow half, ties, inf, NaN and random bit
// patterns. Built with -DLB_DEVICE_TEST_CPU_ONLY by a host compiler, it
// compares the CPU functor with a scalar loop instead. In both modes a NaN
// must map to a NaN, but NaN payloads may differ (the GPU returns the
// canonical NaN, Eigen's vectorized CPU casts quiet NaNs their own way):
// they are counted apart, and only other mismatches fail.
// Exit status: 0 all equal, 1 a mismatch, 3 a CUDA error.

#ifndef LB_DEVICE_TEST_CPU_ONLY
#define EIGEN_USE_GPU
#endif

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "native/tests/lb_fusion_device_test.h"

namespace lb_device_test {
namespace {

const char* const kNames[] = {"half", "bfloat16", "float", "double"};
const size_t kSizes[] = {2, 2, 4, 8};
const Dtype kDtypes[] = {kHalf, kBfloat16, kFloat, kDouble};
const float kScales[] = {1.0f, 0x1p-10f, 1.0f / 3.0f};
const int64_t kLengths[] = {1, 7, 1023, 100003};
const int64_t kOffsets[] = {0, 1, 3};
const int64_t kGuard = 5;  // Elements after the slice, which must not change.

const double kSpecial[] = {
    0.0, -0.0, 1.0, -1.0, 1.0 / 3.0, -2.5,
    0x1p-24, -0x1.8p-24, 0x1p-25, 0x1.ff8p-15, 0x1p-14,  // half subnormals
    65504.0, 65519.0, 65520.0, -65520.0, 1e5, -1e9,      // half overflow
    1.0 + 0x1p-11, 1.0 + 0x3p-11, 1.0 + 0x1p-8, 1.0 + 0x3p-8,  // ties
    1.0 + 0x1p-24, 1.0 + 0x3p-24,
    0x1p-126, 0x1p-133, -0x1.8p-149, 0x1p-149, 0x1p-150,  // float subnormals
    3.4028234663852886e38, 3.5e38, -1e300, 0x1p-1022, 0x1p-1074,
    INFINITY, -INFINITY, NAN, -NAN};

uint64_t Random(uint64_t* state) {  // splitmix64
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element k: the special values first, then a mix of random bit patterns and
// random values of magnitude 2^-160 to 2^140.
template <typename T>
void Fill(T* x, int64_t n, uint64_t seed) {
  const int64_t specials = sizeof(kSpecial) / sizeof(kSpecial[0]);
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t r = Random(&seed);
    if (k < specials) {
      x[k] = static_cast<T>(kSpecial[k]);
    } else if (r % 4 == 0) {
      std::memcpy(&x[k], &r, sizeof(T));
    } else {
      const double m = 1.0 + static_cast<double>(r >> 12) * 0x1p-52;
      const int e = static_cast<int>((r >> 2) % 301) - 160;
      x[k] = static_cast<T>(std::ldexp((r & 2) ? -m : m, e));
    }
  }
}

uint64_t Bits(const unsigned char* p, size_t size) {
  uint64_t b = 0;
  std::memcpy(&b, p, size);
  return b;
}

bool IsNan(Dtype t, uint64_t b) {
  switch (t) {
    case kHalf: return (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    case kBfloat16: return (b & 0x7f80) == 0x7f80 && (b & 0x7f);
    case kFloat: return (b & 0x7f800000) == 0x7f800000 && (b & 0x7fffff);
    case kDouble:
      return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull &&
             (b & 0xfffffffffffffull);
  }
  return false;
}

#ifdef LB_DEVICE_TEST_CPU_ONLY
const char* const kUnderTest = "scalar loop";
const bool kNanPayloadsMustMatch = false;
void Setup() {}
void RunUnderTest(Dtype in, Dtype out, const unsigned char* src,
                  unsigned char* dst, int64_t total, int64_t offset, int64_t n,
                  float scale) {
  (void)total;
  ScalarConvert(in, out, src + offset * kSizes[in],
                dst + offset * kSizes[out], n, scale);
}
#else
const char* const kUnderTest = "GPU";
// A NaN must stay a NaN (the finite check then skips the step), but its
// payload may differ: on an H200 the GPU's conversions return the canonical
// NaN (half 0x7fff) where the CPU keeps the input's quiet NaN (0x7e00).
const bool kNanPayloadsMustMatch = false;
cudaStream_t stream;
Eigen::GpuStreamDevice* stream_device;
Eigen::GpuDevice* gpu;

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::printf("lb_fusion_device_test: CUDA error in %s: %s (%s)\n", what,
              cudaGetErrorName(e), cudaGetErrorString(e));
  std::exit(3);
}

void Setup() {
  int count = 0;
  Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime = 0, driver = 0;
  Check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  Check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  std::printf("lb_fusion_device_test: %s (sm_%d%d), CUDA runtime %d, driver %d\n",
              prop.name, prop.major, prop.minor, runtime, driver);
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  stream_device = new Eigen::GpuStreamDevice(&stream, 0);
  gpu = new Eigen::GpuDevice(stream_device);
}

void RunUnderTest(Dtype in, Dtype out, const unsigned char* src,
                  unsigned char* dst, int64_t total, int64_t offset, int64_t n,
                  float scale) {
  void *d_src = nullptr, *d_dst = nullptr;
  Check(cudaMalloc(&d_src, total * kSizes[in]), "cudaMalloc");
  Check(cudaMalloc(&d_dst, total * kSizes[out]), "cudaMalloc");
  Check(cudaMemcpy(d_src, src, total * kSizes[in], cudaMemcpyHostToDevice),
        "cudaMemcpy");
  Check(cudaMemcpy(d_dst, dst, total * kSizes[out], cudaMemcpyHostToDevice),
        "cudaMemcpy");
  Dispatch(in, out, [&](auto* in_tag, auto* out_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    using Out = std::remove_pointer_t<decltype(out_tag)>;
    tensorflow::functor::Convert<Eigen::GpuDevice, In, Out>()(
        *gpu, static_cast<const In*>(d_src) + offset,
        static_cast<Out*>(d_dst) + offset, n, scale);
  });
  Check(cudaGetLastError(), "Convert (kernel launch)");
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  Check(cudaMemcpy(dst, d_dst, total * kSizes[out], cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  Check(cudaFree(d_src), "cudaFree");
  Check(cudaFree(d_dst), "cudaFree");
}
#endif  // LB_DEVICE_TEST_CPU_ONLY

struct Counts {
  int64_t mismatches = 0, nan_only = 0;
};

// One case; prints its line and returns its mismatched elements.
Counts RunCase(Dtype in, Dtype out, float scale, int64_t n, int64_t offset,
               uint64_t seed) {
  const int64_t total = offset + n + kGuard;
  const size_t si = kSizes[in], so = kSizes[out];
  std::vector<unsigned char> src(total * si);
  Dispatch(in, in, [&](auto* tag, auto*) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* x = reinterpret_cast<T*>(src.data());
    Fill(x + offset, n, seed);
    Fill(x, offset, seed + 1);
    Fill(x + offset + n, kGuard, seed + 2);
  });
  std::vector<unsigned char> want(total * so, 0xA5), got(total * so, 0xA5);
  CpuConvert(in, out, src.data() + offset * si, want.data() + offset * so, n,
             scale);
  RunUnderTest(in, out, src.data(), got.data(), total, offset, n, scale);
  int64_t mismatches = 0, nan_only = 0, outside = 0, first = -1;
  for (int64_t i = 0; i < total; ++i) {
    const uint64_t w = Bits(&want[i * so], so), g = Bits(&got[i * so], so);
    if (w == g) continue;
    ++mismatches;
    if (IsNan(out, w) && IsNan(out, g)) ++nan_only;
    if (i < offset || i >= offset + n) ++outside;
    if (first < 0) first = i;
  }
  std::printf("%-8s -> %-8s scale=%-11.9g n=%-6" PRId64 " offset=%" PRId64
              ": %" PRId64 " mismatches",
              kNames[in], kNames[out], scale, n, offset, mismatches);
  if (mismatches) {
    std::printf(" (%" PRId64 " NaN payload only, %" PRId64
                " outside the slice); first at %" PRId64
                ": in 0x%" PRIx64 " cpu 0x%" PRIx64 " %s 0x%" PRIx64,
                nan_only, outside, first - offset, Bits(&src[first * si], si),
                Bits(&want[first * so], so), kUnderTest,
                Bits(&got[first * so], so));
  }
  std::printf("\n");
  Counts c;
  c.mismatches = mismatches;
  c.nan_only = nan_only;
  return c;
}

}  // namespace
}  // namespace lb_device_test

int main() {
  using namespace lb_device_test;
  Setup();
  std::printf("lb_fusion_device_test: %s against the CPU functor, bit for bit\n",
              kUnderTest);
  int cases = 0, failed = 0;
  int64_t mismatches = 0, nan_only = 0;
  uint64_t seed = 1;
  for (Dtype in : kDtypes) {
    for (Dtype out : kDtypes) {
      for (float scale : kScales) {
        for (int64_t n : kLengths) {
          for (int64_t offset : kOffsets) {
            const Counts c = RunCase(in, out, scale, n, offset, seed += 3);
            ++cases;
            failed += kNanPayloadsMustMatch ? c.mismatches > 0
                                            : c.mismatches > c.nan_only;
            mismatches += c.mismatches;
            nan_only += c.nan_only;
          }
        }
      }
    }
  }
  std::printf("lb_fusion_device_test: %d cases, %" PRId64
              " bitwise mismatches (%" PRId64 " NaN payload only), %d cases "
              "failed\n",
              cases, mismatches, nan_only, failed);
  return failed ? 1 : 0;
}
