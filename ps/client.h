// The client library workers link: it splits a push or pull by shard, runs
// the per-shard requests concurrently, and merges the replies into one flat
// parameter vector laid out in key order.
#ifndef PACER_PS_CLIENT_H_
#define PACER_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/partition.h"
#include "ps/rpc.h"
#include "ps/transport.h"

namespace pacer {

struct ShardEntry {
  uint32_t id = 0;
  std::string address;
  KeyRange range;
};

struct ShardMapInfo {
  uint64_t version = 0;
  std::vector<ShardEntry> shards;
};

// Copies a verified wire shard map.
ShardMapInfo ShardMapFromWire(const wire::ShardMap* map);

// One shard's part of the flat vector: keys [first_key, first_key+num_keys)
// of the model, values [offset, offset+length).
struct Slice {
  size_t shard = 0;  // index into ShardMapInfo::shards
  size_t first_key = 0;
  size_t num_keys = 0;
  size_t offset = 0;
  size_t length = 0;
};

// Splits `keys` (sorted by key) over the shard map. Every shard gets a slice,
// empty when it owns none of the keys. Fails when a key has no owner.
absl::StatusOr<std::vector<Slice>> SplitByShard(std::span<const wire::KeyLen> keys,
                                                const ShardMapInfo& map);

struct ClientOptions {
  RpcOptions rpc;  // job id, this worker's sender id, limits
  // Deadline for one push or pull, including time parked on the barrier.
  Duration request_timeout = std::chrono::seconds(60);
  // When set and true, a waiting request gives up (Cancelled) within ~50 ms.
  const std::atomic<bool>* cancel = nullptr;
  // A request still unanswered after this long is sent again with the same
  // request id (a shard that restarted lost it; a live one ignores the copy:
  // pushes carry a (worker, seq) id, parked pulls are matched by request id).
  Duration resend_after = std::chrono::seconds(2);
  // A shard that answers NotReady or NotMember (restarting, or not told of
  // this worker yet) is asked again after this long, doubling up to
  // resend_after, until request_timeout.
  Duration retry_backoff = std::chrono::milliseconds(50);
  // When set and above the client's map version, a waiting request gives up
  // (Aborted, "shard map changed") within ~50 ms, so that the caller can
  // SetMap and retry.
  const std::atomic<uint64_t>* latest_map_version = nullptr;
};

// Used by one thread at a time; make one client per thread.
class PsClient {
 public:
  // `keys` need not be sorted; the flat layout follows ascending key order.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(Transport* transport,
                                                          const ClientOptions& options,
                                                          const ShardMapInfo& map,
                                                          std::vector<wire::KeyLen> keys);

  // The flat parameter and gradient vectors (owned by the client, stable).
  std::span<float> params() { return {params_->data(), params_->size()}; }
  std::span<float> grads() { return {grads_->data(), grads_->size()}; }
  const std::vector<wire::KeyLen>& keys() const { return keys_; }
  const std::vector<Slice>& slices() const { return slices_; }

  // Switches to a newer shard map: reconnects to shards whose address
  // changed and re-splits the keys. Keeps params() and grads().
  absl::Status SetMap(const ShardMapInfo& map);
  uint64_t map_version() const { return map_.version; }

  // Sends params() to every shard as its initial values.
  absl::Status Init();
  // Pushes grads() (a batch-mean gradient over `batch` samples) for `clock`
  // to every shard, concurrently; an empty push to shards without our keys.
  // grads() travels zero-copy: after an error return, a send to another
  // shard may still be reading it (a change then fails that push's CRC).
  // The push names the version the gradient was computed on: the applied
  // clock and step count the last Pull returned (the shards weigh stale
  // gradients by it).
  //
  // Each push carries a new sequence number (1, 2, ...), the same for every
  // shard and every resend, so a shard applies it at most once. retry=true
  // sends the previous push's number again: the same push, after a failure
  // such as a shard-map change.
  absl::Status Push(uint64_t clock, uint32_t batch, bool retry = false);
  // The sequence number of the last push (0: none yet).
  uint64_t push_seq() const { return push_seq_; }
  // Pulls the parameters for `clock` into params(), concurrently from every
  // shard. latest=true reads the current values without waiting on the
  // barrier. Returns the lowest clock the shards have applied through.
  absl::StatusOr<int64_t> Pull(uint64_t clock, bool latest = false);
  // Of the last Pull: the longest any shard held it on its consistency rule
  // (the rest of its latency is communication).
  double last_wait_seconds() const { return last_wait_seconds_; }

 private:
  PsClient() = default;
  // Sends one request per slice built by `build`, then waits for all replies,
  // calling `on_reply` for each. The first error wins.
  template <class Build, class OnReply>
  absl::Status Broadcast(Build build, OnReply on_reply);
  // `s` from shard index `i`, with the shard named and the wire code kept.
  absl::Status ShardError(size_t i, const absl::Status& s) const;

  Transport* transport_ = nullptr;
  ClientOptions options_;
  ShardMapInfo map_;
  std::vector<wire::KeyLen> keys_;
  std::vector<Slice> slices_;
  std::vector<std::unique_ptr<RpcChannel>> channels_;  // one per shard
  std::shared_ptr<std::vector<float>> params_;
  std::shared_ptr<std::vector<float>> grads_;
  double last_wait_seconds_ = 0;
  // What the last successful Pull read (lowest over the shards).
  std::optional<int64_t> read_applied_;
  std::optional<uint64_t> read_steps_;
  uint64_t push_seq_ = 0;
};

}  // namespace pacer

#endif  // PACER_PS_CLIENT_H_
