// Runs a ShardCore on a transport: binds the shard's ROUTER socket, registers
// with the monitor, then serves on one thread until the job stops.
#ifndef PACER_PS_SHARD_SERVER_H_
#define PACER_PS_SHARD_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "ps/fault.h"
#include "ps/shard.h"
#include "ps/transport.h"

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
  // registers again under its old id.
  std::string data_dir;
  // A checkpoint is taken this long after the previous one (0: never on
  // time) or after this many applied pushes (0: never on count), whichever
  // comes first, and once more when the shard stops.
  Duration checkpoint_interval = std::chrono::seconds(10);
  uint64_t checkpoint_updates = 0;
  // false only to show a chaos invariant failing (--unsafe-disable
  // checkpoints): after its first checkpoint on time or count the shard
  // takes no more (but for key moves and at exit), so a crash loses
  // everything acknowledged since.
  bool periodic_checkpoints = true;
  // When set and true, Start stops trying to register and returns
  // Cancelled (SIGTERM before the monitor answered).
  const std::atomic<bool>* cancel = nullptr;
  // This process's fault layer (ps/fault.h), for the run-time faults the
  // monitor sends with its heartbeat replies; null: none.
  std::shared_ptr<FaultInjector> faults;
};

class ShardServer {
 public:
  // Binds, registers with the monitor (retrying until register_timeout) and
  // starts the serving thread. `transport` and `clock` must outlive the server.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(Transport* transport,
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
  // For /readyz: "" while this shard can serve: it holds no key range yet
  // (before the shard map, or idle), or holds its range's values (restored
  // from its checkpoint or initialised); else why not (its keys are
  // declared but their values not yet sent, or it is leaving). Thread-safe.
  std::string NotReadyReason() const;
  // The metrics registry (thread-safe to read).
  prometheus::Registry& registry() { return *registry_; }

 private:
  ShardServer() = default;
  // The serving loop: the only user of router_ and core_.
  void Run();
  // Heartbeats to the monitor on their own thread and connection, so the
  // serving loop waits on one socket only; notices when the job stops.
  // After a shutdown it tells the monitor that this shard leaves.
  void HeartbeatLoop();
  // Hands a snapshot to the writer when one is due (or `final`: waits for
  // the writer, then saves one last snapshot on this thread).
  void MaybeCheckpoint(bool final);
  // The checkpoint writer: saves snapshots off the serving thread.
  void WriterLoop();
  void SaveSnapshot(const ShardSnapshot& snap);

  Transport* transport_ = nullptr;
  ShardServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ShardCore> core_;
  std::unique_ptr<Socket> router_;
  std::unique_ptr<class RpcChannel> monitor_;  // used by HeartbeatLoop only
  std::string address_;
  uint32_t id_ = 0;
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> job_stopped_{false};
  std::atomic<int64_t> applied_clock_{-1};  // mirrors core_, for heartbeats
  std::atomic<bool> serving_ended_{false};
  std::atomic<bool> holds_values_{false};  // mirrors core_->initialized()
  std::atomic<bool> holds_keys_{false};    // mirrors core_->has_keys()
  bool restored_ = false;
  std::thread thread_;
  std::thread heartbeat_thread_;

  // Checkpoints.
  std::unique_ptr<CheckpointStore> store_;
  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::optional<ShardSnapshot> to_write_;  // guarded by writer_mu_
  bool writer_busy_ = false;               // guarded by writer_mu_
  bool writer_exit_ = false;               // guarded by writer_mu_
  std::thread writer_thread_;
  TimePoint last_checkpoint_{};            // serving thread only
  uint64_t updates_at_checkpoint_ = 0;     // serving thread only
  int64_t clock_at_checkpoint_ = -2;       // serving thread only
  uint64_t keys_at_checkpoint_ = 0;        // serving thread only
  uint64_t periodic_taken_ = 0;           // checkpoints on time or count (serving thread)
  std::atomic<double> last_success_unix_{0};
  double started_unix_ = 0;
  prometheus::Histogram* m_ckpt_seconds_ = nullptr;
  prometheus::Gauge* m_ckpt_bytes_ = nullptr;
  prometheus::Gauge* m_ckpt_age_ = nullptr;
  prometheus::Gauge* m_ckpt_last_ = nullptr;
  prometheus::Counter* m_ckpt_ok_ = nullptr;
  prometheus::Counter* m_ckpt_failed_ = nullptr;
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_SERVER_H_
