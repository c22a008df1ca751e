// pacer-chaos's runner: starts a local cluster of the real binaries
// (pacer-monitor, pacer-server, pacer-worker, pacerctl) for one scenario
// (scenario.h), plays its timeline of faults, and checks its invariants
// against its own record of what the cluster acknowledged.
//
// The workers are the real pacer-worker, each with --ack-log: a journal of
// every acknowledged push (wall time, push seq, clock, samples), written
// the moment the client library reports the acknowledgement, so the record
// is kept at the client boundary, not taken from the system's own reports.
// Metrics are scraped only to see what the system did (lost updates,
// applied pushes, faults counted), and compared against that record.
#ifndef PACER_TESTS_CHAOS_RUNNER_H_
#define PACER_TESTS_CHAOS_RUNNER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/applied_ledger.h"
#include "ps/base/clock.h"
#include "tests/chaos/netns.h"
#include "tests/chaos/scenario.h"
#include "tests/process/process.h"

namespace pacer::chaos {

// SIGINT/SIGTERM set it: the runner stops at its next wait by throwing
// Interrupted (caught in main), so that its processes and namespaces are
// cleaned up.
extern std::atomic<bool> g_interrupted;
struct Interrupted {};

// Exit code of a run that could not happen here (--netns without root or
// iptables): ctest's SKIP_RETURN_CODE.
constexpr int kExitSkip = 77;

using Millis = std::chrono::milliseconds;

// A process the runner started (stdout in DIR/NAME.out, stderr in
// DIR/NAME.log), with what the runner keeps of it.
class Proc {
 public:
  // `netns`: the path of a network namespace to run it in ("": this one).
  static std::unique_ptr<Proc> Start(const std::vector<std::string>& argv, const std::string& dir,
                                     const std::string& name, const std::string& netns = "");
  std::optional<std::string> WaitLine(const std::string& prefix, Millis timeout) {
    return process_->WaitForLine(prefix, timeout);
  }
  bool Running() { return process_->Running(); }
  std::optional<int> Wait(Millis timeout) { return process_->Wait(timeout); }
  void Signal(int sig) { process_->Signal(sig); }
  const std::string& name() const { return process_->name(); }
  int pid() const { return process_->pid(); }
  std::optional<int> exit_code() const { return process_->exit_code(); }
  double started() const { return process_->started(); }
  double ended() const { return process_->ended(); }
  // Reaped: its pid is no longer its own (read by a slow action's thread).
  bool gone() const { return process_->reaped(); }

  bool killed_on_purpose = false;  // the timeline killed or terminated it
  // The timeline froze it (stop) or cut it off (partition): past its lease
  // the job counts it dead, and its last batch may be trained again, as a
  // killed worker's.
  bool lost_on_purpose = false;
  // SIGSTOPped by the timeline and not continued (a slow action's cycler
  // reads it, so as not to wake a process the timeline froze).
  std::atomic<bool> stopped{false};
  bool hung = false;       // still running long after the job stopped
  bool cut_off = false;    // --netns: partitioned by iptables (not scraped)
  bool drained = false;    // drain-shard: its keys moved away and it left
  double counts_from = 0;  // a shard: acknowledged pushes reach it from then (unix s)
  std::string metrics;     // its /metrics address
  std::string address;     // a shard's: the address it listens at
  // Largest value seen of each scraped series key (metric + labels).
  std::map<std::string, double> seen;
  // Each series' value at the last scrape that had it, with when that
  // scrape was asked for and when it was answered (a truncated answer
  // lacks series; their older values stay).
  struct Sample {
    double value, at, done;
  };
  std::map<std::string, Sample> last;
  double last_scrape_at = 0;

 private:
  Proc() = default;
  std::unique_ptr<test::Process> process_;
};

// One line of a worker's --ack-log.
struct Ack {
  double at;  // unix seconds, when the client reported it
  uint64_t seq;
  uint64_t clock;
  uint64_t samples;  // in its batch (0: an empty push, no training)
  // With --replicas: (range, epoch) of each shard that acknowledged it.
  std::vector<std::pair<uint32_t, uint64_t>> epochs;
};

// One block of a shard's --ledger file (replicated jobs): a range it
// served (primary) or held a replica of (backup) when it left.
struct LedgerBlock {
  size_t shard = 0;  // the file's shard index
  uint32_t range = 0;
  bool primary = false;
  // Its shard was cut off while the range failed over (role deposed;
  // epoch: the range's epoch that superseded it): neither the range's
  // primary nor a backup.
  bool deposed = false;
  uint64_t epoch = 0, record = 0, pushes = 0, doubles = 0;
  bool last = false;
  std::string crc;
  AppliedLedger ledger;
};

struct Verdict {
  std::string key;  // the invariant's key in the scenario (lost_bound, ...)
  std::string name;
  bool pass = true;
  std::string detail;
  // false: nothing to check in this scenario (printed N/A; it neither
  // passes nor fails).
  bool applicable = true;
};

class Runner {
 public:
  // `dir`: every process's logs and the journals. `bin_dir`: where the
  // binaries are. `netns`: each process in its own network namespace
  // (netns.h); else all on 127.0.0.1.
  // `clock`: what its waits and timers count on.
  Runner(Scenario s, std::string dir, std::string bin_dir, uint64_t seed, bool netns,
         const Clock* clock = Clock::Real())
      : s_(std::move(s)),
        dir_(std::move(dir)),
        bin_(std::move(bin_dir)),
        seed_(seed),
        netns_(netns),
        clock_(clock) {}
  ~Runner();

  // The whole run: exit code 0 when it passed (every invariant holds but
  // those the scenario expects to fail, and those fail), 1 when not, 2 for
  // a bad --out, 77 when --netns cannot run here.
  int Run();

 private:
  // --- the cluster (runner.cc) ----------------------------------------------
  std::string Bin(const std::string& name) const;
  // Where node `node` ("monitor", "ctl", "shard0", "worker1") binds, and the
  // namespace it runs in ("" without --netns).
  std::string Host(const std::string& node) const;
  std::string Ns(const std::string& node) const;
  // Empties an earlier run's --out, refuses a stranger's; kExitOk or why not.
  int PrepareOutDir();
  // --netns: the namespaces for every process the scenario can start;
  // kExitSkip when they cannot be made here.
  std::optional<int> SetUpNetns();
  bool MakeNodes();
  // --netns: lifts the partitions whose time is up (all with `all`).
  void LiftPartitions(bool all = false);
  // The monitor, the shards and the workers; kExitOk or kExitFailure.
  int StartCluster();
  bool StartMonitor(const std::string& listen);
  bool StartShard(size_t i);
  bool StartWorker();
  // Until every worker has an acknowledged push (t0_); then the ids of
  // shards and workers, for fault targets.
  int WaitForTraining();
  // The timeline's actions at their times, scraping between them, and
  // scraping on until 4 s before the end.
  void PlayTimeline();
  // Exports the model and evaluates it (final_accuracy).
  void EvaluateModel();
  // Waits for every process to leave by itself after the job stops; the
  // names of those still running 20 s later. Then kills what is left.
  std::vector<std::string> WaitForEveryoneToLeave();
  std::vector<Proc*> All();
  Proc* Target(const std::string& target);
  // Sleeps ~250 ms between scrapes until `until` on the runner's clock.
  void ScrapeUntil(TimePoint until);
  void Scrape();
  // Sleeps `d` on the runner's clock.
  void Pause(Duration d) const { clock_->SleepUntil(clock_->Now() + d); }
  int Ctl(const std::vector<std::string>& args, std::string* out = nullptr);
  std::string FaultTarget(const std::string& t);
  // "backup:I" as the "shard:J" that backs up shard I's range when an
  // action first names it (pacerctl status; "" when none), the same shard
  // for later actions; any other target as it is.
  std::string Resolve(const std::string& t);
  std::string ResolveNow(const std::string& t);
  std::map<std::string, std::string> resolved_;
  // Worker `worker`'s journal; with `durable`, also the highest seq its
  // "durable" lines name (every acknowledged push through it is durable).
  std::vector<Ack> Acks(size_t worker, uint64_t* durable = nullptr) const;
  // The shards' --ledger files (replicated jobs).
  std::vector<LedgerBlock> Ledgers() const;

  // --- the timeline's actions (runner.cc): false when it could not be done
  bool Do(const Action& a);
  bool DoKill(const Action& a, double now);
  bool DoRestart(const Action& a, double now);
  bool DoStopOrCont(const Action& a, double now);
  bool DoAddWorker(double now);
  bool DoSlow(const Action& a, double now);
  bool DoAddShard();
  bool DoDrainShard(const Action& a);
  bool DoCut(const Action& a);
  bool DoFaults(const Action& a, double now);
  bool DoClearFaults(double now);

  // --- the invariants (invariants.cc): each adds its verdict --------------
  void CheckInvariants();
  void CheckProgress();
  void CheckNoCrash();
  void CheckNoHang();
  void CheckLostBound();
  void CheckNoDoubleApply();
  // Replicated jobs (the shards' ledgers): every push journalled durable is
  // in its range's final primary; each backup equals its primary.
  void CheckDurableKept();
  void CheckAckedKept();
  void CheckReplicasIdentical();
  // Per range, the journals' acknowledgements at each epoch all come
  // before the first at a higher epoch.
  void CheckNoSplitBrain();
  void CheckFinalAccuracy();
  void CheckFaultsInMetrics();
  // --data-stream: each training index once per epoch (the workers'
  // --sample-log files against the monitor's "epoch E done" lines).
  void CheckOncePerEpoch();
  // Prints the verdicts; true when the run passed.
  bool Report();

  Scenario s_;
  std::string dir_, bin_;
  uint64_t seed_;
  bool netns_;
  const Clock* const clock_;
  std::unique_ptr<NetnsLab> lab_;                      // before procs_: its namespaces outlive them
  std::vector<std::pair<TimePoint, std::string>> lifts_;  // --netns: (when, node) to let back
  std::string monitor_address_;
  std::vector<std::unique_ptr<Proc>> procs_;  // every process ever started
  Proc* monitor_ = nullptr;
  std::vector<Proc*> shards_, workers_;  // current incarnations, by index
  std::vector<uint32_t> shard_ids_, worker_ids_;
  std::vector<std::string> journals_;  // by worker index
  std::vector<std::string> sample_logs_;  // by worker index (--sample-log)
  // Training started: in Unix seconds (what the journals and heals are
  // compared with) and on the runner's clock (what its waits count from).
  double t0_ = 0;
  TimePoint t0_at_{};
  std::vector<double> heals_;          // unix s
  struct Kill {
    size_t shard;
    double at;
  };
  std::vector<Kill> shard_kills_;
  std::vector<std::thread> slowers_;  // slow: one SIGSTOP/SIGCONT cycler each
  double max_disk_delay_ = 0;         // the longest slow_disk delay injected (s)
  struct Injected {
    std::vector<Proc*> procs;
    std::set<std::string> kinds;
    std::string what;
  };
  std::vector<Injected> injected_;
  std::vector<std::pair<std::string, std::string>> expect_monitor_;  // (metric, why) to rise
  std::optional<double> accuracy_;
  // What the checks read, once the run is over.
  double end_of_run_ = 0;          // unix s: the model taken, the job stopping
  std::vector<std::string> hung_;  // still running 20 s after the job stopped
  std::vector<Ack> all_acks_;      // every worker's journal
  std::vector<LedgerBlock> ledgers_;  // the shards' ledgers (replicated jobs)
  std::vector<Verdict> verdicts_;
};

}  // namespace pacer::chaos

#endif  // PACER_TESTS_CHAOS_RUNNER_H_
