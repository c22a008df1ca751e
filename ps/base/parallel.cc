#include "ps/base/parallel.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace pacer {

ParallelPool::ParallelPool(int threads) : pid_(static_cast<uint64_t>(::getpid())) {
  for (int i = 1; i < threads; ++i) {
    helpers_.emplace_back([this] { Helper(); });
    pthread_setname_np(helpers_.back().native_handle(), "pacer-parallel");
  }
}

ParallelPool::~ParallelPool() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

size_t ParallelPool::Work(const Loop& loop) {
  size_t ran = 0;
  for (;;) {
    const size_t c = next_.fetch_add(1, std::memory_order_relaxed);
    if (c >= loop.chunks) return ran;
    const size_t begin = c * loop.chunk;
    (*loop.fn)(begin, std::min(loop.n, begin + loop.chunk));
    ++ran;
  }
}

void ParallelPool::For(size_t n, size_t chunk, absl::FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  chunk = std::max<size_t>(chunk, 1);
  const size_t chunks = (n - 1) / chunk + 1;
  MutexLock busy(busy_, std::defer_lock);
  if (helpers_.empty() || chunks < kMinChunks || !busy.TryLock() ||
      static_cast<uint64_t>(::getpid()) != pid_) {
    fn(0, n);
    return;
  }
  const Loop loop{&fn, n, chunk, chunks};
  {
    MutexLock lock(mu_);
    loop_ = loop;
    done_ = 0;
    next_.store(0, std::memory_order_relaxed);
    ++generation_;
  }
  wake_.notify_all();
  const size_t ran = Work(loop);
  MutexLock lock(mu_);
  done_ += ran;
  while (done_ != chunks || inside_ != 0) finished_.wait(lock.native());
  loop_ = Loop();  // a helper waking only now finds nothing to do
}

void ParallelPool::Helper() {
  uint64_t seen = 0;
  MutexLock lock(mu_);
  for (;;) {
    while (!stop_ && generation_ == seen) wake_.wait(lock.native());
    if (stop_) return;
    seen = generation_;
    if (loop_.fn == nullptr) continue;  // that loop is over
    const Loop loop = loop_;
    ++inside_;
    lock.Unlock();
    const size_t ran = Work(loop);
    lock.Lock();
    --inside_;
    done_ += ran;
    if (inside_ == 0 && done_ == loop.chunks) finished_.notify_one();
  }
}

ParallelPool& SharedPool() {
  // Never destroyed: its helpers sleep until the process exits.
  static ParallelPool* pool = [] {
    int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
    if (const char* v = std::getenv("PACER_PARALLEL_THREADS"); v != nullptr && *v != '\0') {
      threads = std::clamp(std::atoi(v), 1, 64);
    }
    return new ParallelPool(threads);
  }();
  return *pool;
}

}  // namespace pacer
