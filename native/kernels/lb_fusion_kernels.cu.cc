// CUDA instantiations of the pack/unpack conversion functor.

#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include "native/kernels/lb_fusion_kernels.h"

namespace tensorflow {
namespace functor {

typedef Eigen::GpuDevice GPUDevice;

// Eigen's GPU executor runs the same cast/multiply expressions as on CPU.
#define LB_INSTANTIATE_OUT(In, Out)                                      \
  template <>                                                            \
  void Convert<GPUDevice, In, Out>::operator()(                          \
      const GPUDevice& d, const In* src, Out* dst, int64_t n,            \
      float scale) {                                                     \
    ConvertImpl(d, src, dst, n, scale);                                  \
  }
#define LB_INSTANTIATE_IN(In)            \
  LB_INSTANTIATE_OUT(In, Eigen::half)     \
  LB_INSTANTIATE_OUT(In, Eigen::bfloat16) \
  LB_INSTANTIATE_OUT(In, float)           \
  LB_INSTANTIATE_OUT(In, double)
LB_FUSION_FOR_EACH_TYPE(LB_INSTANTIATE_IN)
#undef LB_INSTANTIATE_IN
#undef LB_INSTANTIATE_OUT

}  // namespace functor
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
