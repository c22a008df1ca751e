// Drives the straggler policy (monitor/policy.h): the workers' timings go
// in, rounds run when due (or at once after a confirmed shift), and the
// assignments (batch sizes, staleness bounds) come out into the membership;
// a changed bound is a membership change (the shards enforce the bounds).
// No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_POLICY_DRIVER_H_
#define PACER_MONITOR_POLICY_DRIVER_H_

#include <cstdint>
#include <string>

#include "monitor/journal.h"
#include "monitor/membership.h"
#include "monitor/monitor_metrics.h"
#include "monitor/policy.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

class PolicyDriver {
 public:
  struct Options {
    policy::PolicyOptions policy;  // with the job's mode and global batch
    // --rescale-batch: scale B with the number of live workers.
    bool rescale_batch = false;
  };
  PolicyDriver(const Options& options, const Clock* clock, Membership* members, Journal* journal,
               MonitorMetrics* metrics)
      : options_(options), policy_(options.policy, clock), members_(members), journal_(journal),
        metrics_(metrics) {}

  const policy::StragglerPolicy& policy() const { return policy_; }
  // At the job's start: the live workers share B.
  void Start();
  // The live set changed: the policy takes it (B rescaled with
  // --rescale-batch) and its assignments go to the workers.
  void SetWorkers();
  // A worker's timings since its last heartbeat. True when a round is due
  // at once (a confirmed shift).
  bool Report(const WorkerState& w, const msg::Heartbeat& hb);
  // Runs a round when one is due and applies what it decides.
  void Round(TimePoint now);
  // pacerctl-style bounds for one live worker; false for an unknown worker
  // or bounds above kMaxStalenessBound together.
  bool SetBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range);
  // One line on what the policy did: its rounds by reason and the last
  // batch sizes.
  std::string Summary() const;

  // Its part of the monitor's saved state; Restore after the membership's.
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r);

 private:
  void RescaleBatch(size_t live);
  // Copies the policy's assignments into the membership; true when a bound
  // changed.
  bool ApplyAssignments();

  const Options options_;
  policy::StragglerPolicy policy_;
  Membership* const members_;
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  double batch_per_worker_ = 0;  // B / workers at the start (rescale_batch)
  // Interval rounds that changed a size are logged at most every
  // kPolicyLogEvery (the rest at debug); these count the ones in between.
  TimePoint logged_at_{};
  uint64_t unlogged_ = 0;
};

}  // namespace pacer

#endif  // PACER_MONITOR_POLICY_DRIVER_H_
