// Built with EIGEN_USE_BLAS (see worker/builtin/compute.cmake): every Eigen matrix
// product below becomes an sgemm_ call into OpenBLAS. Eigen types never appear
// in a public header, so other translation units cannot see a different
// definition of them.

#include "worker/builtin/cpu_backend.h"
#include "worker/builtin/cpu_loss.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace pacer::worker {
namespace {

using RowMat =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Evaluate's chunk: bounds scratch to kEvalChunk x (sum of widths) floats.
constexpr size_t kEvalChunk = 1000;

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(std::vector<int> layers) : layers_(std::move(layers)) {
    // Process-wide: the worker gets its parallelism from many workers, and
    // OpenBLAS threads would fight them for cores.
    openblas_set_num_threads(1);
    ModelSpec spec;
    spec.mlp.layers = layers_;
    tensors_ = ModelTensors(spec);
    size_t offset = 0;
    for (size_t k = 1; k < layers_.size(); ++k) {
      const size_t in = layers_[k - 1], out = layers_[k];
      w_offset_.push_back(offset);
      offset += out * in;
      b_offset_.push_back(offset);
      offset += out;
    }
    num_params_ = offset;
    max_width_ = *std::max_element(layers_.begin(), layers_.end());
    acts_.resize(num_layers());
  }

  std::string name() const override { return "cpu"; }
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  size_t num_params() const override { return num_params_; }

  void InitParams(uint64_t seed, std::span<float> params) const override {
    InitTensors(tensors_, seed, params);
  }

  using ComputeBackend::ComputeGradient;
  float ComputeGradient(std::span<const float> params, const float* x,
                        const uint8_t* y, int batch, std::span<float> grad,
                        GradientSink* sink) override {
    if (batch <= 0 || x == nullptr || y == nullptr ||
        params.size() != num_params_ || grad.size() != num_params_ ||
        !LabelsValid(y, static_cast<size_t>(batch))) {
      return kNaN;
    }
    const Eigen::Index rows = batch;
    const size_t num_l = num_layers();
    EnsureScratch(rows);
    Forward(params, x, rows);

    // Softmax cross-entropy, turning the logits in place into
    // dLoss/dLogits = (softmax - onehot) / batch.
    const double loss = cpu::SoftmaxXentBackward(acts_[num_l - 1].data(), rows, layers_.back(), y,
                                                 1.0f / static_cast<float>(batch));

    // Walk back through the layers. acts_[k] holds dLoss/dZ of layer k once
    // we get to it (the ReLU mask is applied in place), so no extra buffer per
    // layer is needed, only delta_tmp_ for dLoss/dA.
    for (size_t k = num_l; k-- > 0;) {
      const Eigen::Index in = layers_[k], out = layers_[k + 1];
      ConstMatMap dz(acts_[k].data(), rows, out);
      ConstMatMap a_prev(k == 0 ? x : acts_[k - 1].data(), rows, in);
      MatMap grad_w(grad.data() + w_offset_[k], out, in);
      VecMap grad_b(grad.data() + b_offset_[k], out);
      grad_w.noalias() = dz.transpose() * a_prev;
      grad_b.noalias() = dz.colwise().sum().transpose();
      if (sink != nullptr) sink->Ready(num_l - 1 - k);  // layer k is stage L-1-k
      if (k == 0) break;
      ConstMatMap w(params.data() + w_offset_[k], out, in);
      MatMap da(delta_tmp_.data(), rows, in);
      da.noalias() = dz * w;
      MatMap a(acts_[k - 1].data(), rows, in);
      a.array() = (a.array() > 0.0f).select(da.array(), 0.0f);
    }
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  EvalResult Evaluate(std::span<const float> params, const float* x,
                      const uint8_t* y, size_t n) override {
    if (n == 0) return {};
    if (x == nullptr || y == nullptr || params.size() != num_params_ ||
        !LabelsValid(y, n)) {
      return {kNaN, kNaN, 0};
    }
    const size_t in = layers_.front();
    const Eigen::Index classes = layers_.back();
    double loss = 0;
    size_t correct = 0;
    EnsureScratch(static_cast<Eigen::Index>(std::min(n, kEvalChunk)));
    for (size_t start = 0; start < n; start += kEvalChunk) {
      const auto rows =
          static_cast<Eigen::Index>(std::min(kEvalChunk, n - start));
      Forward(params, x + start * in, rows);
      cpu::ScoreLogits(acts_.back().data(), rows, classes, y + start, &loss, &correct);
    }
    const auto total = static_cast<double>(n);
    return {static_cast<double>(correct) / total, loss / total, n};
  }

 private:
  size_t num_layers() const { return layers_.size() - 1; }

  bool LabelsValid(const uint8_t* y, size_t n) const {
    const int classes = layers_.back();
    return std::all_of(y, y + n, [classes](uint8_t l) { return l < classes; });
  }

  // Grows the scratch buffers to hold `rows` samples; never shrinks them, so
  // steady-state calls allocate nothing.
  void EnsureScratch(Eigen::Index rows) {
    const auto r = static_cast<size_t>(rows);
    if (r <= scratch_rows_) return;
    for (size_t k = 0; k < num_layers(); ++k) {
      acts_[k].resize(r * static_cast<size_t>(layers_[k + 1]));
    }
    delta_tmp_.resize(r * static_cast<size_t>(max_width_));
    scratch_rows_ = r;
  }

  // acts_[k] = layer k's output for `rows` samples starting at x: ReLU(Z) for
  // hidden layers, the raw logits for the last one.
  void Forward(std::span<const float> params, const float* x,
               Eigen::Index rows) {
    const float* input = x;
    for (size_t k = 0; k < num_layers(); ++k) {
      const Eigen::Index in = layers_[k], out = layers_[k + 1];
      ConstMatMap a_in(input, rows, in);
      ConstMatMap w(params.data() + w_offset_[k], out, in);
      ConstVecMap b(params.data() + b_offset_[k], out);
      MatMap z(acts_[k].data(), rows, out);
      // Start from the bias so the GEMM accumulates onto it (beta = 1) instead
      // of a separate zero pass plus a bias pass.
      z.rowwise() = b.transpose();
      z.noalias() += a_in * w.transpose();
      if (k + 1 < num_layers()) z = z.cwiseMax(0.0f);
      input = acts_[k].data();
    }
  }

  // Constant after construction.
  const std::vector<int> layers_;
  std::vector<TensorSpec> tensors_;
  std::vector<size_t> w_offset_;  // Per layer: offset of fcK.weight.
  std::vector<size_t> b_offset_;  // Per layer: offset of fcK.bias.
  size_t num_params_ = 0;
  int max_width_ = 0;

  // Scratch, reused across calls (hence not thread-safe).
  size_t scratch_rows_ = 0;
  // acts_[k]: scratch_rows_ x layers_[k + 1], layer k's output, then dLoss/dZ.
  std::vector<std::vector<float>> acts_;
  std::vector<float> delta_tmp_;  // scratch_rows_ x max_width_: dLoss/dA.
};

}  // namespace

std::unique_ptr<ComputeBackend> MakeCpuBackend(const MlpSpec& spec) {
  if (spec.layers.size() < 2) return nullptr;
  for (int width : spec.layers) {
    if (width <= 0) return nullptr;
  }
  return std::make_unique<CpuBackend>(spec.layers);
}

std::unique_ptr<ComputeBackend> MakeCpuBackend(const ModelSpec& spec) {
  if (spec.kind == ModelSpec::Kind::kCnn) return MakeCpuCnnBackend(spec.cnn);
  return MakeCpuBackend(spec.mlp);
}

}  // namespace pacer::worker
