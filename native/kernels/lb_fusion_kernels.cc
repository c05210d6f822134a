// CPU (and, under GOOGLE_CUDA, GPU) kernels for LbFusionPack / LbFusionUnpack.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <vector>

#include "native/kernels/lb_fusion_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/overflow.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {

typedef Eigen::ThreadPoolDevice CPUDevice;
typedef Eigen::GpuDevice GPUDevice;

namespace functor {
static_assert(std::is_same<UnalignedFlat<const float>,
                           TTypes<float>::UnalignedConstFlat>::value,
              "lb_fusion_kernels.h must map memory as TTypes does");

// CPU work is sharded over the whole buffer by RunSegments, so each shard
// converts on the calling thread.
template <typename In, typename Out>
struct Convert<Eigen::DefaultDevice, In, Out> {
  void operator()(const Eigen::DefaultDevice& d, const In* src, Out* dst,
                  int64_t n, float scale) {
    ConvertImpl(d, src, dst, n, scale);
  }
};
}  // namespace functor

namespace {

// One tensor's share of the buffer: n elements from src to dst.
struct Segment {
  const void* src;
  DataType src_type;
  void* dst;
  DataType dst_type;
  int64_t n;
};

bool Supported(DataType t) {
  return t == DT_HALF || t == DT_BFLOAT16 || t == DT_FLOAT || t == DT_DOUBLE;
}

template <typename Device, typename In>
void ConvertTo(const Device& d, const Segment& s, int64_t lo, int64_t hi,
               float scale) {
  const In* src = static_cast<const In*>(s.src) + lo;
  switch (s.dst_type) {
#define LB_CASE(T)                                                     \
  case DataTypeToEnum<T>::value:                                       \
    functor::Convert<Device, In, T>()(d, src, static_cast<T*>(s.dst) + lo, \
                                      hi - lo, scale);                 \
    break;
    LB_FUSION_FOR_EACH_TYPE(LB_CASE)
#undef LB_CASE
    default:
      break;  // Rejected by Supported() before any work starts.
  }
}

// Converts elements [lo, hi) of one segment.
template <typename Device>
void ConvertRange(const Device& d, const Segment& s, int64_t lo, int64_t hi,
                  float scale) {
  switch (s.src_type) {
#define LB_CASE(T)                                \
  case DataTypeToEnum<T>::value:                  \
    ConvertTo<Device, T>(d, s, lo, hi, scale);    \
    break;
    LB_FUSION_FOR_EACH_TYPE(LB_CASE)
#undef LB_CASE
    default:
      break;
  }
}

absl::Status CheckSegments(const std::vector<Segment>& segments) {
  for (const Segment& s : segments) {
    if (!Supported(s.src_type) || !Supported(s.dst_type)) {
      return errors::InvalidArgument(
          "dtypes must be float16, bfloat16, float32 or float64, got ",
          DataTypeString(s.src_type), " -> ", DataTypeString(s.dst_type));
    }
  }
  return absl::OkStatus();
}

// One sharded pass over all segments on the TensorFlow CPU threadpool.
void RunSegments(OpKernelContext* ctx, const CPUDevice&,
                 const std::vector<Segment>& segments, float scale) {
  std::vector<int64_t> starts(1, 0);
  for (const Segment& s : segments) starts.push_back(starts.back() + s.n);
  const int64_t total = starts.back();
  if (total == 0) return;
  auto work = [&](int64_t begin, int64_t end) {
    Eigen::DefaultDevice d;
    size_t i = std::upper_bound(starts.begin(), starts.end(), begin) -
               starts.begin() - 1;
    for (; i < segments.size() && starts[i] < end; ++i) {
      const int64_t lo = std::max(begin, starts[i]) - starts[i];
      const int64_t hi = std::min(end, starts[i + 1]) - starts[i];
      if (hi > lo) ConvertRange(d, segments[i], lo, hi, scale);
    }
  };
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, total, /*cost_per_unit=*/8,
        work);
}

#if GOOGLE_CUDA
void RunSegments(OpKernelContext* ctx, const GPUDevice& d,
                 const std::vector<Segment>& segments, float scale) {
  for (const Segment& s : segments) {
    if (s.n > 0) ConvertRange(d, s, 0, s.n, scale);
  }
}
#endif  // GOOGLE_CUDA

absl::Status ReadScale(OpKernelContext* ctx, float* scale) {
  const Tensor* t;
  TF_RETURN_IF_ERROR(ctx->input("scale", &t));
  if (!TensorShapeUtils::IsScalar(t->shape())) {
    return errors::InvalidArgument("`scale` must be a scalar, got shape ",
                                   t->shape().DebugString());
  }
  *scale = t->scalar<float>()();
  return absl::OkStatus();
}

}  // namespace

template <typename Device, typename Out>
class LbFusionPackOp : public OpKernel {
 public:
  explicit LbFusionPackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList tensors;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &tensors));
    float scale;
    OP_REQUIRES_OK(ctx, ReadScale(ctx, &scale));
    int64_t total = 0;
    for (int i = 0; i < tensors.size(); ++i) {
      total = AddWithoutOverflow(total, tensors[i].NumElements());
      OP_REQUIRES(ctx, total >= 0,
                  errors::InvalidArgument("total size overflows int64"));
    }
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &packed));
    Out* dst = packed->flat<Out>().data();
    std::vector<Segment> segments;
    for (int i = 0; i < tensors.size(); ++i) {
      const int64_t n = tensors[i].NumElements();
      segments.push_back({tensors[i].data(), tensors[i].dtype(), dst,
                          DataTypeToEnum<Out>::value, n});
      dst += n;
    }
    OP_REQUIRES_OK(ctx, CheckSegments(segments));
    RunSegments(ctx, ctx->eigen_device<Device>(), segments, scale);
  }
};

template <typename Device, typename In>
class LbFusionUnpackOp : public OpKernel {
 public:
  explicit LbFusionUnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shapes", &shapes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &dtypes_));
    OP_REQUIRES(ctx, shapes.size() == dtypes_.size(),
                errors::InvalidArgument(
                    "`shapes` and `Tout` must have the same length, got ",
                    shapes.size(), " and ", dtypes_.size()));
    for (const PartialTensorShape& partial : shapes) {
      OP_REQUIRES(ctx, partial.IsFullyDefined(),
                  errors::InvalidArgument(
                      "`shapes` must be fully defined and non-negative, got ",
                      partial.DebugString()));
      TensorShape shape;
      OP_REQUIRES_OK(ctx,
                     TensorShape::BuildTensorShape(partial.dim_sizes(), &shape));
      total_ = AddWithoutOverflow(total_, shape.num_elements());
      OP_REQUIRES(ctx, total_ >= 0,
                  errors::InvalidArgument("total size overflows int64"));
      shapes_.push_back(shape);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(packed.shape()),
                errors::InvalidArgument("`packed` must be 1-D, got shape ",
                                        packed.shape().DebugString()));
    OP_REQUIRES(ctx, packed.NumElements() == total_,
                errors::InvalidArgument(
                    "`packed` has ", packed.NumElements(),
                    " elements but `shapes` need ", total_));
    float scale;
    OP_REQUIRES_OK(ctx, ReadScale(ctx, &scale));
    const In* src = packed.flat<In>().data();
    std::vector<Segment> segments;
    for (size_t i = 0; i < shapes_.size(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shapes_[i], &out));
      const int64_t n = shapes_[i].num_elements();
      segments.push_back({src, DataTypeToEnum<In>::value, out->data(),
                          dtypes_[i], n});
      src += n;
    }
    OP_REQUIRES_OK(ctx, CheckSegments(segments));
    RunSegments(ctx, ctx->eigen_device<Device>(), segments, scale);
  }

 private:
  std::vector<TensorShape> shapes_;
  DataTypeVector dtypes_;
  int64_t total_ = 0;
};

#define LB_REGISTER_CPU(T)                                                \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("LbFusionPack").Device(DEVICE_CPU).TypeConstraint<T>("out_type"), \
      LbFusionPackOp<CPUDevice, T>);                                      \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("LbFusionUnpack").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
      LbFusionUnpackOp<CPUDevice, T>);
LB_FUSION_FOR_EACH_TYPE(LB_REGISTER_CPU)
#undef LB_REGISTER_CPU

#if GOOGLE_CUDA
#define LB_REGISTER_GPU(T)                                                 \
  REGISTER_KERNEL_BUILDER(Name("LbFusionPack")                             \
                              .Device(DEVICE_GPU)                          \
                              .HostMemory("scale")                         \
                              .TypeConstraint<T>("out_type"),              \
                          LbFusionPackOp<GPUDevice, T>);                   \
  REGISTER_KERNEL_BUILDER(Name("LbFusionUnpack")                           \
                              .Device(DEVICE_GPU)                          \
                              .HostMemory("scale")                         \
                              .TypeConstraint<T>("T"),                     \
                          LbFusionUnpackOp<GPUDevice, T>);
LB_FUSION_FOR_EACH_TYPE(LB_REGISTER_GPU)
#undef LB_REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace tensorflow
