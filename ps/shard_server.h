// Runs a ShardCore on a transport: binds the shard's ROUTER socket, registers
// with the monitor, then serves on one thread until the job stops.
#ifndef PACER_PS_SHARD_SERVER_H_
#define PACER_PS_SHARD_SERVER_H_

#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/fault.h"
#include "ps/base/mutex.h"
#include "ps/base/transport.h"
#include "ps/checkpoint_writer.h"
#include "ps/served_range.h"
#include "ps/shard.h"

namespace pacer {

struct ShardServerOptions {
  // Address to bind (--listen); port 0 picks an ephemeral port.
  std::string listen = "tcp://127.0.0.1:0";
  // The monitor's address (--monitor). Required.
  std::string monitor;
  // The address workers and the monitor are told to reach this shard at
  // (--advertise), e.g. behind NAT or a Kubernetes Service; empty: the bound
  // address.
  std::string advertise;
  // The host or Kubernetes node this shard runs on (--node): the monitor
  // places a range's replicas on different ones. Empty: the host of the
  // advertised address.
  std::string node;
  // Core settings (--max-message-bytes, --no-apply, ...).
  ShardOptions shard;
  // How long Start keeps trying to register with the monitor.
  Duration register_timeout = std::chrono::seconds(30);
  // Deadline of one request to the monitor.
  Duration request_timeout = std::chrono::seconds(1);
  // Interval between heartbeats to the monitor.
  Duration heartbeat_interval = std::chrono::milliseconds(200);
  // Checkpoints (--data-dir): empty means none. The shard keeps its RocksDB
  // store in DATA_DIR/checkpoint, loads the latest snapshot at start and
  // registers again under its old id. Each range it serves since a
  // promotion is checkpointed in DATA_DIR/range-<id>, and served from there
  // if the monitor gives it that range again after a restart.
  std::string data_dir;
  // A checkpoint is taken this long after the previous one (0: never on
  // time) or after this many applied pushes (0: never on count), whichever
  // comes first, and once more when the shard stops.
  Duration checkpoint_interval = std::chrono::seconds(10);
  uint64_t checkpoint_updates = 0;
  // How long the final checkpoint may take when the shard stops
  // (--stop-timeout): past it the checkpoint is given up, the previous one
  // stays, and stop_status() says why (pacer-server then exits 1).
  Duration stop_timeout = std::chrono::seconds(30);
  // The safeguards in shard.safeguards (ps/base/safeguards.h) include two
  // of the server's own, switched off only to show a chaos invariant
  // failing: checkpoints (after its first checkpoint on time or count the
  // shard takes no more, but for key moves and at exit, so a crash loses
  // everything acknowledged since) and fencing (with backups, a primary
  // that has not heard from the monitor for its shard lease stops
  // answering; off, it goes on acknowledging after a backup took its range
  // over).
  // When it leaves, the shard writes to this file (--ledger; empty: none),
  // for each range it serves or holds a replica of: its role, epoch, last
  // record, a CRC-32 of its parameters and optimizer state, and its ledger,
  // every (worker, seq) applied (ShardCore::ledger()). For audits: the
  // chaos runner checks the workers' journals of durable pushes against it.
  std::string ledger;
  // When set and true, Start stops trying to register and returns
  // Cancelled (SIGTERM before the monitor answered).
  const std::atomic<bool>* cancel = nullptr;
  // This process's fault layer (ps/base/fault.h), for the run-time faults the
  // monitor sends with its heartbeat replies; null: none.
  std::shared_ptr<FaultInjector> faults;
};

class ShardServer {
 public:
  // Binds, registers with the monitor (retrying until register_timeout) and
  // starts the serving thread. `transport` and `clock` must outlive the server.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardServer>> Start(Transport* transport,
                                                            const ShardServerOptions& options);
  ~ShardServer();

  // The bound address, e.g. tcp://127.0.0.1:40123.
  const std::string& address() const { return address_; }
  uint32_t id() const { return id_; }
  // Asks the serving thread to stop (SIGTERM): it takes a final checkpoint
  // and deregisters from the monitor. Thread-safe.
  void Shutdown() { shutdown_ = true; }
  // Whether this shard started from a checkpoint.
  bool restored() const { return restored_; }
  // Blocks until the serving thread has ended (job stopped or Shutdown).
  void Wait();
  // True once the serving thread has ended.
  bool done() const { return done_; }
  // After Wait(): OK, or why the stop was not clean (the final checkpoint
  // was given up at stop_timeout).
  const absl::Status& stop_status() const { return stop_status_; }
  // For /readyz: "" while this shard can serve: it holds no key range yet
  // (before the shard map, or idle), or holds its range's values (restored
  // from its checkpoint or initialised); else why not (its keys are
  // declared but their values not yet sent, or it is leaving). Thread-safe.
  std::string NotReadyReason() const;
  // The metrics registry (thread-safe to read).
  prometheus::Registry& registry() { return *registry_; }

 private:
  ShardServer() = default;

  // The replica set of its own range from a heartbeat reply.
  struct ReplicaConfig {
    uint64_t epoch = 0;
    std::vector<msg::ShardInfo> backups;
    std::vector<msg::ShardInfo> backing;
    bool deposed = false;  // its own range is served elsewhere (epoch: the range's)
    bool hold_durable = false;  // a standby of its range may be promoted
    bool operator==(const ReplicaConfig&) const = default;
  };
  // The ranges to serve since a promotion (each with its backups' ids) and
  // those backups, from a heartbeat reply.
  struct PromoteConfig {
    std::vector<msg::ShardInfo> ranges;
    std::vector<msg::ShardInfo> backups;
    std::vector<uint32_t> hold;  // ranges whose durability is held (a standby)
    bool operator==(const PromoteConfig&) const = default;
  };
  // What the monitor's heartbeat replies order, as one value: the
  // heartbeat thread folds each reply into the pending directive (posted
  // under mu_); the serving thread takes it whole between messages, so the
  // lease it renews never takes effect without the orders that came with
  // it (a deposing must not be missed by a shard that unfences).
  struct Directive {
    Directive();  // out of line: clang sees the defaults below only then
    // pacerctl set-lr: the overrides' version and value (the newest wins).
    std::optional<std::pair<uint64_t, std::vector<wire::GroupLr>>> lr;
    // Changed since the last reply that said otherwise (nullopt: as before).
    std::optional<PromoteConfig> promote;
    std::optional<ReplicaConfig> replication;
    // Ranges served since a promotion that failed over again elsewhere
    // (range -> its new epoch).
    std::map<uint32_t, uint64_t> deposed;
    // pacerctl drain-shard with backups: the last reply asked this primary
    // to hand its range over (hand_off), or said the drain was given up.
    bool hand_off = false;
    bool hand_off_given_up = false;
    // The shard lease, renewed with this reply: fenced past it (the
    // transport clock's nanoseconds).
    int64_t lease_until_ns = std::numeric_limits<int64_t>::max();
  };
  // What the serving thread tells the heartbeats, refreshed every 50 ms.
  struct Report {
    std::vector<msg::ShardInfo> replicas;  // replicas held (range, epoch)
    std::vector<msg::ShardInfo> serving;   // ranges served since a promotion
    std::vector<msg::ShardInfo> lagging;   // per range served: backups behind
    std::vector<msg::RangeLag> lag;        // per range served with backups
    bool handed_off = false;  // its backups hold its last record (a drain)
  };

  // The serving loop: the only user of ranges_.
  void Run();
  // Heartbeats to the monitor on their own thread and connection, so the
  // serving loop waits on one socket only; notices when the job stops.
  // After a shutdown it tells the monitor that this shard leaves.
  void HeartbeatLoop();
  // Folds one heartbeat reply into the pending directive (heartbeat thread).
  void Post(const msg::HeartbeatReply& r, int64_t lease_until_ns);
  // Carries out a directive taken from the heartbeat thread (serving thread).
  void Follow(Directive d, std::vector<ShardCore::Outgoing>* out);
  // The own range's replica set: connects to new backups, lets go of old
  // ones, and hands the set to its core; deposes it when it is served
  // elsewhere.
  void ApplyReplication(const ReplicaConfig& config, std::vector<ShardCore::Outgoing>* out);
  // Serves the ranges new to the list from their replicas (from their
  // checkpoints here when it holds none), and sets every served range's
  // backups.
  void Promote(const PromoteConfig& config);
  // The ranges taken over since a promotion (ranges_ after the first).
  std::span<ServedRange> taken_over() { return std::span<ServedRange>(ranges_).subspan(1); }
  std::span<const ServedRange> taken_over() const {
    return std::span<const ServedRange>(ranges_).subspan(1);
  }
  ShardCore& own() { return *ranges_[0].core; }
  const ShardCore& own() const { return *ranges_[0].core; }
  // The report from every served range (serving thread).
  void UpdateReport();
  // Hands a snapshot of each served range to its writer when one is due
  // (or `final`: one last snapshot of each, given up after stop_timeout,
  // which stop_status_ then says).
  void MaybeCheckpoint(bool final);
  // Leaving: how long the shard waits for its last records to be held by
  // its backups and for its replicas' last records.
  static constexpr Duration kLeaveWait = std::chrono::seconds(3);
  // Whether both have happened.
  bool ReplicationSettled() const;
  // Writes options_.ledger (serving thread, after the loop).
  void WriteLedger() const;
  // DATA_DIR/range-<id>: where a range taken over is checkpointed, apart
  // from this shard's own (DATA_DIR/checkpoint).
  absl::StatusOr<std::string> RangeCheckpointPath(uint32_t range) const;
  // A writer to that store (null, logged, when it cannot be opened; null
  // without --data-dir).
  std::unique_ptr<CheckpointWriter> RangeWriter(uint32_t range);
  // That range's latest checkpoint here (nullopt: none), for when the
  // monitor tells this shard to serve it and it holds no replica of it (it
  // restarted, and every other holder of the range is gone too).
  absl::StatusOr<std::optional<ShardSnapshot>> LoadRangeCheckpoint(uint32_t range) const;

  // Constant after Start.
  Transport* transport_ = nullptr;
  ShardServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::string address_;
  uint32_t id_ = 0;
  bool restored_ = false;
  ShardJob job_;  // from registration (the optimizer: own().job()'s is the declared one)
  // The shard lease (the monitor's --shard-lease).
  Duration shard_lease_ = std::chrono::seconds(1);
  CheckpointPolicy checkpoint_policy_;
  // Its own range's checkpoint writer (ranges_[0].writer; null without
  // --data-dir), whose age the heartbeats report (it is thread-safe).
  CheckpointWriter* own_writer_ = nullptr;
  std::thread thread_;
  std::thread heartbeat_thread_;

  // Serving thread only.
  // The ranges it serves: its own first (from registration), then each it
  // took over when the monitor promoted its replica of it (a failover),
  // which keeps its id and gets a core and a socket of its own here.
  std::vector<ServedRange> ranges_;
  // Restored from a checkpoint: its own range answers no push, pull or init
  // until the serving thread has followed the monitor's first directive
  // (which may say that a backup serves the range now, promoted because
  // this process restarted), so that nothing is acknowledged from the
  // checkpoint's older state beside that backup.
  bool awaiting_monitor_ = false;
  // pacerctl drain-shard with backups: asked to hand its range over; Leave
  // called for it; its backups hold the last record (reported).
  bool hand_off_requested_ = false;
  bool left_for_hand_off_ = false;
  bool handed_off_ = false;
  int64_t lease_until_ns_ = std::numeric_limits<int64_t>::max();
  bool fenced_ = false;
  absl::Status stop_status_;  // read after Wait()

  // The monitor gave a drain up before the backups held the last record:
  // apply again (CancelLeave).
  bool cancel_hand_off_ = false;

  // Heartbeat thread only: the connection to the monitor, and the last
  // ranges to serve and replica set heard of (a directive carries them
  // only when they change).
  std::unique_ptr<class RpcChannel> monitor_;
  PromoteConfig last_promote_;
  ReplicaConfig last_replication_;

  // The hand-over between the two threads: the monitor's orders one way,
  // the report the other.
  mutable Mutex mu_;
  std::optional<Directive> pending_ ABSL_GUARDED_BY(mu_);
  Report report_ ABSL_GUARDED_BY(mu_);

  // Signals and mirrors read by any thread.
  std::atomic<bool> shutdown_{false};       // SIGTERM (Shutdown)
  std::atomic<bool> job_stopped_{false};    // the monitor said the job stopped
  std::atomic<bool> serving_ended_{false};  // the serving loop is over
  std::atomic<bool> done_{false};
  std::atomic<bool> heartbeat_now_{false};  // a heartbeat is due at once
  std::atomic<int64_t> applied_clock_{-1};  // the own range's, for heartbeats
  std::atomic<bool> holds_values_{false};   // its own core's initialized()
  std::atomic<bool> holds_keys_{false};     // its own core's has_keys()
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_SERVER_H_
