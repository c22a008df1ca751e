#include "monitor/key_move.h"

#include <string>
#include <vector>

#include "ps/base/messages.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {
// How long a step's request waits for its answer before it goes again.
constexpr Duration kResendAfter = std::chrono::seconds(1);
}  // namespace

KeyMove::KeyMove(size_t from, size_t to, uint64_t key_begin, uint64_t key_end, uint64_t job_id,
                 TimePoint now)
    : from_(from),
      to_(to),
      key_begin_(key_begin),
      key_end_(key_end),
      job_id_(job_id),
      started_(now) {}

Envelope KeyMove::NewEnvelope() {
  Envelope env;
  env.job_id = job_id_;
  env.request_id = request_ = NewRequestId();
  return env;
}

KeyMove::Request KeyMove::Send(size_t shard, Frames frames, Stage next, TimePoint now) {
  pending_ = std::move(frames);
  target_ = shard;
  stage_ = next;
  sent_ = now;
  return {shard, pending_};
}

KeyMove::Request KeyMove::Start(TimePoint now) {
  Frames f = EncodeMessage(NewEnvelope(), msg::MoveOut{key_begin_, key_end_, /*drop=*/false});
  return Send(from_, std::move(f), Stage::kCopying, now);
}

std::optional<KeyMove::Request> KeyMove::Resend(TimePoint now) {
  if (stage_ == Stage::kHolding || stage_ == Stage::kDone || now - sent_ < kResendAfter) {
    return std::nullopt;
  }
  sent_ = now;
  return Request{target_, pending_};
}

std::optional<KeyMove::Request> KeyMove::OnReply(size_t shard, const Decoded& reply,
                                                 TimePoint now) {
  if (shard != target_ || !Answers(reply)) return std::nullopt;
  if (reply.type() == wire::Body::Error) {
    // Not quiet yet, or the like: the same request goes again in a second.
    SPDLOG_DEBUG("shard index {} refused a move step: {}", shard,
                 msg::Read<msg::Error>(reply).reason);
    return std::nullopt;
  }
  if (stage_ == Stage::kCopying && reply.type() == wire::Body::MoveData) {
    // The keys and their values, on to the new owner.
    Frames f = EncodeMessage(NewEnvelope(), msg::Read<msg::MoveData>(reply), reply.payload);
    return Send(to_, std::move(f), Stage::kSending, now);
  }
  if (stage_ == Stage::kSending && reply.type() == wire::Body::Ack) {
    // The new owner has the keys: now the old one drops them.
    Frames f = EncodeMessage(NewEnvelope(), msg::MoveOut{key_begin_, key_end_, /*drop=*/true});
    return Send(from_, std::move(f), Stage::kDropping, now);
  }
  if (stage_ == Stage::kDropping && reply.type() == wire::Body::Ack) {
    stage_ = Stage::kDone;
    pending_.clear();
  }
  return std::nullopt;
}

}  // namespace pacer
