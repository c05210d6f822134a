// Device functor shared by the CPU (.cc) and CUDA (.cu.cc) pack/unpack kernels.
// Eigen only, no TensorFlow headers, so native/tests/ can build it on a GPU
// machine without TensorFlow.

#ifndef KERAS_LARGEBATCH_NATIVE_KERNELS_LB_FUSION_KERNELS_H_
#define KERAS_LARGEBATCH_NATIVE_KERNELS_LB_FUSION_KERNELS_H_

#include <cstdint>
#include <type_traits>

#include "unsupported/Eigen/CXX11/Tensor"

namespace tensorflow {
namespace functor {

// double only when both ends are double, so float64 round trips are exact.
template <typename In, typename Out>
using ComputeType =
    typename std::conditional<std::is_same<In, double>::value &&
                                  std::is_same<Out, double>::value,
                              double, float>::type;

// dst[i] = Out(C(src[i]) * C(scale)); with scale == 1, no multiply (a plain
// copy when In == Out).
template <typename Device, typename In, typename Out>
struct Convert {
  void operator()(const Device& d, const In* src, Out* dst, int64_t n,
                  float scale);
};

// TTypes<T>::UnalignedFlat of tensorflow/core/framework/tensor_types.h.
template <typename T>
using UnalignedFlat = Eigen::TensorMap<
    Eigen::Tensor<T, 1, Eigen::RowMajor, Eigen::DenseIndex>, Eigen::Unaligned>;

// The same Eigen expressions as tf.cast and tf.multiply, hence the same bits;
// unaligned maps, since slices of the buffer start at any element.
template <typename Device, typename In, typename Out>
void ConvertImpl(const Device& d, const In* src, Out* dst, int64_t n,
                 float scale) {
  if (n == 0) return;
  UnalignedFlat<const In> x(src, n);
  UnalignedFlat<Out> y(dst, n);
  using C = ComputeType<In, Out>;
  if (std::is_same<In, Out>::value && scale == 1.0f) {
    d.memcpy(dst, src, n * sizeof(In));
  } else if (scale != 1.0f) {
    y.device(d) = (x.template cast<C>() * static_cast<C>(scale))
                      .template cast<Out>();
  } else {
    // No multiply by 1: under the CPU's flush-to-zero it would zero subnormals.
    y.device(d) = x.template cast<C>().template cast<Out>();
  }
}

}  // namespace functor
}  // namespace tensorflow

#define LB_FUSION_FOR_EACH_TYPE(M) \
  M(Eigen::half)                   \
  M(Eigen::bfloat16)               \
  M(float)                         \
  M(double)

#endif  // KERAS_LARGEBATCH_NATIVE_KERNELS_LB_FUSION_KERNELS_H_
