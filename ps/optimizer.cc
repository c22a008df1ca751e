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
// Built three times (target_clones): for x86-64-v4 (AVX-512), x86-64-v3
// (AVX2 and FMA), both vectorised by the compiler, and a portable default,
// chosen at load time by the CPU; std::fma gives the same bits on each (the
// default's is slower). The variants (AdamW or Adam, amsgrad) are template
// arguments: a branch inside a loop keeps GCC from vectorising it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define PACER_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
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

// SGD on a fraction f < 1 of a full step (BlockStep::fraction): the buffer
// decays by momentum^f; weight decay weighs f; the update takes c(f) of the
// old buffer plus this step's own gradient (already f-scaled by grad_scale):
//   buf' = mu^f buf + (1 - dampening) d
//   p = c buf + (1 - dampening) d;  u = p  (nesterov: u = d + mu p);  w -= lr u
//   c(f) = mu (1 - mu^f) / (1 - mu)
// c(1) = mu and p = buf': torch's step, which SgdKernel keeps with torch's
// arithmetic. With this c, steps whose fractions add up to F coast (no
// gradient) as far as F full steps, however the F is cut (the coasts
// mu^S c(f) telescope), and under a constant gradient they keep torch's
// steady pace; as f goes to 0 the step goes to nothing, where scaling only
// the gradient would still move the weights by lr mu buf.
struct SgdFractionArgs {
  float lr, weight_decay, momentum, decay, coast, damp_alpha;
  bool nesterov, first;
};

PACER_KERNEL void SgdFractionKernel(size_t n, const float* w_in, float* w_out, const float* b_in,
                                    float* b_out, const float* grad, float gs,
                                    SgdFractionArgs a) {
  const float neg_lr = -a.lr;
  for (size_t i = 0; i < n; ++i) {
    float d = grad[i] * gs;
    if (a.weight_decay != 0.0f) d = std::fma(a.weight_decay, w_in[i], d);
    float u = d;
    if (a.momentum != 0.0f) {
      const float old = b_in[i];  // b_in may be b_out (in place)
      float p = d;
      if (a.first) {
        b_out[i] = d;  // torch clones the first d_p
      } else {
        const float own = a.damp_alpha * d;
        b_out[i] = std::fma(a.decay, old, own);
        p = std::fma(a.coast, old, own);
      }
      u = a.nesterov ? std::fma(a.momentum, p, d) : p;
    } else {
      b_out[i] = b_in[i];
    }
    w_out[i] = std::fma(neg_lr, u, w_in[i]);
  }
}

struct AdamArgs {
  float weight_decay, beta1, beta2, one_minus_beta1, one_minus_beta2, bias2_sqrt, eps;
  float neg_step_size, decay;  // decay: AdamW's 1 - lr * weight_decay (1: Adam)
  bool decoupled, amsgrad;
};

// One value of an Adam or AdamW step: (w, m, v, max v) from the old ones.
// The variants are template arguments, so that each loop has no branch and
// the compiler vectorises it. Adam's weight decay is added even when it is
// 0 (g + 0 * w is g), AdamW's decay multiplied even when it is 1: the same
// values as torch's `if weight_decay != 0`.
struct AdamValue {
  float w, m, v, x;
};
template <bool kDecoupled, bool kAmsgrad>
[[gnu::always_inline]] inline AdamValue AdamElement(float w_in, float m_in, float v_in,
                                                    float x_in, float grad, float gs,
                                                    const AdamArgs& a) {
  float g = grad * gs;
  if constexpr (!kDecoupled) g = std::fma(a.weight_decay, w_in, g);
  const float m = std::fma(a.one_minus_beta1, g, m_in * a.beta1);
  const float v = std::fma(a.one_minus_beta2 * g, g, v_in * a.beta2);
  float x = x_in, second = v;
  if constexpr (kAmsgrad) second = x = std::max(x_in, v);
  const float denom = std::sqrt(second) / a.bias2_sqrt + a.eps;
  float w = w_in;
  if constexpr (kDecoupled) w = w_in * a.decay;
  return {w + a.neg_step_size * m / denom, m, v, x};
}

// In place (nobody else holds the buffers), or from old buffers into fresh
// ones (a reply or snapshot holds the old): each buffer through restrict
// pointers, distinct buffers, so the compiler need not check for overlaps
// before it vectorises. x: amsgrad's max v (kHasMax: the slot exists; it is
// updated only with kAmsgrad, else copied).
template <bool kDecoupled, bool kAmsgrad, bool kHasMax>
[[gnu::always_inline]] inline void AdamLoop(size_t n, const float* __restrict w_in,
                                            float* __restrict w_out, const float* __restrict m_in,
                                            float* __restrict m_out, const float* __restrict v_in,
                                            float* __restrict v_out, const float* __restrict x_in,
                                            float* __restrict x_out, const float* __restrict grad,
                                            float gs, const AdamArgs& a) {
  for (size_t i = 0; i < n; ++i) {
    const AdamValue r = AdamElement<kDecoupled, kAmsgrad>(
        w_in[i], m_in[i], v_in[i], kHasMax ? x_in[i] : 0.0f, grad[i], gs, a);
    w_out[i] = r.w;
    m_out[i] = r.m;
    v_out[i] = r.v;
    if constexpr (kHasMax) x_out[i] = r.x;
  }
}

template <bool kDecoupled, bool kAmsgrad, bool kHasMax>
[[gnu::always_inline]] inline void AdamInPlaceLoop(size_t n, float* __restrict w,
                                                   float* __restrict m, float* __restrict v,
                                                   float* __restrict x,
                                                   const float* __restrict grad, float gs,
                                                   const AdamArgs& a) {
  for (size_t i = 0; i < n; ++i) {
    const AdamValue r =
        AdamElement<kDecoupled, kAmsgrad>(w[i], m[i], v[i], kHasMax ? x[i] : 0.0f, grad[i], gs, a);
    w[i] = r.w;
    m[i] = r.m;
    v[i] = r.v;
    if constexpr (kHasMax) x[i] = r.x;
  }
}

// Every variant, in both clones (see PACER_KERNEL).
template <bool kDecoupled>
[[gnu::always_inline]] inline void AdamVariants(size_t n, const float* w_in, float* w_out, const float* m_in,
                             float* m_out, const float* v_in, float* v_out, const float* x_in,
                             float* x_out, const float* grad, float gs, AdamArgs a) {
  const bool has_max = x_out != nullptr;
  // The table steps every buffer in place, or none. A mix (BlockStep
  // allows one) first brings each fresh output up to its input, then
  // steps them all in place.
  const bool none_in_place =
      w_in != w_out && m_in != m_out && v_in != v_out && (!has_max || x_in != x_out);
  if (!none_in_place) {
    if (w_out != w_in) std::copy_n(w_in, n, w_out);
    if (m_out != m_in) std::copy_n(m_in, n, m_out);
    if (v_out != v_in) std::copy_n(v_in, n, v_out);
    if (has_max && x_out != x_in) std::copy_n(x_in, n, x_out);
    if (!has_max) return AdamInPlaceLoop<kDecoupled, false, false>(n, w_out, m_out, v_out, nullptr, grad, gs, a);
    if (!a.amsgrad) return AdamInPlaceLoop<kDecoupled, false, true>(n, w_out, m_out, v_out, x_out, grad, gs, a);
    return AdamInPlaceLoop<kDecoupled, true, true>(n, w_out, m_out, v_out, x_out, grad, gs, a);
  }
  if (!has_max) {
    return AdamLoop<kDecoupled, false, false>(n, w_in, w_out, m_in, m_out, v_in, v_out, nullptr,
                                              nullptr, grad, gs, a);
  }
  if (!a.amsgrad) {
    return AdamLoop<kDecoupled, false, true>(n, w_in, w_out, m_in, m_out, v_in, v_out, x_in,
                                             x_out, grad, gs, a);
  }
  AdamLoop<kDecoupled, true, true>(n, w_in, w_out, m_in, m_out, v_in, v_out, x_in, x_out, grad,
                                   gs, a);
}

// The clones (clang's target_clones takes no function templates).
PACER_KERNEL void AdamKernel(size_t n, const float* w_in, float* w_out, const float* m_in,
                             float* m_out, const float* v_in, float* v_out, const float* x_in,
                             float* x_out, const float* grad, float gs, AdamArgs a) {
  AdamVariants<false>(n, w_in, w_out, m_in, m_out, v_in, v_out, x_in, x_out, grad, gs, a);
}
PACER_KERNEL void AdamWKernel(size_t n, const float* w_in, float* w_out, const float* m_in,
                              float* m_out, const float* v_in, float* v_out, const float* x_in,
                              float* x_out, const float* grad, float gs, AdamArgs a) {
  AdamVariants<true>(n, w_in, w_out, m_in, m_out, v_in, v_out, x_in, x_out, grad, gs, a);
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
    if (!(b.fraction < 1.0f)) {
      SgdKernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.grad, b.grad_scale,
                {b.lr, s.weight_decay, s.momentum, OneMinus(s.dampening), s.nesterov, b.step <= 1});
      return;
    }
    const double f = std::max(static_cast<double>(b.fraction), 0.0);
    const double mu = s.momentum;
    const double decay = std::pow(mu, f);
    // c(f) = mu (1 - mu^f) / (1 - mu); its limit f at mu = 1.
    const double coast = mu != 1.0 ? mu * (1.0 - decay) / (1.0 - mu) : f;
    SgdFractionKernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.grad, b.grad_scale,
                      {b.lr, static_cast<float>(f * s.weight_decay), s.momentum,
                       static_cast<float>(decay), static_cast<float>(coast),
                       OneMinus(s.dampening), s.nesterov, b.step <= 1});
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
    auto* kernel = decoupled_ ? &AdamWKernel : &AdamKernel;
    kernel(b.n, b.w_in, b.w_out, b.state_in[0], b.state_out[0], b.state_in[1], b.state_out[1],
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
