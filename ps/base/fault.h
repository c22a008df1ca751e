// Fault injection, a feature users run: a transport decorator that drops,
// delays, duplicates, reorders, corrupts or partitions the messages a
// process receives, by rules set from flags (--faults, --fault-seed) or at
// run time through the monitor (pacerctl fault).
//
// Faults act on the receiving side, where the sender and the message type
// are known from the envelope: a partition between A and B is a rule on A
// blocking B and one on B blocking A. Decisions come from one seeded RNG
// per process; the seed is logged at start, so a run's fault decisions
// replay with the same seed (message timing still varies).
#ifndef PACER_PS_BASE_FAULT_H_
#define PACER_PS_BASE_FAULT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "ps/base/clock.h"
#include "ps/base/mutex.h"
#include "ps/base/transport.h"
#include "ps/base/wire.h"

namespace pacer {

// kSlowDisk is not a message fault: a shard's checkpoint writes take `ms`
// (plus jitter) longer (DiskDelay).
enum class FaultKind { kDrop, kDelay, kDuplicate, kReorder, kCorrupt, kPartition, kSlowDisk };
const char* FaultKindName(FaultKind kind);

// One rule. A message matches when its type is in `types` (empty: any) and,
// for every kind, its sender is in `peers` (empty: anyone). A matching
// message is hit with `probability`.
struct FaultRule {
  FaultKind kind = FaultKind::kDrop;
  double probability = 1.0;
  std::set<wire::Body> types;
  std::set<uint32_t> peers;
  Duration delay{};   // kDelay: fixed part
  Duration jitter{};  // kDelay: plus uniform [0, jitter)
  // The rule ends by itself this long after it was set (0: when cleared).
  // A partitioned process cannot hear that its partition was lifted.
  Duration lasts{};
};

// Parses rules: "KIND[:KEY=VALUE,...]" joined by ';', e.g.
//   "drop:p=0.1"  "delay:ms=200,jitter=50"  "duplicate:p=0.2;reorder:p=0.2"
//   "corrupt:p=0.05,type=Push"  "partition:peers=3|4"
// KIND: drop, delay, duplicate, reorder, corrupt, partition, slow_disk. Keys:
// p (0..1, default 1), type (message types joined by '|', e.g. Push|Pull),
// peers (sender ids joined by '|'), ms and jitter (milliseconds; delay and
// slow_disk),
// for (seconds until the rule ends by itself).
// An empty string is no rules. InvalidArgument names what is wrong.
absl::StatusOr<std::vector<FaultRule>> ParseFaults(const std::string& spec);
// The spec of `rules`, in the form ParseFaults reads.
std::string FaultsToString(const std::vector<FaultRule>& rules);

// The rules of one process, its RNG and its counters. Thread-safe.
class FaultInjector {
 public:
  // `registry` (may be null) gets pacer_faults_injected_total{kind}.
  // `clock` times the rules' `for` (tests pass a FakeClock).
  FaultInjector(uint64_t seed, prometheus::Registry* registry,
                const Clock* clock = Clock::Real());
  uint64_t seed() const { return seed_; }
  void SetRules(std::vector<FaultRule> rules);
  std::vector<FaultRule> rules() const;
  // Whether any rule is set (lock-free: the no-fault fast path).
  bool any() const { return any_.load(std::memory_order_relaxed); }

  // What to do with one received message.
  struct Decision {
    bool drop = false;       // drop or partition
    Duration delay{};        // deliver this much later
    bool duplicate = false;  // deliver twice
    bool reorder = false;    // held back 20 ms: what comes next overtakes it
    bool corrupt = false;    // flip a byte of the header or payload
  };
  // `env` is the message's envelope, or null when it has none that parses
  // (such a message is only ever dropped by a partition without peers).
  Decision Decide(const Envelope* env);
  // slow_disk: how much longer this checkpoint write must take (counted
  // when not zero).
  Duration DiskDelay();
  // Flips one byte, chosen by the RNG, in frames[first..] (copying it).
  void Corrupt(Frames& frames, size_t first);
  double injected(FaultKind kind) const;

 private:
  // With mu_ held: whether `r` strikes this time (counted when it does),
  // and its delay, jitter drawn.
  bool Hit(const FaultRule& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Duration DelayOf(const FaultRule& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t seed_;
  const Clock* const clock_;
  std::atomic<bool> any_{false};
  mutable Mutex mu_;  // guards rules_, set_at_, rng_, counts_
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  TimePoint set_at_ ABSL_GUARDED_BY(mu_){};
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::map<FaultKind, prometheus::Counter*> counters_;
  std::map<FaultKind, double> counts_ ABSL_GUARDED_BY(mu_);  // without a registry too
};

// A process's run-time faults from the monitor's heartbeat replies: applies
// `spec` on top of the rules the process started with when `version`
// differs from the last one applied. Logs what changed. Not thread-safe.
class RuntimeFaults {
 public:
  explicit RuntimeFaults(std::shared_ptr<FaultInjector> faults)
      : faults_(std::move(faults)), base_(faults_ ? faults_->rules() : std::vector<FaultRule>{}) {}
  void Apply(uint64_t version, const std::string& spec);

 private:
  std::shared_ptr<FaultInjector> faults_;
  std::vector<FaultRule> base_;
  uint64_t version_ = 0;
};

// Wraps `inner`: every socket it makes applies `faults` to what it receives.
std::unique_ptr<Transport> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                               std::shared_ptr<FaultInjector> faults);

}  // namespace pacer

#endif  // PACER_PS_BASE_FAULT_H_
