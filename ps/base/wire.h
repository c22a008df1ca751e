// The wire format: a fixed envelope, a Flatbuffers header and an optional raw
// payload (see schema/pacer.fbs). Encoding and all checks on received
// messages live here, at one edge; nothing else parses bytes.
#ifndef PACER_PS_BASE_WIRE_H_
#define PACER_PS_BASE_WIRE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "flatbuffers/flatbuffers.h"
#include "ps/base/frame.h"
#include "ps/pacer_generated.h"

namespace pacer {

inline constexpr uint32_t kMagic = 0x52434150;  // "PACR" little-endian
// 2: pushes in parts (Push.part/parts, PushReply.complete). A process of
// version 1 would take a part for the whole push, so the versions do not mix.
// 3: the XXH3 envelope check and per-block payload checks below, in place of
// version 2's CRC-32 over header and payload.
inline constexpr uint16_t kProtocolVersion = 3;
// The most parts one push may come in (Push.parts).
inline constexpr uint32_t kMaxPushParts = 256;
// Frame 0's fields (magic through payload_bytes, the same offsets in every
// version), and frame 0 without its block checks: the fields and the check.
inline constexpr size_t kEnvelopeFieldBytes = 40;
inline constexpr size_t kEnvelopeBytes = kEnvelopeFieldBytes + sizeof(uint64_t);
// The payload is checked in blocks of this many bytes (the last one shorter),
// one XXH3-64 each: a receiver checks a block and copies it while it is in
// cache, and blocks can be checked on several cores.
inline constexpr size_t kCheckBlockBytes = size_t{256} << 10;
// Default --max-message-bytes: 16M floats of payload plus 1 MiB for headers.
inline constexpr size_t kDefaultMaxMessageBytes = (size_t{16} << 20) * sizeof(float) + (1 << 20);

// Frame 0 of every message. Little-endian, packed as:
//   magic u32 | version u16 | type u16 | job_id u64 | sender u32 |
//   blocks u32 | request_id u64 | payload_bytes u64 |
//   block_check u64 x blocks | check u64
// `blocks` is the number of payload blocks (kCheckBlockBytes each, the last
// one shorter) and block_check[i] the XXH3-64 of block i. `check` is
//   XXH3_64bits_withSeed(header, XXH3_64bits(frame 0 up to `check`))
// so it covers every envelope field, the block checks and the header (frame
// 1); the block checks cover the payload (frame 2). A sender that does not
// check (--unsafe-disable crc-check) sends blocks = 0 and check = 0.
struct Envelope {
  uint16_t version = kProtocolVersion;
  wire::Body type = wire::Body::NONE;
  uint64_t job_id = 0;
  uint32_t sender = 0;
  uint32_t blocks = 0;  // payload block checks in frame 0
  uint64_t check = 0;   // XXH3-64 over frame 0's other bytes and the header
  uint64_t request_id = 0;
  uint64_t payload_bytes = 0;
};

// zlib's CRC-32 (the same polynomial and values as zlib's crc32(), which a
// unit test checks), computed with ISA-L's carry-less-multiply kernel: the
// check of checkpoint and model files (no longer of messages, see Envelope).
// Chain calls by passing the previous result as `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const void* data, size_t size);

// The check of one payload block (XXH3-64, libxxhash's run-time dispatch to
// AVX-512, AVX2 or SSE2); see Envelope.
uint64_t BlockCheck(const void* data, size_t size);
// Payload blocks of `payload_bytes`.
inline size_t CheckBlocks(uint64_t payload_bytes) {
  return static_cast<size_t>((payload_bytes + kCheckBlockBytes - 1) / kCheckBlockBytes);
}

// A request id that this process has not used before (every request it
// sends takes one: RpcChannel::Send, the monitor's requests to shards).
// Each process starts at a random point of a 2^62 range and counts up, so
// ids do not repeat across channels, nor, but by chance, across a restart
// under the same key; a retry sends the same frames with the same id, and a
// receiver under transport security refuses an id seen before with other
// contents (SenderGuard). Never 0.
uint64_t NewRequestId();

// Why a received message was refused. The names are the `reason` label of the
// rejected-message counters.
const char* ErrorCodeName(wire::ErrorCode code);
// "bsp", "asp", "ssp", "dssp", "backup" (the schema's names, lower case);
// nullopt for anything else.
std::optional<wire::Mode> ParseMode(const std::string& name);

struct DecodeOptions {
  uint64_t job_id = 0;         // messages from other jobs are refused
  bool check_job = true;       // false only for processes that learn the job id
  // Accept job id 0 on Register and StatusRequest messages: a newcomer (or
  // pacerctl) learns the job id from the reply (the monitor sets this).
  bool allow_unbound_register = false;
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  bool check_crc = true;  // the envelope check and the payload's block checks
  // A PullReply's payload blocks are left to the caller, who must take the
  // payload with CopyCheckedPayload (which checks each block as it copies
  // it: the payload is read once). Every other check still runs in Decode.
  bool defer_pull_reply_payload = false;
};

// A received message that passed every generic check. Holds its frames.
struct Decoded {
  Envelope env;
  Frame envelope;  // frame 0: holds the block checks
  Frame header;
  Frame payload;
  const wire::Message* message = nullptr;  // verified; points into `header`
  // False only for a PullReply decoded with defer_pull_reply_payload: read
  // its payload through CopyCheckedPayload.
  bool payload_checked = true;

  wire::Body type() const { return env.type; }
  template <class T>
  const T* As() const {
    return message->body_as<T>();
  }
  std::span<const float> floats() const {
    return {reinterpret_cast<const float*>(payload.data()), payload.size() / sizeof(float)};
  }
};

struct DecodeError {
  wire::ErrorCode code = wire::ErrorCode::Unknown;
  std::string reason;
  std::optional<Envelope> env;  // set when the envelope itself was readable
};

// Checks, in order: frame count and envelope, magic, protocol version, job id,
// total size, the envelope check (envelope and header), the payload's block
// checks, flatbuffers::Verifier, body type == envelope type, and for messages
// that carry values, that the key lengths add up to the payload.
// Returns true and fills `out`, or false and fills `err`. Never throws.
bool Decode(const Frames& frames, const DecodeOptions& options, Decoded* out, DecodeError* err);
// Copies `d`'s payload to `dst` (payload.size() bytes), each block checked
// before it is copied, on the shared pool's threads (ps/base/parallel.h).
// False when a block fails its check: every block that passed is copied
// (and correct), the failing ones are not. For a payload Decode checked
// already, a plain copy.
bool CopyCheckedPayload(const Decoded& d, void* dst);
// Reads an envelope (frame 0 of a message as Encode makes it) checking only
// its size and magic: for looking at a message's type and sender without
// decoding it (fault injection).
bool PeekEnvelope(const Frame& frame, Envelope* env);

// Bytes of payload that `keys` describe; nullopt on overflow.
std::optional<uint64_t> PayloadBytesFor(const flatbuffers::Vector<const wire::KeyLen*>* keys);

// Builds frames 0..2 from a finished builder and an optional payload.
// `env.type`, `env.payload_bytes`, `env.blocks` and `env.check` are filled in
// here; with_crc = false sends no checks (blocks = 0, check = 0).
Frames Encode(Envelope env, wire::Body type, flatbuffers::FlatBufferBuilder& fbb,
              Frame payload = {}, bool with_crc = true);

// Convenience: finish `fbb` with a Message whose body is `body` and encode it.
template <class T>
Frames EncodeBody(const Envelope& env, flatbuffers::FlatBufferBuilder& fbb,
                  flatbuffers::Offset<T> body, Frame payload = {}, bool with_crc = true) {
  constexpr wire::Body type = wire::BodyTraits<T>::enum_value;
  auto msg = wire::CreateMessage(fbb, type, body.Union());
  fbb.Finish(msg);
  return Encode(env, type, fbb, std::move(payload), with_crc);
}

// An Error message answering `to` (request id and job id echoed).
Frames EncodeError(const Envelope& to, uint32_t sender, wire::ErrorCode code,
                   const std::string& reason);

}  // namespace pacer

#endif  // PACER_PS_BASE_WIRE_H_
