// Request/reply over one connected (DEALER) socket: the request-tracking layer
// between the transport and the roles. Replies are matched by request id;
// a late reply to a request that already timed out is dropped.
#ifndef PACER_PS_BASE_RPC_H_
#define PACER_PS_BASE_RPC_H_

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/base/messages.h"
#include "ps/base/transport.h"
#include "ps/base/wire.h"

namespace pacer {

// An Error reply as a Status; the wire code rides along as a payload.
absl::Status StatusFromError(const msg::Error& error);
// A Status carrying wire code `code` (as StatusFromError makes them).
absl::Status ErrorStatus(wire::ErrorCode code, const std::string& reason);
// The wire error code a Status came from, or Unknown.
wire::ErrorCode WireCode(const absl::Status& status);
// A Status for people: "CODE: message", without the payloads (the wire
// code rides in one) that Status::ToString appends; a peer's Error reply
// as its message alone, which names its wire code ("Refused: ...").
std::string ErrorText(const absl::Status& status);

// A process that waits for a peer says so after this long, and again every
// kWaitingNoticeEvery, so that a wrong address is not silence.
inline constexpr Duration kWaitingNoticeFirst = std::chrono::seconds(2);
inline constexpr Duration kWaitingNoticeEvery = std::chrono::seconds(5);

struct RpcOptions {
  uint64_t job_id = 0;
  uint32_t sender = 0;
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  bool check_crc = true;
  // PullReply payloads are left to the caller's CopyCheckedPayload
  // (DecodeOptions::defer_pull_reply_payload): PsClient sets it.
  bool defer_pull_reply_payload = false;
  // When false the job id of replies is not checked (before registration).
  bool check_job = true;
  // Wait sends the request again (same id) after this long without a reply,
  // until its deadline; zero: never. For idempotent requests only.
  Duration resend_after{};
};

// Used by one thread at a time.
class RpcChannel {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RpcChannel>> Connect(Transport* transport,
                                                             const std::string& address,
                                                             const RpcOptions& options);

  // Sends a message with body `body` (finished here) and a fresh request id
  // (NewRequestId), which it returns.
  template <class T>
  absl::StatusOr<uint64_t> Send(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<T> body,
                                Frame payload = {}) {
    Envelope env;
    env.job_id = options_.job_id;
    env.sender = options_.sender;
    env.request_id = NewRequestId();
    last_sent_ = EncodeBody(env, fbb, body, std::move(payload), options_.check_crc);
    absl::Status s = socket_->Send(Frames(last_sent_));
    if (!s.ok()) return s;
    return env.request_id;
  }

  // The same for a typed message (messages.h).
  template <class M>
  absl::StatusOr<uint64_t> Send(const M& m, Frame payload = {}) {
    flatbuffers::FlatBufferBuilder fbb(256);
    return Send(fbb, msg::Build(fbb, m), std::move(payload));
  }

  // Sends the last message again, request id and all (frames are shared,
  // not copied): a retry after a timeout or a peer's restart. The receiver
  // must treat a repeated request id as the same request.
  absl::Status Resend() { return socket_->Send(Frames(last_sent_)); }

  // Takes one ready message, if any, without waiting. Returns the reply to
  // `request_id` when that is what arrived; other replies are dropped.
  // An Error reply becomes its Status; a malformed reply DataLoss.
  absl::StatusOr<std::optional<Decoded>> TryTake(uint64_t request_id);
  // The same for a message already received on this channel's socket.
  absl::StatusOr<std::optional<Decoded>> Match(const Frames& frames, uint64_t request_id);

  // The same for any of several requests outstanding on this channel:
  // *which is set to the index in `request_ids` of the one answered
  // (also when the answer is an Error, returned as its Status).
  absl::StatusOr<std::optional<Decoded>> MatchAny(const Frames& frames,
                                                  std::span<const uint64_t> request_ids,
                                                  size_t* which);
  // The frames of the last message sent (shared, not copied), to send again
  // later through socket() when several requests are outstanding.
  const Frames& last_sent() const { return last_sent_; }

  // Waits until `deadline` for the reply to `request_id`.
  absl::StatusOr<Decoded> Wait(uint64_t request_id, TimePoint deadline);

  // Send, then Wait.
  template <class T>
  absl::StatusOr<Decoded> Call(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<T> body,
                               TimePoint deadline, Frame payload = {}) {
    absl::StatusOr<uint64_t> id = Send(fbb, body, std::move(payload));
    if (!id.ok()) return id.status();
    return Wait(*id, deadline);
  }

  // The same for a typed message (messages.h).
  template <class M>
  absl::StatusOr<Decoded> Call(const M& m, TimePoint deadline, Frame payload = {}) {
    absl::StatusOr<uint64_t> id = Send(m, std::move(payload));
    if (!id.ok()) return id.status();
    return Wait(*id, deadline);
  }

  Socket* socket() { return socket_.get(); }
  Transport* transport() { return transport_; }
  const std::string& address() const { return address_; }
  RpcOptions& options() { return options_; }

 private:
  RpcChannel(Transport* t, std::unique_ptr<Socket> s, std::string address, const RpcOptions& o)
      : transport_(t), socket_(std::move(s)), address_(std::move(address)), options_(o) {}

  Transport* transport_;
  std::unique_ptr<Socket> socket_;
  std::string address_;
  RpcOptions options_;
  Frames last_sent_;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_RPC_H_
