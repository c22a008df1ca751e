// The local optimizer of pacer-worker in mode local (pacer-monitor --mode
// local): the worker steps its own copy of the parameters between a round's
// pull and its push, with one of the shards' optimizers (ps/optimizer.h:
// torch.optim's updates) over the whole flat parameter vector, and keeps
// that optimizer's state across rounds, as a torch optimizer in the user's
// loop does. (pacer.torch runs the user's torch optimizer instead.)
#ifndef PACER_WORKER_LOCAL_OPTIMIZER_H_
#define PACER_WORKER_LOCAL_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/base/optimizer_config.h"
#include "ps/optimizer.h"

namespace pacer::worker {

class LocalOptimizer {
 public:
  explicit LocalOptimizer(const JobOptimizer& o);
  // One step of params by grads (sizes must match; the state is made at
  // the first step).
  void Step(std::span<float> params, std::span<const float> grads);
  uint64_t steps() const { return steps_; }

 private:
  JobOptimizer config_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::vector<float>> state_;
  uint64_t steps_ = 0;
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_LOCAL_OPTIMIZER_H_
