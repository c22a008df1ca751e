#include "worker/straggler.h"

#include <pthread.h>
#include <sched.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

namespace pacer::worker {

absl::StatusOr<std::vector<SlowdownStep>> ParseSlowdownSchedule(const std::string& text) {
  std::vector<SlowdownStep> steps;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t colon = item.find(':');
    SlowdownStep step;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      size_t used = 0;
      step.at_seconds = std::stod(item.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument("trailing characters");
      const std::string f = item.substr(colon + 1);
      step.factor = std::stod(f, &used);
      if (used != f.size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("slowdown schedule item '" + item +
                                        "' is not SECONDS:FACTOR");
    }
    if (!std::isfinite(step.at_seconds) || step.at_seconds < 0) {
      return absl::InvalidArgumentError("slowdown schedule item '" + item +
                                        "': seconds must be >= 0");
    }
    if (!std::isfinite(step.factor) || step.factor < 1 || step.factor > 1000) {
      return absl::InvalidArgumentError("slowdown schedule item '" + item +
                                        "': the factor must be in [1, 1000]");
    }
    if (!steps.empty() && step.at_seconds <= steps.back().at_seconds) {
      return absl::InvalidArgumentError("slowdown schedule item '" + item +
                                        "': seconds must increase");
    }
    steps.push_back(step);
  }
  if (steps.empty()) return absl::InvalidArgumentError("empty slowdown schedule");
  return steps;
}

double SlowdownAt(const std::vector<SlowdownStep>& schedule, double base, double elapsed) {
  double f = base;
  for (const auto& s : schedule) {
    if (s.at_seconds <= elapsed) f = s.factor;
  }
  return f;
}

absl::Status PinCurrentThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return absl::InvalidArgumentError("no CPU " + std::to_string(cpu));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    return absl::InvalidArgumentError("cannot pin to CPU " + std::to_string(cpu) + ": " +
                                      std::strerror(rc));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuContention>> CpuContention::Start(int threads, int cpu) {
  if (threads < 0) return absl::InvalidArgumentError("negative thread count");
  if (cpu >= 0) {
    if (absl::Status s = PinCurrentThread(cpu); !s.ok()) return s;
  }
  std::unique_ptr<CpuContention> c(new CpuContention());
  for (int i = 0; i < threads; ++i) {
    c->threads_.emplace_back([p = c.get(), cpu] {
      if (cpu >= 0) (void)PinCurrentThread(cpu);
      volatile double x = 1.0;
      while (!p->stop_.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 10000; ++k) x = x * 1.0000001 + 1e-9;
        p->spins_.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  return c;
}

CpuContention::~CpuContention() {
  stop_ = true;
  for (auto& t : threads_) t.join();
}

}  // namespace pacer::worker
