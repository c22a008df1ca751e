// The CNN of worker/builtin/backend.h (CnnSpec) on the CPU. Convolutions are im2col
// followed by one GEMM over the whole chunk (Eigen, with EIGEN_USE_BLAS:
// OpenBLAS sgemm). Activations are kept pixel-major (rows: sample x pixel,
// columns: channels), which makes every convolution, bias and ReLU a
// row-major matrix operation; only the flatten before the fully connected
// layer reorders to PyTorch's channel-major order.
//
// A batch is processed in chunks of kChunk samples; the gradients of the
// chunks add up (each is already divided by the whole batch), so scratch
// memory depends on kChunk, not on the batch.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/builtin/cpu_backend.h"
#include "worker/builtin/cpu_loss.h"

extern "C" void openblas_set_num_threads(int);

namespace pacer::worker {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kSide = kCnnImageSide;  // 28
constexpr int kHalf = kSide / 2;      // 14, after the first pool
constexpr int kQuarter = kSide / 4;   // 7, after the second
constexpr int kK = kCnnKernel;        // 5
constexpr int kPad = kK / 2;          // 2
constexpr int kK2 = kK * kK;
constexpr int kChunk = 64;

// im2col for one 'same' 5x5 convolution: rows are (sample, y, x) of a
// side x side image with `ch` channels stored pixel-major (in[(s * side *
// side + y * side + x) * ch + c]); columns are (c, ky, kx), matching an OIHW
// weight row. Out-of-image taps are 0.
void Im2Col(const float* in, int n, int side, int ch, float* cols) {
  const int width = ch * kK2;
  for (int s = 0; s < n; ++s) {
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        float* row = cols + (static_cast<size_t>(s) * side * side + y * side + x) * width;
        for (int c = 0; c < ch; ++c) {
          for (int ky = 0; ky < kK; ++ky) {
            const int iy = y + ky - kPad;
            for (int kx = 0; kx < kK; ++kx) {
              const int ix = x + kx - kPad;
              const bool inside = iy >= 0 && iy < side && ix >= 0 && ix < side;
              row[c * kK2 + ky * kK + kx] =
                  inside ? in[(static_cast<size_t>(s) * side * side + iy * side + ix) * ch + c] : 0.0f;
            }
          }
        }
      }
    }
  }
}

// The transpose of Im2Col: adds each column entry back onto the input pixel
// it was copied from (`din` must be zeroed first).
void Col2Im(const float* cols, int n, int side, int ch, float* din) {
  const int width = ch * kK2;
  for (int s = 0; s < n; ++s) {
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        const float* row = cols + (static_cast<size_t>(s) * side * side + y * side + x) * width;
        for (int c = 0; c < ch; ++c) {
          for (int ky = 0; ky < kK; ++ky) {
            const int iy = y + ky - kPad;
            if (iy < 0 || iy >= side) continue;
            for (int kx = 0; kx < kK; ++kx) {
              const int ix = x + kx - kPad;
              if (ix < 0 || ix >= side) continue;
              din[(static_cast<size_t>(s) * side * side + iy * side + ix) * ch + c] +=
                  row[c * kK2 + ky * kK + kx];
            }
          }
        }
      }
    }
  }
}

// 2x2 max pool, stride 2, of pixel-major `in` (side x side, ch channels) into
// `out` (side/2 x side/2); `arg` gets, per output element, the index into
// `in` of the maximum (the first one on ties).
void MaxPool(const float* in, int n, int side, int ch, float* out, int32_t* arg) {
  const int half = side / 2;
  for (int s = 0; s < n; ++s) {
    for (int py = 0; py < half; ++py) {
      for (int px = 0; px < half; ++px) {
        const size_t o = (static_cast<size_t>(s) * half * half + py * half + px) * ch;
        for (int c = 0; c < ch; ++c) {
          int32_t best = -1;
          float m = 0;
          for (int dy = 0; dy < 2; ++dy) {
            for (int dx = 0; dx < 2; ++dx) {
              const auto i = static_cast<int32_t>(
                  (static_cast<size_t>(s) * side * side + (2 * py + dy) * side + 2 * px + dx) * ch + c);
              if (best < 0 || in[i] > m) {
                best = i;
                m = in[i];
              }
            }
          }
          out[o + c] = m;
          arg[o + c] = best;
        }
      }
    }
  }
}

class CpuCnnBackend final : public ComputeBackend {
 public:
  explicit CpuCnnBackend(const CnnSpec& spec)
      : c1_(spec.conv1), c2_(spec.conv2), classes_(spec.classes) {
    openblas_set_num_threads(1);  // as the MLP backend: parallelism is across workers
    ModelSpec m;
    m.kind = ModelSpec::Kind::kCnn;
    m.cnn = spec;
    tensors_ = ModelTensors(m);
    size_t offset = 0;
    for (const TensorSpec& t : tensors_) {
      offsets_.push_back(offset);
      offset += t.size;
    }
    num_params_ = offset;
    flat_ = c2_ * kQuarter * kQuarter;
  }

  std::string name() const override { return "cpu"; }
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  size_t num_params() const override { return num_params_; }

  void InitParams(uint64_t seed, std::span<float> params) const override {
    InitTensors(tensors_, seed, params);
  }

  using ComputeBackend::ComputeGradient;
  float ComputeGradient(std::span<const float> params, const float* x, const uint8_t* y, int batch,
                        std::span<float> grad, GradientSink* sink) override {
    if (batch <= 0 || x == nullptr || y == nullptr || params.size() != num_params_ ||
        grad.size() != num_params_ || !LabelsValid(y, static_cast<size_t>(batch))) {
      return kNaN;
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    EnsureScratch(std::min(batch, kChunk));
    const float inv_batch = 1.0f / static_cast<float>(batch);
    double loss = 0;
    for (int start = 0; start < batch; start += kChunk) {
      const int n = std::min(kChunk, batch - start);
      const float* xs = x + static_cast<size_t>(start) * kSide * kSide;
      Forward(params, xs, n);
      // dLoss/dLogits = (softmax - onehot) / batch, in place.
      loss += cpu::SoftmaxXentBackward(logits_.data(), n, classes_, y + start, inv_batch);
      // Only the last chunk's backward pass finishes each layer's sum.
      Backward(params, n, grad, start + n == batch ? sink : nullptr);
    }
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  EvalResult Evaluate(std::span<const float> params, const float* x, const uint8_t* y,
                      size_t n) override {
    if (n == 0) return {};
    if (x == nullptr || y == nullptr || params.size() != num_params_ || !LabelsValid(y, n)) {
      return {kNaN, kNaN, 0};
    }
    EnsureScratch(static_cast<int>(std::min<size_t>(n, kChunk)));
    double loss = 0;
    size_t correct = 0;
    for (size_t start = 0; start < n; start += kChunk) {
      const int rows = static_cast<int>(std::min<size_t>(kChunk, n - start));
      Forward(params, x + start * kSide * kSide, rows);
      cpu::ScoreLogits(logits_.data(), rows, classes_, y + start, &loss, &correct);
    }
    const auto total = static_cast<double>(n);
    return {static_cast<double>(correct) / total, loss / total, n};
  }

 private:
  bool LabelsValid(const uint8_t* y, size_t n) const {
    return std::all_of(y, y + n, [this](uint8_t l) { return l < classes_; });
  }

  const float* P(std::span<const float> params, size_t tensor) const {
    return params.data() + offsets_[tensor];
  }

  // Grows the scratch to `n` samples; never shrinks.
  void EnsureScratch(int n) {
    if (n <= scratch_) return;
    const auto r = static_cast<size_t>(n);
    const size_t p1 = kSide * kSide, p2 = kHalf * kHalf, p3 = kQuarter * kQuarter;
    cols1_.resize(r * p1 * kK2);
    z1_.resize(r * p1 * c1_);
    a1_.resize(r * p2 * c1_);
    da1_.resize(r * p2 * c1_);
    arg1_.resize(r * p2 * c1_);
    cols2_.resize(r * p2 * c1_ * kK2);
    z2_.resize(r * p2 * c2_);
    a2_.resize(r * p3 * c2_);
    arg2_.resize(r * p3 * c2_);
    flat_act_.resize(r * flat_);
    logits_.resize(r * classes_);
    dflat_.resize(r * flat_);
    scratch_ = n;
  }

  // Fills the activations for n samples at x; logits_ holds the output.
  void Forward(std::span<const float> params, const float* x, int n) {
    const Eigen::Index rows1 = static_cast<Eigen::Index>(n) * kSide * kSide;
    const Eigen::Index rows2 = static_cast<Eigen::Index>(n) * kHalf * kHalf;
    // conv1 + ReLU + pool.
    Im2Col(x, n, kSide, 1, cols1_.data());
    MatMap z1(z1_.data(), rows1, c1_);
    z1.rowwise() = ConstVecMap(P(params, 1), c1_).transpose();
    z1.noalias() += ConstMatMap(cols1_.data(), rows1, kK2) *
                    ConstMatMap(P(params, 0), c1_, kK2).transpose();
    z1 = z1.cwiseMax(0.0f);
    MaxPool(z1_.data(), n, kSide, c1_, a1_.data(), arg1_.data());
    // conv2 + ReLU + pool.
    Im2Col(a1_.data(), n, kHalf, c1_, cols2_.data());
    MatMap z2(z2_.data(), rows2, c2_);
    z2.rowwise() = ConstVecMap(P(params, 3), c2_).transpose();
    z2.noalias() += ConstMatMap(cols2_.data(), rows2, c1_ * kK2) *
                    ConstMatMap(P(params, 2), c2_, c1_ * kK2).transpose();
    z2 = z2.cwiseMax(0.0f);
    MaxPool(z2_.data(), n, kHalf, c2_, a2_.data(), arg2_.data());
    // Flatten channel-major, then fc.
    const int p3 = kQuarter * kQuarter;
    for (int s = 0; s < n; ++s) {
      for (int p = 0; p < p3; ++p) {
        for (int c = 0; c < c2_; ++c) {
          flat_act_[static_cast<size_t>(s) * flat_ + c * p3 + p] =
              a2_[(static_cast<size_t>(s) * p3 + p) * c2_ + c];
        }
      }
    }
    MatMap logits(logits_.data(), n, classes_);
    logits.rowwise() = ConstVecMap(P(params, 5), classes_).transpose();
    logits.noalias() += ConstMatMap(flat_act_.data(), n, flat_) *
                        ConstMatMap(P(params, 4), classes_, flat_).transpose();
  }

  // With logits_ holding dLoss/dLogits for the n samples of the last
  // Forward: adds their gradient to `grad`. Reuses forward buffers: z2_ and
  // z1_ become dLoss/dZ, cols2_ becomes dLoss/dcols2.
  // Adds n samples' gradient into grad; tells `sink` (when not null) as
  // each layer's sum is complete: fc (stage 0), conv2 (1), conv1 (2).
  void Backward(std::span<const float> params, int n, std::span<float> grad, GradientSink* sink) {
    const Eigen::Index rows1 = static_cast<Eigen::Index>(n) * kSide * kSide;
    const Eigen::Index rows2 = static_cast<Eigen::Index>(n) * kHalf * kHalf;
    const int p3 = kQuarter * kQuarter;
    ConstMatMap dlogits(logits_.data(), n, classes_);
    // fc.
    MatMap(grad.data() + offsets_[4], classes_, flat_).noalias() +=
        dlogits.transpose() * ConstMatMap(flat_act_.data(), n, flat_);
    VecMap(grad.data() + offsets_[5], classes_) += dlogits.colwise().sum().transpose();
    if (sink != nullptr) sink->Ready(0);
    MatMap dflat(dflat_.data(), n, flat_);
    dflat.noalias() = dlogits * ConstMatMap(P(params, 4), classes_, flat_);
    // pool2 and ReLU2 back into dZ2 (in z2_): only the maximum of each
    // window gets a gradient, and only where it passed the ReLU (the pooled
    // value, that maximum after ReLU, is > 0).
    MatMap z2(z2_.data(), rows2, c2_);
    z2.setZero();
    for (int s = 0; s < n; ++s) {
      for (int p = 0; p < p3; ++p) {
        for (int c = 0; c < c2_; ++c) {
          const size_t o = (static_cast<size_t>(s) * p3 + p) * c2_ + c;
          if (a2_[o] > 0.0f) {
            z2_[static_cast<size_t>(arg2_[o])] += dflat_[static_cast<size_t>(s) * flat_ + c * p3 + p];
          }
        }
      }
    }
    // conv2.
    MatMap(grad.data() + offsets_[2], c2_, c1_ * kK2).noalias() +=
        z2.transpose() * ConstMatMap(cols2_.data(), rows2, c1_ * kK2);
    VecMap(grad.data() + offsets_[3], c2_) += z2.colwise().sum().transpose();
    if (sink != nullptr) sink->Ready(1);
    MatMap dcols2(cols2_.data(), rows2, c1_ * kK2);
    dcols2.noalias() = z2 * ConstMatMap(P(params, 2), c2_, c1_ * kK2);
    // Back to the pooled conv1 output: dLoss/dA1.
    std::fill(da1_.begin(), da1_.begin() + rows2 * c1_, 0.0f);
    Col2Im(cols2_.data(), n, kHalf, c1_, da1_.data());
    // pool1 and ReLU1 back into dZ1 (in z1_), as for pool2.
    MatMap z1(z1_.data(), rows1, c1_);
    z1.setZero();
    for (size_t o = 0; o < static_cast<size_t>(rows2 * c1_); ++o) {
      if (a1_[o] > 0.0f) z1_[static_cast<size_t>(arg1_[o])] += da1_[o];
    }
    // conv1.
    MatMap(grad.data() + offsets_[0], c1_, kK2).noalias() +=
        z1.transpose() * ConstMatMap(cols1_.data(), rows1, kK2);
    VecMap(grad.data() + offsets_[1], c1_) += z1.colwise().sum().transpose();
    if (sink != nullptr) sink->Ready(2);
  }

  // Constant after construction.
  const int c1_, c2_, classes_;
  int flat_ = 0;  // c2 * 7 * 7
  std::vector<TensorSpec> tensors_;
  std::vector<size_t> offsets_;  // of each tensor, in tensors_ order
  size_t num_params_ = 0;

  // Scratch for scratch_ samples, reused across calls (not thread-safe).
  int scratch_ = 0;
  std::vector<float> cols1_, z1_, a1_, da1_, cols2_, z2_, a2_, flat_act_, logits_, dflat_;
  std::vector<int32_t> arg1_, arg2_;
};

}  // namespace

std::unique_ptr<ComputeBackend> MakeCpuCnnBackend(const CnnSpec& spec) {
  if (spec.conv1 <= 0 || spec.conv2 <= 0 || spec.classes <= 0 || spec.classes > 256) return nullptr;
  return std::make_unique<CpuCnnBackend>(spec);
}

}  // namespace pacer::worker
