#include "ps/optimizer.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

namespace pacer {
namespace {

// The kernels follow torch 1.13's CPU kernels operation by operation, so
// that a step is torch's to the bit on float32: `add_(x, alpha)` is
// fma(alpha, x, self), `addcmul_(a, b, value)` fma(value * a, b, self),
// `addcdiv_(a, b, value)` self + value * a / b, `mul_(s)` a product, and
// the scalars (bias corrections, step sizes) are computed in double and
// rounded to float once, as torch does with Python floats. Each kernel is
// one pass over its buffers: every value is read and written once.
//
// Built twice (target_clones): for x86-64-v3 (AVX2 and FMA, vectorised by
// the compiler) and a portable default, chosen at load time by the CPU;
// std::fma gives the same bits on both (the default's is slower).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define PACER_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PACER_KERNEL
#endif

struct SgdArgs {
  float lr, weight_decay, momentum, damp_alpha;
  bool nesterov, first;
};

PACER_KERNEL void SgdKernel(size_t n, const float* w_in, float* w_out, const float* b_in,
                            float* b_out, const float* grad, float gs, SgdArgs a) {
  const float neg_lr = -a.lr;
  for (size_t i = 0; i < n; ++i) {
    float d = grad[i] * gs;
    if (a.weight_decay != 0.0f) d = std::fma(a.weight_decay, w_in[i], d);
    if (a.momentum != 0.0f) {
      // The buffer starts as d (torch clones the first d_p).
      const float buf = a.first ? d : std::fma(a.damp_alpha, d, b_in[i] * a.momentum);
      b_out[i] = buf;
      d = a.nesterov ? std::fma(a.momentum, buf, d) : buf;
    } else {
      b_out[i] = b_in[i];
    }
    w_out[i] = std::fma(neg_lr, d, w_in[i]);
  }
}

struct AdamArgs {
  float weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, bias2_sqrt, eps;
  float neg_step_size, decay;  // decay: AdamW's 1 - lr * weight_decay (1: Adam)
  bool decoupled, amsgrad;
};

PACER_KERNEL void AdamKernel(size_t n, const float* w_in, float* w_out, const float* m_in,
                             float* m_out, const float* v_in, float* v_out, const float* x_in,
                             float* x_out, const float* grad, float gs, AdamArgs a) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i] * gs;
    if (!a.decoupled && a.weight_decay != 0.0f) g = std::fma(a.weight_decay, w_in[i], g);
    const float m = std::fma(a.one_minus_beta1, g, m_in[i] * a.beta1);
    const float v = std::fma(a.one_minus_beta2 * g, g, v_in[i] * a.beta2);
    m_out[i] = m;
    v_out[i] = v;
    float second = v;
    if (a.amsgrad) {
      second = std::max(x_in[i], v);
      x_out[i] = second;
    } else if (x_out != nullptr) {
      x_out[i] = x_in[i];
    }
    const float denom = std::sqrt(second) / a.bias2_sqrt + a.eps;
    const float w = a.decoupled ? w_in[i] * a.decay : w_in[i];
    w_out[i] = w + a.neg_step_size * m / denom;
  }
}

struct AdagradArgs {
  float weight_decay, neg_clr, eps;
};

PACER_KERNEL void AdagradKernel(size_t n, const float* w_in, float* w_out, const float* s_in,
                                float* s_out, const float* grad, float gs, AdagradArgs a) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i] * gs;
    if (a.weight_decay != 0.0f) g = std::fma(a.weight_decay, w_in[i], g);
    const float sum = std::fma(g, g, s_in[i]);
    s_out[i] = sum;
    w_out[i] = w_in[i] + a.neg_clr * g / (std::sqrt(sum) + a.eps);
  }
}

// A Python float's `1 - x` as torch hands it to a kernel.
float OneMinus(float x) { return static_cast<float>(1.0 - static_cast<double>(x)); }

// torch.optim.SGD: d = g + weight_decay * w; the momentum buffer starts as d
// (first step) and is then momentum * buf + (1 - dampening) * d; d is buf
// (or d + momentum * buf with nesterov); w -= lr * d.
class Sgd final : public Optimizer {
 public:
  OptimizerKind kind() const override { return OptimizerKind::kSgd; }
  size_t state_slots() const override { return 1; }
  std::string_view slot_name(size_t) const override { return "momentum_buffer"; }
  void Step(const BlockStep& b, const OptimizerSettings& s) const override {
    SgdKernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.grad, b.grad_scale,
              {b.lr, s.weight_decay, s.momentum, OneMinus(s.dampening), s.nesterov, b.step <= 1});
  }
};

// torch.optim.Adam and AdamW (1.13, single-tensor path): with step t,
//   g += weight_decay * w            (Adam)   w *= 1 - lr * weight_decay (AdamW)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//   vmax = max(vmax, v)              (amsgrad: v below is vmax)
//   w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class Adam final : public Optimizer {
 public:
  Adam(bool decoupled, bool amsgrad_slot) : decoupled_(decoupled), amsgrad_slot_(amsgrad_slot) {}
  OptimizerKind kind() const override {
    return decoupled_ ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
  }
  size_t state_slots() const override { return amsgrad_slot_ ? 3 : 2; }
  std::string_view slot_name(size_t slot) const override {
    return slot == 0 ? "exp_avg" : slot == 1 ? "exp_avg_sq" : "max_exp_avg_sq";
  }
  void Step(const BlockStep& b, const OptimizerSettings& s) const override {
    const double t = static_cast<double>(b.step);
    const double lr = b.lr;
    const double bias1 = 1.0 - std::pow(static_cast<double>(s.beta1), t);
    const double bias2 = 1.0 - std::pow(static_cast<double>(s.beta2), t);
    AdamArgs a;
    a.weight_decay = s.weight_decay;
    a.beta1 = s.beta1;
    a.beta2 = s.beta2;
    a.one_minus_beta1 = OneMinus(s.beta1);
    a.one_minus_beta2 = OneMinus(s.beta2);
    a.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    a.eps = s.eps;
    a.neg_step_size = static_cast<float>(-(lr / bias1));
    a.decay = static_cast<float>(1.0 - lr * static_cast<double>(s.weight_decay));
    a.decoupled = decoupled_;
    a.amsgrad = s.amsgrad && amsgrad_slot_;
    AdamKernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.state_in[1], b.state_out[1],
               amsgrad_slot_ ? b.state_in[2] : nullptr, amsgrad_slot_ ? b.state_out[2] : nullptr,
               b.grad, b.grad_scale, a);
  }

 private:
  const bool decoupled_;
  const bool amsgrad_slot_;
};

// torch.optim.Adagrad: with step t, g += weight_decay * w;
//   clr = lr / (1 + (t - 1) * lr_decay); sum += g * g;
//   w -= clr * g / (sqrt(sum) + eps)
class Adagrad final : public Optimizer {
 public:
  OptimizerKind kind() const override { return OptimizerKind::kAdagrad; }
  size_t state_slots() const override { return 1; }
  std::string_view slot_name(size_t) const override { return "sum"; }
  float InitialState(size_t, const OptimizerSettings& s) const override {
    return s.initial_accumulator_value;
  }
  void Step(const BlockStep& b, const OptimizerSettings& s) const override {
    const double clr = static_cast<double>(b.lr) / (1.0 + (static_cast<double>(b.step) - 1.0) *
                                                              static_cast<double>(s.lr_decay));
    AdagradKernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.grad, b.grad_scale,
                  {s.weight_decay, static_cast<float>(-clr), s.eps});
  }
};

}  // namespace

float Optimizer::InitialState(size_t, const OptimizerSettings&) const { return 0.0f; }

std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, bool amsgrad_slot) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return std::make_unique<Adam>(false, amsgrad_slot);
    case OptimizerKind::kAdamW:
      return std::make_unique<Adam>(true, amsgrad_slot);
    case OptimizerKind::kAdagrad:
      return std::make_unique<Adagrad>();
    case OptimizerKind::kSgd:
      break;
  }
  return std::make_unique<Sgd>();
}

void Accumulate(std::span<float> acc, std::span<const float> g, float scale) {
  using Vec = Eigen::Map<Eigen::ArrayXf>;
  using CVec = Eigen::Map<const Eigen::ArrayXf>;
  Vec(acc.data(), static_cast<Eigen::Index>(acc.size())) +=
      scale * CVec(g.data(), static_cast<Eigen::Index>(g.size()));
}

}  // namespace pacer
