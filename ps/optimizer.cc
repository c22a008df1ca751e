#include "ps/optimizer.h"

#include <Eigen/Core>

namespace pacer {
namespace {
using Vec = Eigen::Map<Eigen::ArrayXf>;
using CVec = Eigen::Map<const Eigen::ArrayXf>;
}  // namespace

void Accumulate(std::span<float> acc, std::span<const float> g, float scale) {
  Vec a(acc.data(), static_cast<Eigen::Index>(acc.size()));
  a += scale * CVec(g.data(), static_cast<Eigen::Index>(g.size()));
}

void SgdMomentumStep(std::span<float> w, std::span<float> v, std::span<const float> g,
                     const SgdOptions& options, float scale) {
  const auto n = static_cast<Eigen::Index>(w.size());
  Vec wv(w.data(), n), vv(v.data(), n);
  CVec gv(g.data(), n);
  vv = options.momentum * vv + scale * gv;
  wv -= options.learning_rate * vv;
}

void SgdMomentumStepFrom(std::span<float> w, std::span<float> v, const float* w_in,
                         const float* v_in, std::span<const float> g, const SgdOptions& options,
                         float scale) {
  const auto n = static_cast<Eigen::Index>(w.size());
  Vec wv(w.data(), n), vv(v.data(), n);
  CVec wi(w_in, n), vi(v_in, n), gv(g.data(), n);
  vv = options.momentum * vi + scale * gv;
  wv = wi - options.learning_rate * vv;
}

}  // namespace pacer
