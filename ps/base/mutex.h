// Mutex and MutexLock: std::mutex and std::unique_lock<std::mutex>, annotated
// for clang's thread-safety analysis (-Wthread-safety). libstdc++'s own types
// carry no annotations, so ABSL_GUARDED_BY(mu_) only means something when mu_
// is a pacer::Mutex. Zero cost: the annotations are attributes, the members inline.
#ifndef PACER_PS_BASE_MUTEX_H_
#define PACER_PS_BASE_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace pacer {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis that the calling thread holds this mutex, where it
  // cannot see it: a condition-variable predicate (a lambda is a function of
  // its own). Checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction (std::lock_guard), may release
// and take it again in between (std::unique_lock), and lends its
// std::unique_lock to std::condition_variable and Clock::WaitUntil.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  // Not yet held: TryLock() or Lock() takes it (std::defer_lock).
  MutexLock(Mutex& mu, std::defer_lock_t) ABSL_LOCKS_EXCLUDED(mu)
      : lock_(mu.mu_, std::defer_lock) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return lock_.try_lock(); }

  // For cv.wait(lock.native()), cv.wait_until(...), Clock::WaitUntil(cv,
  // lock.native(), ...): the wait gives the mutex back before it returns,
  // so to the analysis the mutex stays held across it, which is what the
  // code after the wait may rely on.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_MUTEX_H_
