// Shared by the device test's driver (.cu.cc) and its CPU reference (.cc).

#ifndef KERAS_LARGEBATCH_NATIVE_TESTS_LB_FUSION_DEVICE_TEST_H_
#define KERAS_LARGEBATCH_NATIVE_TESTS_LB_FUSION_DEVICE_TEST_H_

#include <cstdint>

#include "native/kernels/lb_fusion_kernels.h"

namespace lb_device_test {

enum Dtype { kHalf, kBfloat16, kFloat, kDouble };

// dst[i] = Convert<Eigen::DefaultDevice, In, Out>(src[i], scale) for i < n,
// as TensorFlow's CPU kernel runs it in each shard, compiled by the host
// compiler with the CPU kernel's flags.
void CpuConvert(Dtype in, Dtype out, const void* src, void* dst, int64_t n,
                float scale);

// The same through a scalar loop, Out(C(x) * C(scale)), for the CPU-only mode.
void ScalarConvert(Dtype in, Dtype out, const void* src, void* dst, int64_t n,
                   float scale);

// Calls f(In*, Out*) with null pointers of the C++ types of `in` and `out`.
template <typename In, typename F>
void DispatchOut(Dtype out, F& f) {
  switch (out) {
    case kHalf: return f(static_cast<In*>(nullptr), static_cast<Eigen::half*>(nullptr));
    case kBfloat16:
      return f(static_cast<In*>(nullptr), static_cast<Eigen::bfloat16*>(nullptr));
    case kFloat: return f(static_cast<In*>(nullptr), static_cast<float*>(nullptr));
    case kDouble: return f(static_cast<In*>(nullptr), static_cast<double*>(nullptr));
  }
}

template <typename F>
void Dispatch(Dtype in, Dtype out, F f) {
  switch (in) {
    case kHalf: return DispatchOut<Eigen::half>(out, f);
    case kBfloat16: return DispatchOut<Eigen::bfloat16>(out, f);
    case kFloat: return DispatchOut<float>(out, f);
    case kDouble: return DispatchOut<double>(out, f);
  }
}

}  // namespace lb_device_test

#endif  // KERAS_LARGEBATCH_NATIVE_TESTS_LB_FUSION_DEVICE_TEST_H_
