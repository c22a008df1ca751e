#include "worker/local_optimizer.h"

namespace pacer::worker {

LocalOptimizer::LocalOptimizer(const JobOptimizer& o)
    : config_(o), optimizer_(MakeOptimizer(o.kind, o.settings.amsgrad)) {}

void LocalOptimizer::Step(std::span<float> params, std::span<const float> grads) {
  if (state_.empty()) {
    for (size_t i = 0; i < optimizer_->state_slots(); ++i) {
      state_.emplace_back(params.size(), optimizer_->InitialState(i, config_.settings));
    }
  }
  BlockStep b;
  b.n = params.size();
  b.w_in = params.data();
  b.w_out = params.data();
  for (size_t i = 0; i < state_.size(); ++i) {
    b.state_in[i] = state_[i].data();
    b.state_out[i] = state_[i].data();
  }
  b.grad = grads.data();
  b.lr = config_.settings.lr;
  b.step = ++steps_;
  optimizer_->Step(b, config_.settings);
}

}  // namespace pacer::worker
