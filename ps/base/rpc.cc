#include "ps/base/rpc.h"

#include <algorithm>

#include "absl/strings/cord.h"

namespace pacer {
namespace {
constexpr char kCodeUrl[] = "pacer.wire.ErrorCode";

absl::StatusCode CanonicalCode(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::NotReady: return absl::StatusCode::kUnavailable;
    case wire::ErrorCode::DeadlineExceeded: return absl::StatusCode::kDeadlineExceeded;
    case wire::ErrorCode::Stale:
    case wire::ErrorCode::NotMember:
    case wire::ErrorCode::Refused: return absl::StatusCode::kFailedPrecondition;
    case wire::ErrorCode::BadCrc: return absl::StatusCode::kDataLoss;
    default: return absl::StatusCode::kInvalidArgument;
  }
}
}  // namespace

absl::Status ErrorStatus(wire::ErrorCode code, const std::string& reason) {
  absl::Status s(CanonicalCode(code), std::string(ErrorCodeName(code)) + ": " + reason);
  s.SetPayload(kCodeUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return s;
}

absl::Status StatusFromError(const msg::Error& error) { return ErrorStatus(error.code, error.reason); }

std::string ErrorText(const absl::Status& status) {
  // A peer's Error reply already names its wire code in the message
  // ("Refused: ..."): the canonical code in front would say it twice.
  if (WireCode(status) != wire::ErrorCode::Unknown) return std::string(status.message());
  return status.ToString(absl::StatusToStringMode::kWithNoExtraData);
}

wire::ErrorCode WireCode(const absl::Status& status) {
  auto p = status.GetPayload(kCodeUrl);
  if (!p) return wire::ErrorCode::Unknown;
  return static_cast<wire::ErrorCode>(std::stoi(std::string(*p)));
}

absl::StatusOr<std::unique_ptr<RpcChannel>> RpcChannel::Connect(Transport* transport,
                                                                const std::string& address,
                                                                const RpcOptions& options) {
  auto s = transport->Connect(address);
  if (!s.ok()) return s.status();
  return std::unique_ptr<RpcChannel>(new RpcChannel(transport, std::move(*s), address, options));
}

absl::StatusOr<std::optional<Decoded>> RpcChannel::TryTake(uint64_t request_id) {
  Frames frames;
  absl::StatusOr<bool> got = socket_->TryRecv(&frames);
  if (!got.ok()) return got.status();
  if (!*got) return std::optional<Decoded>();
  return Match(frames, request_id);
}

absl::StatusOr<std::optional<Decoded>> RpcChannel::Match(const Frames& frames, uint64_t request_id) {
  DecodeOptions dopts;
  dopts.job_id = options_.job_id;
  dopts.check_job = options_.check_job;
  dopts.max_message_bytes = options_.max_message_bytes;
  dopts.check_crc = options_.check_crc;
  dopts.defer_pull_reply_payload = options_.defer_pull_reply_payload;
  Decoded d;
  DecodeError err;
  if (!Decode(frames, dopts, &d, &err)) {
    if (err.env && err.env->request_id != request_id) return std::optional<Decoded>();
    return absl::DataLossError("bad reply from " + address_ + ": " + err.reason);
  }
  if (d.env.request_id != request_id) return std::optional<Decoded>();  // late reply
  if (d.type() == wire::Body::Error) return StatusFromError(msg::Read<msg::Error>(d));
  return std::optional<Decoded>(std::move(d));
}

absl::StatusOr<std::optional<Decoded>> RpcChannel::MatchAny(const Frames& frames,
                                                            std::span<const uint64_t> request_ids,
                                                            size_t* which) {
  DecodeOptions dopts;
  dopts.job_id = options_.job_id;
  dopts.check_job = options_.check_job;
  dopts.max_message_bytes = options_.max_message_bytes;
  dopts.check_crc = options_.check_crc;
  dopts.defer_pull_reply_payload = options_.defer_pull_reply_payload;
  auto find = [&](uint64_t id) {
    return static_cast<size_t>(std::find(request_ids.begin(), request_ids.end(), id) -
                               request_ids.begin());
  };
  Decoded d;
  DecodeError err;
  if (!Decode(frames, dopts, &d, &err)) {
    if (!err.env || find(err.env->request_id) == request_ids.size()) {
      if (err.env) return std::optional<Decoded>();  // a late reply, damaged
      return absl::DataLossError("bad reply from " + address_ + ": " + err.reason);
    }
    *which = find(err.env->request_id);
    return ErrorStatus(err.code, "bad reply from " + address_ + ": " + err.reason);
  }
  const size_t i = find(d.env.request_id);
  if (i == request_ids.size()) return std::optional<Decoded>();  // late reply
  *which = i;
  if (d.type() == wire::Body::Error) return StatusFromError(msg::Read<msg::Error>(d));
  return std::optional<Decoded>(std::move(d));
}

absl::StatusOr<Decoded> RpcChannel::Wait(uint64_t request_id, TimePoint deadline) {
  const Clock* clock = transport_->clock();
  TimePoint resend = options_.resend_after > Duration::zero() ? clock->Now() + options_.resend_after
                                                              : TimePoint::max();
  for (;;) {
    Frames frames;
    absl::StatusOr<bool> got = transport_->Recv(socket_.get(), &frames, std::min(deadline, resend));
    if (!got.ok()) return got.status();
    if (!*got && clock->Now() < deadline) {
      // Lost on the way, there or back: the same request again.
      if (absl::Status s = Resend(); !s.ok()) return s;
      resend = clock->Now() + options_.resend_after;
      continue;
    }
    if (!*got) {
      return absl::DeadlineExceededError("no reply from " + address_ + " for request " +
                                         std::to_string(request_id));
    }
    absl::StatusOr<std::optional<Decoded>> r = Match(frames, request_id);
    if (!r.ok()) return r.status();
    if (r->has_value()) return std::move(**r);
  }
}

}  // namespace pacer
