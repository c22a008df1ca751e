#include "ps/base/server_core.h"

namespace pacer {

ServerCore::ServerCore(prometheus::Registry& registry, const std::string& role, const Clock* clock,
                       spdlog::level::level_enum refusal_level)
    : rejects_(registry, role),
      guard_(registry, role, clock),
      refusal_level_(refusal_level),
      who_(role) {}

void ServerCore::SetIdentity(uint64_t job_id, uint32_t sender, const std::string& who) {
  job_id_ = job_id;
  sender_ = sender;
  who_ = who;
  guard_.set_who(who);
}

Envelope ServerCore::ReplyEnvelope(const Envelope& to) const {
  Envelope env;
  env.job_id = job_id_;
  env.sender = sender_;
  env.request_id = to.request_id;
  return env;
}

Frames ServerCore::Error(const Envelope& to, wire::ErrorCode code, const std::string& reason) {
  if (code != wire::ErrorCode::DeadlineExceeded) rejects_.Inc(code);
  spdlog::log(refusal_level_, "{}: refused request {} from sender {}: {}", who_, to.request_id,
              to.sender, reason);
  return EncodeError(to, sender_, code, reason);
}

std::optional<Frames> ServerCore::Undecodable(const DecodeError& err) {
  rejects_.Inc(err.code);
  spdlog::log(refusal_level_, "{}: rejected message: {} ({})", who_, err.reason,
              ErrorCodeName(err.code));
  // Nothing identifies the request: there is nobody to answer meaningfully.
  if (!err.env) return std::nullopt;
  return EncodeError(*err.env, sender_, err.code, err.reason);
}

std::optional<Frames> ServerCore::CheckSender(const Frame& peer, const std::string& bound,
                                              const Decoded& d) {
  const std::string why = guard_.Check(peer.peer_key(), bound, d);
  if (why.empty()) return std::nullopt;
  return Error(d.env, wire::ErrorCode::Refused, why);
}

}  // namespace pacer
