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
inline constexpr uint16_t kProtocolVersion = 2;
// The most parts one push may come in (Push.parts).
inline constexpr uint32_t kMaxPushParts = 256;
inline constexpr size_t kEnvelopeBytes = 40;
// Default --max-message-bytes: 16M floats of payload plus 1 MiB for headers.
inline constexpr size_t kDefaultMaxMessageBytes = (size_t{16} << 20) * sizeof(float) + (1 << 20);

// Frame 0 of every message. Little-endian, packed as:
//   magic u32 | version u16 | type u16 | job_id u64 | sender u32 | crc u32 |
//   request_id u64 | payload_bytes u64
// `crc` is the CRC-32 of frame 1 followed by frame 2 (see Crc32).
struct Envelope {
  uint16_t version = kProtocolVersion;
  wire::Body type = wire::Body::NONE;
  uint64_t job_id = 0;
  uint32_t sender = 0;
  uint32_t crc = 0;  // CRC32 (zlib) of frame 1 followed by frame 2
  uint64_t request_id = 0;
  uint64_t payload_bytes = 0;
};

// zlib's CRC-32 (the same polynomial and values as zlib's crc32(), which a
// unit test checks), computed with ISA-L's carry-less-multiply kernel: zlib
// 1.2.13 runs at about 2.9 GB/s here, ISA-L at about 9.5 GB/s, and at 4 CRC
// passes per push+pull zlib's would cost more than the transport itself.
// Chain calls by passing the previous result as `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const void* data, size_t size);

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
  bool check_crc = true;
};

// A received message that passed every generic check. Holds its frames.
struct Decoded {
  Envelope env;
  Frame header;
  Frame payload;
  const wire::Message* message = nullptr;  // verified; points into `header`

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
// total size, CRC, flatbuffers::Verifier, body type == envelope type, and for
// messages that carry values, that the key lengths add up to the payload.
// Returns true and fills `out`, or false and fills `err`. Never throws.
bool Decode(const Frames& frames, const DecodeOptions& options, Decoded* out, DecodeError* err);
// Reads an envelope (frame 0 of a message as Encode makes it) checking only
// its size and magic: for looking at a message's type and sender without
// decoding it (fault injection).
bool PeekEnvelope(const Frame& frame, Envelope* env);

// Bytes of payload that `keys` describe; nullopt on overflow.
std::optional<uint64_t> PayloadBytesFor(const flatbuffers::Vector<const wire::KeyLen*>* keys);

// Builds frames 0..2 from a finished builder and an optional payload.
// `env.type`, `env.payload_bytes` and `env.crc` are filled in here.
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
