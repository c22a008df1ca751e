// Moving a key range from one shard to another with nothing lost: the
// machine behind pacerctl add-shard and drain-shard, and what promoting a
// replica can reuse. The caller holds the workers at a pause clock and says
// when the cluster is quiet (Start); then three steps, each one request
// re-sent with the same id until answered (a shard answers a repeat with its
// first answer):
//   kCopying   the old owner sends the keys with their values (MoveOut),
//   kSending   the new owner adopts them (MoveData),
//   kDropping  the old owner drops them (MoveOut with drop),
// and kDone: the caller applies the new ranges to its shard map. Shards are
// known by index only; the class owns no map and no sockets.
#ifndef PACER_MONITOR_KEY_MOVE_H_
#define PACER_MONITOR_KEY_MOVE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "ps/base/clock.h"
#include "ps/base/frame.h"
#include "ps/base/wire.h"

namespace pacer {

class KeyMove {
 public:
  enum class Stage {
    kHolding,   // waiting for the cluster to be quiet
    kCopying,   // copy asked of the old owner
    kSending,   // keys sent to the new owner
    kDropping,  // drop asked of the old owner
    kDone,      // the new owner holds the keys, the old one no longer
  };
  // A request for shard `shard` (an index).
  struct Request {
    size_t shard;
    Frames frames;
  };

  // Keys [key_begin, key_end) from shard `from` to shard `to`, in job `job_id`.
  KeyMove(size_t from, size_t to, uint64_t key_begin, uint64_t key_end, uint64_t job_id,
          TimePoint now);

  // Once the cluster is quiet: the first request (kHolding -> kCopying).
  Request Start(TimePoint now);
  // The pending request again when it has gone a second unanswered.
  std::optional<Request> Resend(TimePoint now);
  // Whether `reply` answers the pending request.
  bool Answers(const Decoded& reply) const {
    return stage_ != Stage::kHolding && stage_ != Stage::kDone && reply.env.request_id == request_;
  }
  // A reply from shard `shard`: the next request, if any (none after an
  // Error, which the next Resend retries, or once done).
  std::optional<Request> OnReply(size_t shard, const Decoded& reply, TimePoint now);

  Stage stage() const { return stage_; }
  bool done() const { return stage_ == Stage::kDone; }
  size_t from() const { return from_; }
  size_t to() const { return to_; }
  uint64_t key_begin() const { return key_begin_; }
  uint64_t key_end() const { return key_end_; }
  TimePoint started() const { return started_; }

 private:
  // Makes `frames` the pending request to `shard`, in stage `next`.
  Request Send(size_t shard, Frames frames, Stage next, TimePoint now);
  Envelope NewEnvelope();

  const size_t from_, to_;
  const uint64_t key_begin_, key_end_;
  const uint64_t job_id_;
  const TimePoint started_;
  Stage stage_ = Stage::kHolding;
  size_t target_ = 0;     // the shard the pending request went to
  uint64_t request_ = 0;  // its request id
  Frames pending_;        // re-sent until answered
  TimePoint sent_{};
};

}  // namespace pacer

#endif  // PACER_MONITOR_KEY_MOVE_H_
