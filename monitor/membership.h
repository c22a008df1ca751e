// The job's workers: registration (ids, ranks, registration tokens), leases,
// the membership's version, the evaluator, and the clock the workers are
// held at (a pause). Every change of the live set goes through Change,
// which tells the listeners registered with OnChange (the data feed) before
// the version moves. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_MEMBERSHIP_H_
#define PACER_MONITOR_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "monitor/journal.h"
#include "monitor/monitor_metrics.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

// What the monitor knows of one worker.
struct WorkerState {
  uint32_t id = 0;
  uint32_t rank = 0;
  uint32_t batch = 0;
  uint32_t staleness = 0;        // s or s_L
  uint32_t staleness_range = 0;  // r_max
  uint64_t start_clock = 0;      // the clock it started at
  uint64_t clock = 0;
  uint64_t joined_version = 0;  // membership version that first included it
  TimePoint last_seen{};
  bool alive = true;
  bool done = false;
  float samples_per_second = 0;  // as it last reported
  bool paused = false;           // held at the pause clock, as it last reported
  std::string public_key;        // CURVE key it registered with (empty: plain)
};

class Membership {
 public:
  Membership(Journal* journal, MonitorMetrics* metrics) : journal_(journal), metrics_(metrics) {}

  const std::map<uint32_t, WorkerState>& workers() const { return workers_; }
  // Worker `id` (null: unknown).
  WorkerState* Find(uint32_t id);
  const WorkerState* Find(uint32_t id) const;
  const WorkerState& at(uint32_t id) const { return workers_.at(id); }
  // Live (not lost, removed or finished) workers, by id.
  std::vector<uint32_t> LiveWorkers() const;
  // Every id it has given, live or not.
  std::vector<uint32_t> KnownIds() const;
  uint64_t version() const { return version_; }
  // The live worker with the lowest rank (0: none).
  uint32_t Evaluator() const;
  // Whether any worker finished its share.
  bool AnyDone() const;
  // A resumed job with no live worker yet: it waits for one before "all
  // workers finished" can end it.
  bool awaiting_workers() const { return awaiting_workers_; }

  // A registration with `token` (empty: none) seen before: that worker.
  const WorkerState* ByToken(const std::string& token) const;
  // The lowest clock of the live workers (nullopt: none).
  std::optional<uint64_t> MinLiveClock() const;

  // Workers join and leave through these four. Each is a membership change
  // (Change), and the live-set listeners (OnLiveSetChange) hear: before the
  // change for a worker that joins, after it for one that leaves.
  //
  // A new worker `id` (from the job's one id counter) at the rank it asks
  // for (`rank_hint`: pacer-run's launch index; the monitor passes only one
  // below --min-workers) when no live worker holds it, else at the lowest rank no live worker holds (a replacement takes
  // the rank, and so the data, of one that died), starting at `start_clock`.
  const WorkerState& Join(uint32_t id, const std::string& token, const std::string& public_key,
                          TimePoint now, uint64_t start_clock,
                          std::optional<uint32_t> rank_hint = std::nullopt);
  // Worker `id` finished its share (its last heartbeat, at `at_clock`, said so).
  void Finish(uint32_t id, uint64_t at_clock);
  // pacerctl remove-worker, or a refused declaration (`why`, for the
  // log): false when `id` is not a live member.
  bool Remove(uint32_t id, const std::string& why = "removed by request");
  // Workers silent for longer than `lease` are declared dead.
  void ExpireLeases(TimePoint now, Duration lease);

  // `reason` is one of the labels of pacer_monitor_membership_changes_total.
  // The change listeners hear first; then the version goes up.
  void Change(const char* reason, const std::string& why);
  // Listeners, called in the order registered (MonitorCore wires them).
  void OnChange(std::function<void()> listener) { on_change_.push_back(std::move(listener)); }
  void OnLiveSetChange(std::function<void()> listener) {
    on_live_set_.push_back(std::move(listener));
  }

  // The clock workers hold before (0: none): a shard move, pacerctl pause,
  // a final evaluation.
  uint64_t pause_at() const { return pause_at_; }
  // Holds the workers at a clock past every live worker's (if not held).
  void Hold();
  void Release() { pause_at_ = 0; }
  // A worker reports a clock past the hold clock (heartbeats lag a few
  // iterations): the others run up to it.
  void RaiseHold(const WorkerState& w);
  // pacerctl pause holds until pacerctl resume.
  bool operator_pause() const { return operator_pause_; }
  void set_operator_pause(bool p) { operator_pause_ = p; }

  // Its part of the monitor's saved state.
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r, TimePoint now);

 private:
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  std::map<uint32_t, WorkerState> workers_;
  std::map<std::string, uint32_t> tokens_;  // registration token -> id
  uint32_t next_rank_ = 0;
  uint64_t version_ = 0;
  bool awaiting_workers_ = false;
  uint64_t pause_at_ = 0;
  bool operator_pause_ = false;
  std::vector<std::function<void()>> on_change_, on_live_set_;
};

}  // namespace pacer

#endif  // PACER_MONITOR_MEMBERSHIP_H_
