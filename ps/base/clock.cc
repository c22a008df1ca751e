#include "ps/base/clock.h"

#include <thread>

namespace pacer {

Clock* Clock::Real() {
  static RealClock clock;
  return &clock;
}

TimePoint RealClock::Now() const {
  return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
}

bool RealClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) const {
  return cv.wait_until(lock, deadline) == std::cv_status::timeout || Now() >= deadline;
}

void RealClock::SleepUntil(TimePoint deadline) const { std::this_thread::sleep_until(deadline); }

TimePoint FakeClock::Now() const { return TimePoint(Duration(now_ns_.load())); }

bool FakeClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                          TimePoint deadline) const {
  if (Now() >= deadline) return true;
  // Real time only bounds how often the fake time is re-read.
  cv.wait_for(lock, std::chrono::milliseconds(1));
  return Now() >= deadline;
}

void FakeClock::SleepUntil(TimePoint deadline) const {
  while (Now() < deadline) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void FakeClock::Advance(Duration d) { now_ns_.fetch_add(d.count()); }

}  // namespace pacer
