// The fault handlings a chaos scenario may switch off (--unsafe-disable
// NAME) to show that the invariant each protects then fails (tests/chaos/).
// Every one is on in a real run. They travel together in one value, and the
// code a safeguard guards asks On(...) for it; no option struct has a field
// per switch. Names as --unsafe-disable takes them (ps/base/cli.h).
#ifndef PACER_PS_BASE_SAFEGUARDS_H_
#define PACER_PS_BASE_SAFEGUARDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pacer {

enum class Safeguard : uint8_t {
  kDedup,        // "dedup": a shard applies each (worker, push seq) once
  kCrcCheck,     // "crc-check": a shard verifies the checks of what arrives
  kDurableWait,  // "durable-wait": a push is durable once every backup holds it
  kCheckpoints,  // "checkpoints": a shard checkpoints on time and on count
  kFencing,      // "fencing": a primary cut off from the monitor stops answering
  kLeaseExpiry,  // "lease-expiry": the monitor declares a silent worker dead
  // The workers' (worker/trainer.h, ps/client.h):
  kRetry,           // "retry": an unanswered push or pull is sent again
  kStopInterrupt,   // "stop-interrupt": requests in flight end when the job stops
  kResendHeld,      // "resend-held": pushes not yet durable go to a range's new owner
  kExactPositions,  // "exact-positions": a chunk's position is what was acknowledged
};

class Safeguards {
 public:
  // All on.
  Safeguards() = default;
  bool On(Safeguard s) const { return (off_ & Bit(s)) == 0; }
  Safeguards& SwitchOff(Safeguard s) {
    off_ |= Bit(s);
    return *this;
  }
  // The safeguard --unsafe-disable calls `name` (nullopt: none of these).
  static std::optional<Safeguard> Named(std::string_view name) {
    if (name == "dedup") return Safeguard::kDedup;
    if (name == "crc-check") return Safeguard::kCrcCheck;
    if (name == "durable-wait") return Safeguard::kDurableWait;
    if (name == "checkpoints") return Safeguard::kCheckpoints;
    if (name == "fencing") return Safeguard::kFencing;
    if (name == "lease-expiry") return Safeguard::kLeaseExpiry;
    if (name == "retry") return Safeguard::kRetry;
    if (name == "stop-interrupt") return Safeguard::kStopInterrupt;
    if (name == "resend-held") return Safeguard::kResendHeld;
    if (name == "exact-positions") return Safeguard::kExactPositions;
    return std::nullopt;
  }
  bool operator==(const Safeguards&) const = default;

 private:
  static uint32_t Bit(Safeguard s) { return uint32_t{1} << static_cast<uint32_t>(s); }
  uint32_t off_ = 0;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_SAFEGUARDS_H_
