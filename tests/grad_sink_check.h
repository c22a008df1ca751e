// Checks a backend's layer-by-layer gradient reports (GradientSink): every
// stage of BackwardStages is reported once, in order, and the values in
// its range when reported are already the final ones. Shared by the CPU,
// CNN and CUDA backend tests.
#ifndef PACER_TESTS_GRAD_SINK_CHECK_H_
#define PACER_TESTS_GRAD_SINK_CHECK_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "worker/builtin/backend.h"

namespace pacer::worker {

class RecordingSink : public GradientSink {
 public:
  RecordingSink(std::span<const float> grad, std::vector<GradRange> stages)
      : grad_(grad), stages_(std::move(stages)) {}
  void Ready(size_t stage) override {
    order.push_back(stage);
    if (stage >= stages_.size()) return;
    const GradRange r = stages_[stage];
    seen.emplace_back(grad_.begin() + static_cast<long>(r.begin),
                      grad_.begin() + static_cast<long>(r.end));
  }
  std::vector<size_t> order;
  std::vector<std::vector<float>> seen;  // per report: the range's values then

 private:
  std::span<const float> grad_;
  std::vector<GradRange> stages_;
};

// `grad` (num_params floats, the backend's own host memory or not) is
// filled with NaN first, so a stage reported before it is written fails.
inline void CheckGradientStages(ComputeBackend& backend, std::span<const float> params,
                                const float* x, const uint8_t* y, int batch, std::span<float> grad) {
  const std::vector<GradRange> stages = BackwardStages(backend.tensors());
  ASSERT_GE(stages.size(), 2u);
  // The stages cover the vector, last layer first.
  EXPECT_EQ(stages.front().end, backend.num_params());
  EXPECT_EQ(stages.back().begin, 0u);
  for (size_t s = 1; s < stages.size(); ++s) EXPECT_EQ(stages[s].end, stages[s - 1].begin);

  std::vector<float> plain(backend.num_params());
  const float loss_plain = backend.ComputeGradient(params, x, y, batch, plain);
  std::fill(grad.begin(), grad.end(), std::numeric_limits<float>::quiet_NaN());
  RecordingSink sink(grad, stages);
  const float loss = backend.ComputeGradient(params, x, y, batch, grad, &sink);
  EXPECT_EQ(loss, loss_plain);
  ASSERT_EQ(sink.order.size(), stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    ASSERT_EQ(sink.order[s], s) << "stages out of order";
    const GradRange r = stages[s];
    bool same = true;
    for (size_t i = r.begin; i < r.end; ++i) {
      same &= sink.seen[s][i - r.begin] == grad[i] && grad[i] == plain[i];
    }
    EXPECT_TRUE(same) << "stage " << s << " [" << r.begin << ", " << r.end
                      << ") was reported before its final values were there";
  }
}

}  // namespace pacer::worker

#endif  // PACER_TESTS_GRAD_SINK_CHECK_H_
