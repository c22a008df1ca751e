// The checks a message passes under transport security before its handler
// sees it (issue 8), shared by the monitor and the shards:
//  - its sender id must belong to the CURVE key it came with, so a frame
//    captured from one member and sent again by another, under its own key,
//    is refused;
//  - its request id must not have come from that key before with other
//    contents. Request ids never repeat (NewRequestId), and a retry sends the
//    very same frames, so a request id seen again with another header or
//    checksum is a forged message, not a retry.
// Plain ZeroMQ (no key) authenticates nothing, and nothing here checks it.
#ifndef PACER_PS_BASE_SENDER_GUARD_H_
#define PACER_PS_BASE_SENDER_GUARD_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "ps/base/clock.h"
#include "ps/base/wire.h"

namespace pacer {

// Logs at most one line per `what` every `every`; the next line logged says
// how many were left out since the one before. For refusals a hostile peer
// can cause at will.
class LogThrottle {
 public:
  explicit LogThrottle(const Clock* clock = Clock::Real(),
                       Duration every = std::chrono::seconds(10))
      : clock_(clock), every_(every) {}
  // Whether to log now; *left_out is how many were not logged since the last.
  bool Allow(const std::string& what, uint64_t* left_out);

 private:
  struct Entry {
    TimePoint last{};
    bool logged = false;
    uint64_t left_out = 0;
  };
  const Clock* const clock_;
  Duration every_;
  std::map<std::string, Entry> entries_;
};

class SenderGuard {
 public:
  // `who` names this process in logs ("monitor", "shard 3"). The request ids
  // of the last `window` requests are remembered (about 100 bytes each:
  // some 6 MB for the default window).
  // `clock` times the log throttle.
  SenderGuard(prometheus::Registry& registry, std::string who, const Clock* clock = Clock::Real(),
              size_t window = 1 << 16);

  // Empty when `d`, which came with CURVE key `key` (empty: plain ZeroMQ),
  // may go on; else why it is refused (counted and logged here). `bound`: the
  // key its sender id is bound to, empty when none is.
  std::string Check(const std::string& key, const std::string& bound, const Decoded& d);

  // The same for a claim the caller checks itself (a registration naming a
  // shard or worker that key `bound` holds): empty when `key` may make it.
  std::string CheckClaim(const std::string& key, const std::string& bound,
                         const std::string& what);

  // Empty when a command (`what`) that changes the job may come from `key`:
  // plain ZeroMQ (no key), or one of `operators`; else why it is refused
  // (counted as reason "not_operator" and logged).
  std::string CheckOperator(const std::string& key, const std::vector<std::string>& operators,
                            const std::string& what);

  void set_who(std::string who) { who_ = std::move(who); }

  double refused(const std::string& reason) const;

 private:
  void Refuse(prometheus::Counter* counter, const std::string& reason, const std::string& line);

  std::string who_;
  size_t window_;
  prometheus::Counter* key_mismatch_;
  prometheus::Counter* id_reused_;
  prometheus::Counter* not_operator_;
  // (hash of the key, request id) -> digest of the request's contents.
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> seen_;
  std::deque<std::pair<uint64_t, uint64_t>> order_;
  LogThrottle log_;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_SENDER_GUARD_H_
