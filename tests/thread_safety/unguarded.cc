// The thread-safety check's own test: clang must reject this file (an
// access to a guarded field without its mutex). If it compiles, the
// annotations check nothing (a Mutex lost its ABSL_LOCKABLE, the macros
// expand to nothing, the flag is gone) and check.py fails.
#include "ps/base/mutex.h"

namespace pacer {
class Counter {
 public:
  void Add() {
    MutexLock lock(mu_);
    ++n_;
  }
#ifdef PACER_TSA_BUG
  int Peek() const { return n_; }  // no lock
#endif
 private:
  mutable Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};
}  // namespace pacer
