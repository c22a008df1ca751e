#include "ps/base/sender_guard.h"

#include <functional>
#include <string_view>

#include "spdlog/spdlog.h"

namespace pacer {

bool LogThrottle::Allow(const std::string& what, uint64_t* left_out) {
  const TimePoint now = clock_->Now();
  Entry& e = entries_[what];
  if (e.logged && now - e.last < every_) {
    ++e.left_out;
    return false;
  }
  *left_out = e.left_out;
  e.left_out = 0;
  e.last = now;
  e.logged = true;
  return true;
}

SenderGuard::SenderGuard(prometheus::Registry& registry, std::string who, const Clock* clock,
                         size_t window)
    : who_(std::move(who)), window_(window), log_(clock) {
  auto& family = prometheus::BuildCounter()
                     .Name("pacer_security_refused_messages_total")
                     .Help("Messages refused under transport security: the sender id they "
                           "claim belongs to another CURVE key, their request id came from "
                           "that key before with other contents, or a command that changes "
                           "the job came from a key that is not an operator's")
                     .Register(registry);
  key_mismatch_ = &family.Add({{"reason", "sender_key_mismatch"}});
  id_reused_ = &family.Add({{"reason", "request_id_reused"}});
  not_operator_ = &family.Add({{"reason", "not_operator"}});
}

void SenderGuard::Refuse(prometheus::Counter* counter, const std::string& reason,
                         const std::string& line) {
  counter->Increment();
  uint64_t left_out = 0;
  if (!log_.Allow(reason, &left_out)) return;
  if (left_out > 0) {
    spdlog::warn("{}: {} ({} more refused for the same reason since the last line)", who_, line,
                 left_out);
  } else {
    spdlog::warn("{}: {}", who_, line);
  }
}

std::string SenderGuard::CheckClaim(const std::string& key, const std::string& bound,
                                    const std::string& what) {
  if (key.empty() || bound.empty() || bound == key) return "";
  Refuse(key_mismatch_, "sender_key_mismatch",
         "refused a message claiming " + what + " from key " + key + " (bound to " + bound + ")");
  return what + " belongs to another key";
}

std::string SenderGuard::Check(const std::string& key, const std::string& bound,
                               const Decoded& d) {
  if (key.empty()) return "";  // plain ZeroMQ
  if (std::string why = CheckClaim(key, bound, "sender " + std::to_string(d.env.sender));
      !why.empty()) {
    return why;
  }
  const std::string_view header(reinterpret_cast<const char*>(d.header.data()), d.header.size());
  // The envelope check covers the block checks, so the payload too.
  uint64_t digest = std::hash<std::string_view>{}(header) ^ d.env.check ^
                    static_cast<uint64_t>(d.env.type) * 0xC2B2AE3D27D4EB4Full ^
                    d.env.payload_bytes * 0x9E3779B97F4A7C15ull;
  if (d.env.check == 0 && !d.payload.empty()) {
    // No checks (--unsafe-disable crc-check) to tell payloads apart: hash it instead.
    digest ^= std::hash<std::string_view>{}(std::string_view(
                  reinterpret_cast<const char*>(d.payload.data()), d.payload.size())) *
              0xC2B2AE3D27D4EB4Full;
  }
  const std::pair<uint64_t, uint64_t> id{std::hash<std::string>{}(key), d.env.request_id};
  auto [it, fresh] = seen_.emplace(id, digest);
  if (fresh) {
    order_.push_back(id);
    if (order_.size() > window_) {
      seen_.erase(order_.front());
      order_.pop_front();
    }
    return "";
  }
  if (it->second == digest) return "";  // the same request again: a retry
  Refuse(id_reused_, "request_id_reused",
         "refused request " + std::to_string(d.env.request_id) + " from key " + key +
             ": that key sent another request with this id");
  return "request id " + std::to_string(d.env.request_id) + " was used before for another request";
}

std::string SenderGuard::CheckOperator(const std::string& key,
                                       const std::vector<std::string>& operators,
                                       const std::string& what) {
  if (key.empty()) return "";
  for (const std::string& k : operators) {
    if (k == key) return "";
  }
  Refuse(not_operator_, "not_operator",
         "refused " + what + " from key " + key + ": not an operator key");
  return what + " needs an operator key (an allowed key named 'operator' or 'operator-...')";
}

double SenderGuard::refused(const std::string& reason) const {
  if (reason == "sender_key_mismatch") return key_mismatch_->Value();
  if (reason == "request_id_reused") return id_reused_->Value();
  if (reason == "not_operator") return not_operator_->Value();
  return 0;
}

}  // namespace pacer
