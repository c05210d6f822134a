// CPU reference of the device test, compiled by the host compiler as
// TensorFlow's CPU kernel is (lb_fusion_kernels.cc runs ConvertImpl on an
// Eigen::DefaultDevice in each shard).

#define EIGEN_USE_THREADS

#include <type_traits>

#include "native/tests/lb_fusion_device_test.h"

namespace lb_device_test {

void CpuConvert(Dtype in, Dtype out, const void* src, void* dst, int64_t n,
                float scale) {
  Dispatch(in, out, [&](auto* in_tag, auto* out_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    using Out = std::remove_pointer_t<decltype(out_tag)>;
    tensorflow::functor::ConvertImpl(Eigen::DefaultDevice(),
                                     static_cast<const In*>(src),
                                     static_cast<Out*>(dst), n, scale);
  });
}

void ScalarConvert(Dtype in, Dtype out, const void* src, void* dst, int64_t n,
                   float scale) {
  Dispatch(in, out, [&](auto* in_tag, auto* out_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    using Out = std::remove_pointer_t<decltype(out_tag)>;
    using C = tensorflow::functor::ComputeType<In, Out>;
    const In* x = static_cast<const In*>(src);
    Out* y = static_cast<Out*>(dst);
    for (int64_t i = 0; i < n; ++i) {
      const C c = static_cast<C>(x[i]);
      y[i] = static_cast<Out>(scale == 1.0f ? c : c * static_cast<C>(scale));
    }
  });
}

}  // namespace lb_device_test
