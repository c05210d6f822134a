// Op registration and shape functions for the tensor-fusion pack/unpack ops.
//
// Element rule (both ops): y = cast<Out>(cast<C>(x) * cast<C>(scale)), with
// C = double when the input and the output are both double, float otherwise;
// when scale == 1 there is no multiply (y = cast<Out>(cast<C>(x)), a copy for
// equal dtypes). Casts round to nearest even, as tf.cast does. The Python
// fallback in keras_largebatch/distribute/native.py follows the same rule.

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

#ifndef LB_TF_VERSION
#define LB_TF_VERSION "unknown"
#endif

// Read from the binary by keras_largebatch.distribute.native when loading
// fails, to name the TensorFlow the library was built for.
extern "C" __attribute__((used, visibility("default"))) const char
    lb_fusion_built_for[] = "LB_BUILT_FOR_TF=" LB_TF_VERSION ";";

REGISTER_OP("LbFusionPack")
    .Input("tensors: Tin")
    .Input("scale: float")
    .Output("packed: out_type")
    .Attr("Tin: list({half, bfloat16, float, double}) >= 0")
    .Attr("out_type: {half, bfloat16, float, double}")
    .SetShapeFn([](InferenceContext* c) {
      const int n = c->num_inputs() - 1;
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n), 0, &unused));
      DimensionHandle total = c->MakeDim(0);
      for (int i = 0; i < n; ++i) {
        TF_RETURN_IF_ERROR(
            c->Add(total, c->NumElements(c->input(i)), &total));
      }
      c->set_output(0, c->Vector(total));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Flattens N tensors into one 1-D buffer of `out_type`, scaled by `scale`.
)doc");

REGISTER_OP("LbFusionUnpack")
    .Input("packed: T")
    .Input("scale: float")
    .Output("outputs: Tout")
    .Attr("T: {half, bfloat16, float, double}")
    .Attr("Tout: list({half, bfloat16, float, double}) >= 0")
    .Attr("shapes: list(shape) >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return errors::InvalidArgument(
            "`shapes` and `Tout` must have the same length, got ",
            shapes.size(), " and ", c->num_outputs());
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(
            c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(i, out);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Splits a 1-D buffer into tensors of `shapes` and `Tout`, scaled by `scale`.
)doc");

}  // namespace tensorflow
