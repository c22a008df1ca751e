// Runs a ShardCore on a transport: binds the shard's ROUTER socket, registers
// with the monitor, then serves on one thread until the job stops.
#ifndef PACER_PS_SHARD_SERVER_H_
#define PACER_PS_SHARD_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "ps/shard.h"
#include "ps/transport.h"

namespace pacer {

struct ShardServerOptions {
  // Address to bind (--listen); port 0 picks an ephemeral port.
  std::string listen = "tcp://127.0.0.1:0";
  // The monitor's address (--monitor). Required.
  std::string monitor;
  // Core settings (--max-message-bytes, --no-apply, ...).
  ShardOptions shard;
  // How long Start keeps trying to register with the monitor.
  Duration register_timeout = std::chrono::seconds(30);
  // Deadline of one request to the monitor.
  Duration request_timeout = std::chrono::seconds(1);
  // Interval between heartbeats to the monitor.
  Duration heartbeat_interval = std::chrono::milliseconds(200);
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
  // Asks the serving thread to stop; thread-safe.
  void Shutdown() { shutdown_ = true; }
  // Blocks until the serving thread has ended (job stopped or Shutdown).
  void Wait();
  // True once the serving thread has ended.
  bool done() const { return done_; }
  // The metrics registry (thread-safe to read).
  prometheus::Registry& registry() { return *registry_; }

 private:
  ShardServer() = default;
  // The serving loop: the only user of router_ and core_.
  void Run();
  // Heartbeats to the monitor on their own thread and connection, so the
  // serving loop waits on one socket only; notices when the job stops.
  void HeartbeatLoop();

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
  std::thread thread_;
  std::thread heartbeat_thread_;
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_SERVER_H_
