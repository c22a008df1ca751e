// The client library workers link: it splits a push or pull by shard, runs
// the per-shard requests concurrently, and merges the replies into one flat
// parameter vector laid out in key order.
#ifndef PACER_PS_CLIENT_H_
#define PACER_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/messages.h"
#include "ps/base/rpc.h"
#include "ps/base/safeguards.h"
#include "ps/base/transport.h"
#include "ps/partition.h"

namespace pacer {

struct ShardEntry {
  uint32_t id = 0;
  std::string address;
  KeyRange range;
  std::string public_key{};  // CURVE (Z85); empty without transport security
  // Its range's backups (monitor --replicas) and epoch: with backups, each
  // push to it is kept until the shard says it is durable.
  std::vector<uint32_t> backups{};
  uint64_t epoch = 0;
};

struct ShardMapInfo {
  uint64_t version = 0;
  std::vector<ShardEntry> shards;
};

// Copies a shard map as a message carries it (null: an empty map).
ShardMapInfo ShardMapFromWire(const msg::ShardMap& map);
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
  // kResendHeld: pushes kept until durable go again to a range's new owner.
  // Off only to show a chaos invariant failing (pacer-worker
  // --unsafe-disable resend-held): they are dropped instead.
  Safeguards safeguards;
  // When set and above the client's map version, a waiting request gives up
  // (Aborted, "shard map changed") within ~50 ms, so that the caller can
  // SetMap and retry.
  const std::atomic<uint64_t>* latest_map_version = nullptr;
  // Allocates the flat parameter and gradient buffers (`floats` values,
  // zeroed). A GPU backend hands out page-locked memory here, which it
  // copies from and to directly. Unset: ordinary memory.
  std::function<std::shared_ptr<float>(size_t floats)> allocate;
};

// One flat range [begin, end) of the gradient, final at one point of the
// backward pass (a layer's weights and bias).
struct FlatRange {
  size_t begin = 0;
  size_t end = 0;
};

// Used by one thread at a time; make one client per thread.
class PsClient {
 public:
  // `keys` need not be sorted; the flat layout follows ascending key order.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PsClient>> Create(Transport* transport,
                                                          const ClientOptions& options,
                                                          const ShardMapInfo& map,
                                                          std::vector<wire::KeyLen> keys);

  // The flat parameter and gradient vectors (owned by the client, stable).
  std::span<float> params() { return {params_.get(), size_}; }
  std::span<float> grads() { return {grads_.get(), size_}; }
  const std::vector<wire::KeyLen>& keys() const { return keys_; }
  const std::vector<Slice>& slices() const { return slices_; }

  // Switches to a newer shard map: reconnects to shards whose address
  // changed and re-splits the keys. Keeps params() and grads().
  absl::Status SetMap(const ShardMapInfo& map);
  uint64_t map_version() const { return map_.version; }

  // Sends params() to every shard as its initial values.
  absl::Status Init();

  // One asynchronous vocabulary: a push and a pull are each started and
  // finished (Start*/Finish*), so that the caller computes or prepares the
  // next batch in between; Push and Pull below are their compositions.
  //
  // StartPush sends a push of grads() for `clock` (a batch-mean gradient
  // over `batch` samples; retry: the previous push's seq again), PushStage
  // sends the parts a finished stage completes (a layer-wise push, see
  // SetPushStages), FinishPush sends what is left and waits until every
  // shard has the whole push.
  void StartPush(uint64_t clock, uint32_t batch, bool retry = false);
  // Stage `stage` is final in grads(): sends every part it completes
  // without waiting, and takes any replies already there.
  absl::Status PushStage(size_t stage);
  // Sends the parts not sent yet (all of them when no stage was reported),
  // then waits for every shard to have the whole push. The same errors as
  // Push.
  absl::Status FinishPush();
  // StartPull sends a pull for `clock` (latest: the current values, not
  // waiting on the barrier); FinishPull waits and returns the lowest clock
  // the shards have applied through.
  absl::Status StartPull(uint64_t clock, bool latest = false);
  absl::StatusOr<int64_t> FinishPull();

  // The blocking calls. Push(clock, batch, retry) is StartPush(clock,
  // batch, retry) then FinishPush(); what a push carries and means:
  // grads() goes to every shard concurrently (an empty push to shards
  // without our keys), zero-copy: after an error return, a send to another
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
  // Pull(clock, latest) is StartPull(clock, latest) then FinishPull():
  // it pulls the parameters for `clock` into params(), concurrently from
  // every shard. latest=true reads the current values without waiting on the
  // barrier. Returns the lowest clock the shards have applied through.
  absl::StatusOr<int64_t> Pull(uint64_t clock, bool latest = false);

  // The learning rate the following pushes ask for, per parameter group
  // (a scheduler on the worker's side; the shards' precedence rule decides,
  // see ps/shard.h). Empty: none asked for, each group steps at its own.
  void SetLearningRates(std::vector<wire::GroupLr> lrs) { push_lrs_ = std::move(lrs); }

  // A layer-wise push: the same push, sent while the gradient is still
  // being computed. SetPushStages names the ranges of grads() in the order
  // the backward pass finishes them (stage 0 first); a key is sent once
  // every stage that touches it is done, in its shard's part for that
  // stage (a push in Push.parts messages, see the schema). Each shard whose
  // keys span several stages gets its push in several messages; a shard
  // with one stage gets one message, as from Push. Empty: one message per
  // shard. Survives SetMap.
  void SetPushStages(std::vector<FlatRange> stages);
  // Messages sent by the pushes so far, and how many of them were parts of
  // a push in several parts (for metrics and tests).
  uint64_t push_messages() const { return push_messages_; }
  uint64_t push_parts() const { return push_parts_; }

  // The sequence number of the last push (0: none yet).
  uint64_t push_seq() const { return push_seq_; }
  // Of the last Pull: the longest any shard held it on its consistency rule
  // (the rest of its latency is communication).
  double last_wait_seconds() const { return last_wait_seconds_; }

  // Replication (ranges with backups, monitor --replicas). A push to such a
  // range is kept (its part of the gradient copied) until a push or pull
  // reply from the range says it is durable (durable_seq). After SetMap
  // gives the range another address (a failover, a restart), the
  // next push first sends every kept push again to the new owner, in seq
  // order and with the same (worker, seq), which applies each at most once.
  // Pushes kept now, over all ranges, and their values.
  size_t held_pushes() const;
  size_t held_values() const;
  // Pushes sent again to a new owner so far.
  uint64_t resent_pushes() const { return resent_pushes_; }
  // Every acknowledged push through this seq is durable on every range: a
  // range without backups holds it once it is acknowledged, one with
  // backups once a reply said so (0: none yet).
  uint64_t durable_through() const;
  // Epochs (monitor --replicas): each push and pull names its range's
  // epoch in this client's map, and a shard whose range is at a higher one
  // answers NotOwner (Push and Pull then return Aborted: take the newer
  // map). The epoch each shard of the current map last answered with, in
  // map order (0: none known, or no answer yet); for audits (the workers'
  // --ack-log).
  const std::vector<uint64_t>& answered_epochs() const { return answered_epochs_; }
  const ShardMapInfo& map() const { return map_; }

 private:
  PsClient() = default;
  // Sends one request per slice built by `build`, then waits for all replies,
  // calling `on_reply` for each. The first error wins.
  template <class Build, class OnReply>
  absl::Status Broadcast(Build build, OnReply on_reply);

  // A round of requests, at least one per shard, whose replies are awaited
  // together (a push, a pull, an init). A shard is done when its reply
  // comes (a push in parts: when a reply says complete).
  struct Request {
    size_t shard = 0;
    uint64_t id = 0;
    Frames frames;  // to send again
    TimePoint resend_at{};
    Duration backoff{};
    bool answered = false;
  };
  struct Round {
    bool active = false;
    bool parts = false;  // replies are PushReplys that say whether complete
    TimePoint deadline{};
    std::vector<Request> requests;
    std::vector<uint32_t> expected;  // per shard: messages in this round
    std::vector<uint32_t> sent;      // per shard
    std::vector<bool> done;          // per shard
    std::function<absl::Status(size_t shard, const Decoded&)> on_reply;
  };
  void BeginRound(bool parts, std::function<absl::Status(size_t, const Decoded&)> on_reply);
  // Sends one request of the round to shard `shard`, built by `build`.
  template <class Build>
  absl::Status SendInRound(size_t shard, Build build);
  // Takes the replies that arrived; with wait=true, until every shard is
  // done (or an error). Ends the round on success or error (wait=true).
  absl::Status Drain(bool wait);
  // What one reply (or error) to request `r` means.
  absl::Status TakeReply(size_t r, absl::StatusOr<std::optional<Decoded>> reply);
  // The parts of every shard's push per stage (after SetMap or SetPushStages).
  void PlanParts();
  absl::Status SendPart(size_t shard, size_t part);
  // `s` from shard index `i`, with the shard named and the wire code kept.
  absl::Status ShardError(size_t i, const absl::Status& s) const;

  Transport* transport_ = nullptr;
  ClientOptions options_;
  ShardMapInfo map_;
  std::vector<wire::KeyLen> keys_;
  std::vector<Slice> slices_;
  std::vector<std::unique_ptr<RpcChannel>> channels_;  // one per shard
  size_t size_ = 0;
  std::shared_ptr<float> params_;
  std::shared_ptr<float> grads_;
  Round round_;
  // Layer-wise push: the stages, and per shard its parts (runs of keys of
  // one stage; stage == stages_.size(): sent by FinishPush).
  struct Part {
    size_t stage = 0;
    size_t first_key = 0;
    size_t num_keys = 0;
    size_t offset = 0;
    size_t length = 0;
  };
  std::vector<FlatRange> stages_;
  std::vector<std::vector<Part>> parts_;  // per shard
  std::vector<std::vector<bool>> part_sent_;
  uint64_t push_clock_ = 0;
  uint32_t push_batch_ = 0;
  uint64_t push_messages_ = 0;
  uint64_t push_parts_ = 0;
  // Of the pull in flight.
  int64_t pull_applied_ = 0;
  uint64_t pull_steps_ = 0;
  double last_wait_seconds_ = 0;
  // What the last successful Pull read (lowest over the shards).
  std::optional<int64_t> read_applied_;
  std::optional<uint64_t> read_steps_;
  uint64_t push_seq_ = 0;
  std::vector<wire::GroupLr> push_lrs_;  // SetLearningRates

  // Replication: the pushes kept per range (by its first key), not yet
  // durable, in seq order; the owner and epoch they went to; whether they
  // must go again to a new owner before the next push.
  struct HeldPush {
    uint64_t seq = 0, clock = 0;
    uint32_t batch = 0;
    std::optional<int64_t> read_applied;
    std::optional<uint64_t> read_steps;
    std::vector<wire::GroupLr> lrs;
    std::vector<wire::KeyLen> keys;
    std::shared_ptr<std::vector<float>> values;
  };
  struct HeldRange {
    uint64_t end = 0;  // the range's end key
    std::string address;
    uint64_t epoch = 0;
    uint64_t durable = 0;  // the highest durable_seq heard
    bool resend = false;
    std::deque<HeldPush> pushes;
  };
  std::map<uint64_t, HeldRange> held_;
  // Buffers of pushes that became durable, for the next ones kept: no
  // allocation (and no fresh pages) per push. kSpareHeld at most (each the
  // size of a range's part of the gradient: a few per range while asp's
  // records wait for more pushes).
  std::vector<std::shared_ptr<std::vector<float>>> spare_held_;
  static constexpr size_t kSpareHeld = 16;
  uint64_t resent_pushes_ = 0;
  std::vector<uint64_t> answered_epochs_;  // per shard of map_
  // A reply from shard i said its range is durable through `seq`.
  void Durable(size_t shard, uint64_t seq);
  // Keeps the push just acknowledged by every shard, for ranges with backups.
  void HoldPush();
  // Sends the kept pushes of ranges that changed owner again, one seq at a
  // time (a round each), before a new push.
  absl::Status ResendHeld();
  bool resending_ = false;  // the round in flight is ResendHeld's
  absl::Status resend_error_;  // StartPush's ResendHeld failed: FinishPush says so
};

}  // namespace pacer

#endif  // PACER_PS_CLIENT_H_
