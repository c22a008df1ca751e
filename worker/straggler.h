// Straggler emulation, a user-facing feature of the worker: users check how
// their job behaves when a node is slow without waiting for one to be.
//
//   --slowdown FACTOR            every iteration's compute is stretched to
//                                FACTOR x by sleeping (FACTOR - 1) x its time;
//   --slowdown-schedule "0:1,30:4,60:1"
//                                the factor by elapsed second of training;
//   --cpu-contention N           N busy threads in the worker's process, as a
//                                co-located job would run (with --pin-cpu,
//                                they and the worker share that one CPU).
#ifndef PACER_WORKER_STRAGGLER_H_
#define PACER_WORKER_STRAGGLER_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer::worker {

// A piecewise-constant slowdown: from `at_seconds` on, the factor is `factor`.
struct SlowdownStep {
  double at_seconds = 0;
  double factor = 1;
};

// Parses "SECONDS:FACTOR,..." (seconds ascending, from 0 or later; factors
// >= 1). An error names the offending item.
absl::StatusOr<std::vector<SlowdownStep>> ParseSlowdownSchedule(const std::string& text);

// The factor at `elapsed` seconds: the last step at or before it; `base`
// before the first step or with no schedule.
double SlowdownAt(const std::vector<SlowdownStep>& schedule, double base, double elapsed);

// Busy threads that burn CPU until destroyed.
class CpuContention {
 public:
  // `threads` spinning threads; when `cpu` >= 0 they, and the calling
  // thread, are pinned to that CPU. Fails when pinning is refused.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuContention>> Start(int threads, int cpu);
  ~CpuContention();
  // Iterations of the busy loop so far (tests: the threads really run).
  uint64_t spins() const { return spins_.load(std::memory_order_relaxed); }

 private:
  CpuContention() = default;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> spins_{0};
  std::vector<std::thread> threads_;
};

// Pins the calling thread to `cpu`.
absl::Status PinCurrentThread(int cpu);

}  // namespace pacer::worker

#endif  // PACER_WORKER_STRAGGLER_H_
