// Server-side optimizer math: one step of one key block, following
// torch.optim's documented update of PyTorch 1.13 on float32 (SGD, Adam,
// AdamW, Adagrad), vectorised by Eigen. No state of its own: the table
// (ps/table.h) owns parameters, optimizer state and step counts, and hands
// each block's buffers in.
#ifndef PACER_PS_OPTIMIZER_H_
#define PACER_PS_OPTIMIZER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ps/base/optimizer_config.h"

namespace pacer {

// What one step of one key block reads and writes. The outputs may be the
// inputs themselves (in place), or fresh buffers while a reply or a
// checkpoint still holds the old ones (no copy first).
struct BlockStep {
  size_t n = 0;
  const float* w_in = nullptr;
  float* w_out = nullptr;
  std::array<const float*, kMaxStateSlots> state_in{};
  std::array<float*, kMaxStateSlots> state_out{};
  // The gradient is grad_scale * grad (the shard's batch-weighted mean).
  const float* grad = nullptr;
  float grad_scale = 1.0f;
  // This step's learning rate: the group's, times the step's scale
  // (staleness, b_i / B in asp). Weight decay (settings.weight_decay) is
  // applied once, in this step (SGD: weighted by `fraction`).
  float lr = 0.0f;
  // How much of a full step this is: the step's samples over the global
  // batch, in (0, 1]. SGD with momentum decays its buffer by momentum^fraction
  // and takes a matching share of it into the update (ps/optimizer.cc), so
  // that a step on a few samples moves the model by a few samples' worth; at
  // 1, torch's update bit for bit. (Scaling only the gradient would leave a
  // full momentum step per clock: a worker alone at an epoch's end, pushing
  // batches of 1, made the model coast along its last velocity, clock after
  // clock.) The other optimizers normalise the gradient and take the
  // fraction in lr.
  float fraction = 1.0f;
  // The block's step count including this one (1: its first step), for
  // Adam's bias correction, Adagrad's lr decay and SGD's first momentum.
  uint64_t step = 1;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual OptimizerKind kind() const = 0;
  // Per-value state buffers, each as long as the parameters: sgd 1
  // (momentum_buffer), adam/adamw 2 (exp_avg, exp_avg_sq) or 3 with amsgrad
  // (max_exp_avg_sq), adagrad 1 (sum).
  virtual size_t state_slots() const = 0;
  virtual std::string_view slot_name(size_t slot) const = 0;
  // What slot `slot` holds before a block's first step (adagrad's sum:
  // initial_accumulator_value; else 0).
  virtual float InitialState(size_t slot, const OptimizerSettings& s) const;
  // One step of one block with its group's settings. Elementwise: the
  // table cuts a big block in pieces and steps them at once on several
  // threads (ps/table.cc), so no kernel may depend on a value's position
  // or on other values of the block.
  virtual void Step(const BlockStep& b, const OptimizerSettings& s) const = 0;
};

// The optimizer of `kind`; `amsgrad_slot` gives Adam and AdamW the third
// buffer (some group sets amsgrad).
std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, bool amsgrad_slot);

// acc += scale * g. Sizes must match.
void Accumulate(std::span<float> acc, std::span<const float> g, float scale);

}  // namespace pacer

#endif  // PACER_PS_OPTIMIZER_H_
