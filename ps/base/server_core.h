// The request plumbing both cores share (ShardCore, MonitorCore): the
// envelope of a reply, an error reply (counted by reason in
// pacer_rejected_messages_total{role} and logged), a message that could
// not be decoded, and the sender check under CURVE (sender_guard.h).
#ifndef PACER_PS_BASE_SERVER_CORE_H_
#define PACER_PS_BASE_SERVER_CORE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "prometheus/registry.h"
#include "ps/base/clock.h"
#include "ps/base/frame.h"
#include "ps/base/metrics.h"
#include "ps/base/sender_guard.h"
#include "ps/base/wire.h"
#include "spdlog/spdlog.h"

namespace pacer {

// Single-threaded, as its core.
class ServerCore {
 public:
  // `role` labels the metrics ("shard", "monitor") and names this process
  // in logs until SetIdentity; refusals are logged at `refusal_level`.
  ServerCore(prometheus::Registry& registry, const std::string& role, const Clock* clock,
             spdlog::level::level_enum refusal_level);

  // Who answers: the job and this process's sender id (0: the monitor),
  // and its name in logs ("shard 3").
  void SetIdentity(uint64_t job_id, uint32_t sender, const std::string& who);

  // The envelope of a reply to `to`.
  Envelope ReplyEnvelope(const Envelope& to) const;
  // An error reply to `to`, logged; counted unless `code` is
  // DeadlineExceeded (a pull that waited its whole time is no refusal).
  Frames Error(const Envelope& to, wire::ErrorCode code, const std::string& reason);
  // A message Decode refused, counted and logged: the error reply when its
  // envelope could be read, else nullopt (nobody to answer).
  std::optional<Frames> Undecodable(const DecodeError& err);
  // Under CURVE: nullopt when the sender of `d`, which came from `peer`,
  // may speak with that key (`bound`: the key its sender id is bound to,
  // "" when none is); else the Refused reply (counted; logged by the guard).
  std::optional<Frames> CheckSender(const Frame& peer, const std::string& bound, const Decoded& d);

  // For the checks a core makes itself (operators, registration claims).
  SenderGuard& guard() { return guard_; }
  double rejected(wire::ErrorCode code) const { return rejects_.Value(code); }

 private:
  RejectCounters rejects_;
  SenderGuard guard_;
  spdlog::level::level_enum refusal_level_;
  uint64_t job_id_ = 0;
  uint32_t sender_ = 0;
  std::string who_;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_SERVER_CORE_H_
