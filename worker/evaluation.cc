// The trainer's evaluation thread (TrainerOptions::evaluate; declared in
// worker/monitor_session.h, whose view of the job it reads): the worker the
// monitor names evaluates the latest parameters on a client of its own and
// reports the accuracy.
#include <algorithm>

#include "spdlog/spdlog.h"
#include "worker/monitor_session.h"

namespace pacer::worker {

void EvaluationLoop(MonitorSession& s, const std::vector<wire::KeyLen>& keys, ShardMapInfo map) {
  // Every worker with an evaluation runs this loop; the one the monitor
  // names (the live worker with the lowest rank) evaluates.
  ClientOptions copts;
  copts.rpc = s.Rpc();
  copts.request_timeout = std::chrono::seconds(10);
  copts.cancel = &s.heartbeat_exit;
  copts.latest_map_version = &s.map_version;
  auto client = PsClient::Create(s.transport, copts, map, keys);
  auto monitor = RpcChannel::Connect(s.transport, s.options.monitor, s.Rpc());
  if (!client.ok() || !monitor.ok()) return;
  MutexLock lock(s.mu);
  // Two schedules: every eval_interval seconds, and (if set) every
  // eval_clocks of this worker's clocks; each evaluation says which asked.
  TimePoint next = s.clock->Now() + FromSeconds(s.eval_interval);
  uint64_t next_clock = s.eval_clocks;
  uint64_t answered = 0;  // the last evaluate_now answered
  while (!s.heartbeat_exit) {
    // `cv` also wakes on every heartbeat and as clocks pass: wait for a
    // deadline of one schedule or the other, or the monitor's request.
    bool by_time = false;
    while (!s.heartbeat_exit && !(s.eval_clocks > 0 && s.clock_now.load() >= next_clock) &&
           s.view.evaluate_now <= answered) {
      if (s.clock->WaitUntil(s.cv, lock.native(), next)) {
        by_time = true;
        break;
      }
    }
    if (s.heartbeat_exit) break;
    uint32_t every_clocks = 0;
    uint64_t request = 0;
    if (s.view.evaluate_now > answered) {
      request = answered = s.view.evaluate_now;
    } else if (by_time) {
      next = s.clock->Now() + FromSeconds(s.eval_interval);
    } else {
      every_clocks = s.eval_clocks;
      // The next multiple past the current clock: a slow evaluation skips
      // the clocks it missed rather than queueing them.
      next_clock = (s.clock_now.load() / s.eval_clocks + 1) * s.eval_clocks;
    }
    if (!s.view.evaluate) continue;
    lock.Unlock();
    if (absl::Status st = s.RefreshMap(**client); !st.ok()) {
      spdlog::warn("worker {}: evaluation: {}", s.id, ErrorText(st));
    }
    auto applied = (*client)->Pull(0, /*latest=*/true);
    if (applied.ok()) {
      absl::StatusOr<EvalResult> r = s.options.evaluate((*client)->params());
      if (!r.ok()) {
        // That evaluation is skipped; the next one may succeed (a user's
        // evaluation function that raised once, say).
        spdlog::error("worker {}: cannot evaluate (skipped): {}", s.id, ErrorText(r.status()));
        lock.Lock();
        continue;
      }
      const msg::AccuracyReport report{static_cast<uint64_t>(std::max<int64_t>(0, *applied)),
                                       static_cast<float>(r->accuracy), static_cast<float>(r->loss),
                                       static_cast<uint32_t>(r->samples), every_clocks,
                                       request, /*scheduled=*/true};
      auto ack = (*monitor)->Call(report, s.clock->Now() + std::chrono::seconds(2));
      if (!ack.ok()) SPDLOG_DEBUG("accuracy report: {}", ErrorText(ack.status()));
    }
    lock.Lock();
  }
}

}  // namespace pacer::worker
