// Server-side optimizer math: pure functions on spans, vectorised by Eigen.
#ifndef PACER_PS_OPTIMIZER_H_
#define PACER_PS_OPTIMIZER_H_

#include <span>

namespace pacer {

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.9f;
};

// acc += scale * g. Sizes must match.
void Accumulate(std::span<float> acc, std::span<const float> g, float scale);

// SGD with momentum, PyTorch's form: v = momentum * v + scale * g;
// w -= lr * v. Sizes must match.
void SgdMomentumStep(std::span<float> w, std::span<float> v, std::span<const float> g,
                     const SgdOptions& options, float scale = 1.0f);

// The same step read from (w_in, v_in) and written to (w, v): the shard steps
// into fresh buffers while a reply or a checkpoint still holds the old ones,
// with no copy first. The inputs may be w and v themselves (in place).
void SgdMomentumStepFrom(std::span<float> w, std::span<float> v, const float* w_in,
                         const float* v_in, std::span<const float> g, const SgdOptions& options,
                         float scale = 1.0f);

}  // namespace pacer

#endif  // PACER_PS_OPTIMIZER_H_
