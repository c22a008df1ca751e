// Loops over payload-sized data (message checks, copies, optimizer steps
// over MiBs) run on the calling thread and a few helper threads together,
// while the rest of the process waits for their result anyway: a worker
// waiting on its push, a shard between messages.
#ifndef PACER_PS_BASE_PARALLEL_H_
#define PACER_PS_BASE_PARALLEL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "ps/base/mutex.h"

namespace pacer {

// A loop `fn` over [0, n) is cut into chunks of `chunk` indices (the last
// may be shorter), which the caller and the pool's helpers take in turn
// until none is left. The caller starts at once: a helper slow to wake
// (its core busy) takes fewer chunks, never delays the loop's start.
//
// A loop of fewer than kMinChunks chunks runs on the caller alone, as one
// call fn(0, n): waking a helper costs more than it saves. So does a loop
// started while another thread's loop is running: For never waits for
// anyone else's work. Thread-safe.
class ParallelPool {
 public:
  static constexpr size_t kMinChunks = 4;

  // `threads` counts the caller: threads - 1 helpers (none for 0 or 1).
  explicit ParallelPool(int threads);
  ~ParallelPool();
  ParallelPool(const ParallelPool&) = delete;
  ParallelPool& operator=(const ParallelPool&) = delete;

  // Calls fn(begin, end) for disjoint ranges that together cover [0, n),
  // each starting at a multiple of `chunk`, several at once from different
  // threads; returns when every call has returned. fn must be safe to call
  // so, and must not throw.
  void For(size_t n, size_t chunk, absl::FunctionRef<void(size_t, size_t)> fn);

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

 private:
  struct Loop {
    absl::FunctionRef<void(size_t, size_t)>* fn = nullptr;
    size_t n = 0;
    size_t chunk = 0;
    size_t chunks = 0;
  };
  // Runs chunks of `loop` until none is left; returns how many it ran.
  size_t Work(const Loop& loop);
  void Helper();

  const uint64_t pid_;  // a forked child has none of the helpers: it runs alone
  Mutex busy_;     // held by the loop in progress (try-locked)
  Mutex mu_;
  std::condition_variable wake_;      // helpers: a loop started, or stop
  std::condition_variable finished_;  // the caller: helpers done
  Loop loop_ ABSL_GUARDED_BY(mu_);    // fn == nullptr: no loop open
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;    // chunks finished
  int inside_ ABSL_GUARDED_BY(mu_) = 0;     // helpers in the loop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<size_t> next_{0};             // the next chunk to take
  std::vector<std::thread> helpers_;
};

// The process's pool: one thread per core, at most 4 (PACER_PARALLEL_THREADS
// sets another count; 1 runs every loop on its caller). Its helpers start
// on first use and live until the process exits.
ParallelPool& SharedPool();

}  // namespace pacer

#endif  // PACER_PS_BASE_PARALLEL_H_
