// The one injected clock through which all of Pacer's time flows.
#ifndef PACER_PS_BASE_CLOCK_H_
#define PACER_PS_BASE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace pacer {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

// A monotonic clock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Current monotonic time.
  virtual TimePoint Now() const = 0;
  // Waits on `cv` (whose mutex `lock` holds) until notified or until `deadline`
  // on this clock. May return spuriously; callers re-check their predicate.
  // Returns true once Now() >= deadline.
  virtual bool WaitUntil(std::condition_variable& cv,
                         std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) const = 0;
  // Sleeps the calling thread until `deadline` on this clock.
  virtual void SleepUntil(TimePoint deadline) const = 0;

  // Real-time budget left before `deadline`, for OS calls that take a
  // timeout (zmq::poll); never negative.
  Duration Remaining(TimePoint deadline) const {
    auto left = deadline - Now();
    return left < Duration::zero() ? Duration::zero() : left;
  }

  // The process-wide real clock (steady_clock).
  static Clock* Real();
};

// steady_clock.
class RealClock final : public Clock {
 public:
  TimePoint Now() const override;
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override;
  void SleepUntil(TimePoint deadline) const override;
};

// A clock that moves only when a test calls Advance(). Waiters wake up on
// their condition variable or within a millisecond of real time to re-check
// the fake time, so Advance() needs no registry of waiters.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint{}) : now_ns_(start.time_since_epoch().count()) {}
  TimePoint Now() const override;
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override;
  void SleepUntil(TimePoint deadline) const override;
  // Moves time forward by `d`. Thread-safe.
  void Advance(Duration d);

 private:
  std::atomic<int64_t> now_ns_;
};

// Seconds as a double, for logs and metrics.
inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }
// Wall-clock time as Unix seconds (timestamps that outlive the process:
// metrics, saved state); never for deadlines.
inline double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
inline Duration FromSeconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace pacer

#endif  // PACER_PS_BASE_CLOCK_H_
