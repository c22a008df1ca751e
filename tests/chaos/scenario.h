// A chaos scenario for pacer-chaos: the cluster to launch, a timeline of
// faults, and the invariants to check. Read from YAML:
//
//   name: shard-crash
//   description: kill -9 a shard mid-run; it comes back from its checkpoint
//   seconds: 45                  # the run's bound (training time cap)
//   cluster:
//     shards: 2
//     workers: 2
//     mode: bsp                  # pacer-monitor --mode (default: its own)
//     checkpoint_interval: 1     # pacer-server --checkpoint-interval
//     monitor_args: [--lease, "2"]
//     shard_args: []
//     worker_args: [--train-limit, "12000"]
//   timeline:                    # seconds after the job starts training
//     - {at: 8, do: kill, target: shard:0}       # SIGKILL
//     - {at: 10, do: restart, target: shard:0}   # same data directory
//   invariants:
//     progress_within: 20        # after each heal, acknowledged pushes resume within S s
//     final_accuracy: 0.7        # of the exported model, on the test set
//   expect_fail: [lost_bound]    # negative scenarios only: these must fail
//
// Actions: kill, restart (shard:I, worker:I, monitor), stop and cont
// (SIGSTOP/SIGCONT), terminate (SIGTERM), slow (factor, seconds: the
// process gets SIGSTOP/SIGCONT in 100 ms cycles, running 1/factor of each),
// add-worker, add-shard (a new shard process, then pacerctl add-shard),
// drain-shard (shard:I; pacerctl drain-shard), faults (target as for
// pacerctl fault, with shard:I/worker:I meaning the I-th started process,
// and spec), clear-faults, partition (target worker:I or shard:I, seconds:
// cut off from everyone for that long; with `from: monitor`, from the
// monitor only, the others still reach it).
#ifndef PACER_TESTS_CHAOS_SCENARIO_H_
#define PACER_TESTS_CHAOS_SCENARIO_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pacer::chaos {

struct Action {
  double at = 0;        // seconds after training starts
  std::string what;     // kill, restart, stop, cont, terminate, add-worker, faults, ...
  std::string target;   // shard:I, worker:I, monitor; for faults: a pacerctl fault target
  std::string spec;     // faults: the rules
  double seconds = 0;   // partition, slow: how long
  double factor = 0;    // slow: the process runs 1/factor of the time
  // partition: "" (cut off from everyone) or "monitor" (from the monitor
  // only: the target and the monitor drop what the other sends).
  std::string from;
  // Whether this action ends a fault (the cluster should make progress
  // again after it): restart, cont, clear-faults, and the end of a partition
  // or of a rule with for=, add-shard, drain-shard.
  bool Heals() const;
};

struct Invariants {
  // Acknowledged pushes resume within this many seconds of every heal, and
  // of the end of the timeline.
  double progress_within = 20;
  // Test accuracy of the final model (0: not checked).
  double final_accuracy = 0;
  // Each invariant can be switched off for a scenario that breaks it on
  // purpose.
  bool no_crash = true;         // no process dies unless the timeline kills it
  bool no_hang = true;          // every process stops on SIGTERM at the end
  bool lost_bound = true;       // lost updates within the documented bound
  bool no_double_apply = true;  // no push applied twice
  bool faults_in_metrics = true;  // every injected fault counted in the metrics
  // Replicated jobs (--replicas), from the shards' --ledger files:
  bool durable_kept = true;        // every push journalled durable is in its range's final primary
  bool acked_kept = true;          // so is every acknowledged push of a worker not killed
  bool replicas_identical = true;  // each backup holds its primary's record, state and ledger
  // No range acknowledged by two primaries at once: per range, every push
  // acknowledged at an epoch comes before the first acknowledged at a
  // higher one (the workers' journals name each range's epoch).
  bool no_split_brain = true;
  // --data-stream (the monitor logs "data stream over N samples"), from the
  // workers' --sample-log files: in every epoch the monitor logged as done,
  // each training index trained exactly once, a second time only in the
  // last batch of a worker the timeline killed; in the epoch under way
  // none twice but so.
  bool once_per_epoch = true;
};

struct Scenario {
  std::string name;
  std::string description;
  double seconds = 60;
  int shards = 2;
  int workers = 2;
  std::string mode;
  double checkpoint_interval = 1;
  std::vector<std::string> monitor_args, shard_args, worker_args;
  std::vector<Action> timeline;  // sorted by `at`
  Invariants invariants;
  // Invariants this scenario must see fail (by their key above): a negative
  // scenario switches a fault handling off (--unsafe-disable) to show that
  // the invariant catches it. The run passes when exactly these fail.
  std::vector<std::string> expect_fail;
};

// Parses and checks a scenario; InvalidArgument says what and where.
absl::StatusOr<Scenario> ParseScenario(const std::string& yaml);

// `spec` with each "{shard:I}" (a fault spec's reference to shard I, e.g.
// peers={shard:0}) replaced by resolve("shard:I"); InvalidArgument naming
// the reference when it is not closed or resolve gives nullopt.
absl::StatusOr<std::string> ExpandShardRefs(
    std::string spec, const std::function<std::optional<std::string>(const std::string&)>& resolve);

}  // namespace pacer::chaos

#endif  // PACER_TESTS_CHAOS_SCENARIO_H_
