#include "ps/base/wire.h"

#include <isa-l/crc.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // picks AVX-512, AVX2 or SSE2 code at run time
#else
#include <xxhash.h>
#endif

#include <atomic>
#include <cctype>
#include <cstring>
#include <random>

#include "ps/base/optimizer_config.h"
#include "ps/base/parallel.h"

namespace pacer {
namespace {

template <class T>
void Put(uint8_t*& p, T v) {
  std::memcpy(p, &v, sizeof(T));  // x86-64 and aarch64 are little-endian
  p += sizeof(T);
}
template <class T>
T Get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

#if defined(__x86_64__)
uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }
uint64_t Xxh3(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed_dispatch(data, size, seed);
}
#else
uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }
uint64_t Xxh3(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}
#endif

// The envelope check: frame 0 up to its last 8 bytes, then the header.
uint64_t EnvelopeCheck(const uint8_t* envelope, size_t size, const Frame& header) {
  const uint64_t seed = Xxh3(envelope, size - sizeof(uint64_t));
  return Xxh3(header.data(), header.size(), seed);
}

const uint8_t* BlockChecksOf(const Frame& envelope) { return envelope.data() + kEnvelopeFieldBytes; }

// Payload block `b` checks against frame 0's block_check[b].
bool BlockOk(const Decoded& d, size_t b) {
  const size_t off = b * kCheckBlockBytes;
  const size_t len = std::min(kCheckBlockBytes, d.payload.size() - off);
  uint64_t want;
  std::memcpy(&want, BlockChecksOf(d.envelope) + b * sizeof(uint64_t), sizeof(want));
  return BlockCheck(d.payload.data() + off, len) == want;
}

bool Fail(DecodeError* err, wire::ErrorCode code, std::string reason,
          const std::optional<Envelope>& env = std::nullopt) {
  err->code = code;
  err->reason = std::move(reason);
  err->env = env;
  return false;
}

}  // namespace

uint64_t NewRequestId() {
  static std::atomic<uint64_t> next{[] {
    std::random_device rd;
    const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
    return (r >> 2) | 1;  // below 2^62: counting up never wraps to 0
  }()};
  return next.fetch_add(1, std::memory_order_relaxed);
}

uint32_t Crc32(uint32_t crc, const void* data, size_t size) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), size);
}

uint64_t BlockCheck(const void* data, size_t size) { return Xxh3(data, size); }

bool CopyCheckedPayload(const Decoded& d, void* dst) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  const size_t size = d.payload.size();
  const bool checked = d.payload_checked;
  std::atomic<bool> ok{true};
  // Block by block, on the shared pool's threads: each block is checked
  // and copied while it is in this core's cache.
  SharedPool().For(CheckBlocks(size), 1, [&](size_t first, size_t last) {
    for (size_t b = first; b < last; ++b) {
      if (!checked && !BlockOk(d, b)) {
        ok.store(false, std::memory_order_relaxed);
        continue;
      }
      const size_t off = b * kCheckBlockBytes;
      std::memcpy(out + off, d.payload.data() + off, std::min(kCheckBlockBytes, size - off));
    }
  });
  return ok.load(std::memory_order_relaxed);
}

std::optional<wire::Mode> ParseMode(const std::string& name) {
  for (wire::Mode m : wire::EnumValuesMode()) {
    std::string lower = wire::EnumNameMode(m);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == name) return m;
  }
  return std::nullopt;
}

const char* ErrorCodeName(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::Unknown: return "unknown";
    case wire::ErrorCode::BadEnvelope: return "bad_envelope";
    case wire::ErrorCode::BadCrc: return "bad_crc";
    case wire::ErrorCode::BadHeader: return "bad_header";
    case wire::ErrorCode::BadLength: return "bad_length";
    case wire::ErrorCode::TooLarge: return "too_large";
    case wire::ErrorCode::WrongType: return "wrong_type";
    case wire::ErrorCode::WrongVersion: return "wrong_version";
    case wire::ErrorCode::WrongJob: return "wrong_job";
    case wire::ErrorCode::NotOwner: return "not_owner";
    case wire::ErrorCode::NotMember: return "not_member";
    case wire::ErrorCode::Stale: return "stale";
    case wire::ErrorCode::NotReady: return "not_ready";
    case wire::ErrorCode::Refused: return "refused";
    case wire::ErrorCode::DeadlineExceeded: return "deadline_exceeded";
    case wire::ErrorCode::Mismatch: return "mismatch";
  }
  return "unknown";
}

std::optional<uint64_t> PayloadBytesFor(const flatbuffers::Vector<const wire::KeyLen*>* keys) {
  if (keys == nullptr) return 0;
  uint64_t total = 0;
  for (const wire::KeyLen* kl : *keys) {
    uint64_t len = kl->length();
    if (len > (uint64_t{1} << 40)) return std::nullopt;
    total += len * sizeof(float);
  }
  return total;
}

namespace {
// The fields of frame 0 at the offsets every protocol version has used
// (magic, version, type, job, sender, request id, payload bytes; version 3's
// `blocks` sits where versions 1 and 2 had their CRC). False unless there are
// kEnvelopeFieldBytes and the magic is right.
bool ReadFields(const Frame& frame, Envelope* env) {
  if (frame.size() < kEnvelopeFieldBytes) return false;
  const uint8_t* p = frame.data();
  if (Get<uint32_t>(p) != kMagic) return false;
  env->version = Get<uint16_t>(p);
  env->type = static_cast<wire::Body>(Get<uint16_t>(p));
  env->job_id = Get<uint64_t>(p);
  env->sender = Get<uint32_t>(p);
  env->blocks = Get<uint32_t>(p);
  env->request_id = Get<uint64_t>(p);
  env->payload_bytes = Get<uint64_t>(p);
  return true;
}
// After ReadFields: false unless frame 0's size agrees with `blocks`; reads
// the check.
bool ReadCheck(const Frame& frame, Envelope* env) {
  if (frame.size() != kEnvelopeBytes + uint64_t{env->blocks} * sizeof(uint64_t)) return false;
  std::memcpy(&env->check, frame.data() + frame.size() - sizeof(uint64_t), sizeof(uint64_t));
  return true;
}
}  // namespace

bool PeekEnvelope(const Frame& frame, Envelope* env) {
  return ReadFields(frame, env) && ReadCheck(frame, env);
}

bool Decode(const Frames& frames, const DecodeOptions& options, Decoded* out, DecodeError* err) {
  if (frames.size() < 2 || frames.size() > 3) {
    return Fail(err, wire::ErrorCode::BadEnvelope,
                "expected 2 or 3 frames, got " + std::to_string(frames.size()));
  }
  const Frame& f0 = frames[0];
  Envelope env;
  if (!ReadFields(f0, &env)) {
    if (f0.size() < kEnvelopeFieldBytes) {
      return Fail(err, wire::ErrorCode::BadEnvelope,
                  "envelope is " + std::to_string(f0.size()) + " bytes, expected at least " +
                      std::to_string(kEnvelopeBytes));
    }
    return Fail(err, wire::ErrorCode::BadEnvelope, "bad magic");
  }
  if (env.version != kProtocolVersion) {
    return Fail(err, wire::ErrorCode::WrongVersion,
                "protocol version " + std::to_string(env.version) + " is not supported (this is " +
                    std::to_string(kProtocolVersion) + ")",
                env);
  }
  if (!ReadCheck(f0, &env)) {
    return Fail(err, wire::ErrorCode::BadEnvelope,
                "envelope is " + std::to_string(f0.size()) + " bytes, its " +
                    std::to_string(env.blocks) + " block checks need " +
                    std::to_string(kEnvelopeBytes + uint64_t{env.blocks} * sizeof(uint64_t)),
                env);
  }
  const uint16_t type = static_cast<uint16_t>(env.type);
  const bool unbound_register =
      options.allow_unbound_register && env.job_id == 0 &&
      (env.type == wire::Body::Register || env.type == wire::Body::StatusRequest);
  if (options.check_job && env.job_id != options.job_id && !unbound_register) {
    return Fail(err, wire::ErrorCode::WrongJob,
                "message for job " + std::to_string(env.job_id) + ", this is job " +
                    std::to_string(options.job_id),
                env);
  }
  if (type == 0 || type > static_cast<uint16_t>(wire::Body::MAX)) {
    return Fail(err, wire::ErrorCode::WrongType, "unknown message type " + std::to_string(type),
                env);
  }
  const Frame& header = frames[1];
  Frame payload = frames.size() == 3 ? frames[2] : Frame();
  size_t total = f0.size() + header.size() + payload.size();
  if (total > options.max_message_bytes) {
    return Fail(err, wire::ErrorCode::TooLarge,
                "message of " + std::to_string(total) + " bytes exceeds the limit of " +
                    std::to_string(options.max_message_bytes),
                env);
  }
  if (env.payload_bytes != payload.size()) {
    return Fail(err, wire::ErrorCode::BadLength,
                "envelope says " + std::to_string(env.payload_bytes) + " payload bytes, frame has " +
                    std::to_string(payload.size()),
                env);
  }
  bool payload_checked = true;
  if (options.check_crc) {
    if (env.check != EnvelopeCheck(f0.data(), f0.size(), header)) {
      return Fail(err, wire::ErrorCode::BadCrc, "envelope check mismatch (envelope or header damaged)",
                  env);
    }
    if (env.blocks != CheckBlocks(payload.size())) {
      return Fail(err, wire::ErrorCode::BadCrc,
                  std::to_string(env.blocks) + " block checks for " + std::to_string(CheckBlocks(payload.size())) +
                      " payload blocks (a sender that does not check?)",
                  env);
    }
    // The payload's blocks last, after every cheap check.
    payload_checked = false;
  }
  // Flatbuffers needs aligned access; ZeroMQ frames are malloc-aligned, but a
  // header frame at an odd address is copied rather than trusted.
  Frame aligned = header;
  if (reinterpret_cast<uintptr_t>(header.data()) % 8 != 0) {
    aligned = Frame::Copy(header.data(), header.size());
  }
  flatbuffers::Verifier verifier(aligned.data(), aligned.size(), /*max_depth=*/16,
                                 /*max_tables=*/100000);
  if (aligned.size() < 8 || !wire::VerifyMessageBuffer(verifier)) {
    return Fail(err, wire::ErrorCode::BadHeader, "header failed Flatbuffers verification", env);
  }
  const wire::Message* msg = wire::GetMessage(aligned.data());
  if (msg->body_type() != env.type) {
    return Fail(err, wire::ErrorCode::WrongType,
                std::string("envelope type ") + wire::EnumNameBody(env.type) +
                    " disagrees with header type " + wire::EnumNameBody(msg->body_type()),
                env);
  }
  if (msg->body() == nullptr) {
    return Fail(err, wire::ErrorCode::BadHeader, "message has no body", env);
  }
  // Messages that carry values: the keys' lengths must add up to the payload.
  const flatbuffers::Vector<const wire::KeyLen*>* keys = nullptr;
  bool carries_values = false;
  // MoveData and a PullReply with state: the parameters, then each
  // optimizer state slot's values (at most 3: Adam's m, v and max v).
  uint64_t copies = 1;
  switch (env.type) {
    case wire::Body::Push:
      keys = msg->body_as_Push()->keys();
      carries_values = true;
      break;
    case wire::Body::Init:
      keys = msg->body_as_Init()->keys();
      carries_values = true;
      break;
    case wire::Body::PullReply:
      keys = msg->body_as_PullReply()->keys();
      carries_values = true;
      copies = 1 + uint64_t{msg->body_as_PullReply()->state_slots()};
      break;
    case wire::Body::MoveData:
      keys = msg->body_as_MoveData()->keys();
      carries_values = true;
      copies = 1 + uint64_t{msg->body_as_MoveData()->state_slots()};
      break;
    case wire::Body::Replicate:
      // A seed or steps of a replica: their sizes are checked against the
      // replica's keys where it is applied (ShardCore::OnReplicate).
      carries_values = true;
      break;
    default:
      break;
  }
  if (copies > 1 + kMaxStateSlots) {
    return Fail(err, wire::ErrorCode::BadHeader,
                std::to_string(copies - 1) + " optimizer state slots; at most " +
                    std::to_string(kMaxStateSlots),
                env);
  }
  if (carries_values && env.type == wire::Body::Replicate) {
    if (payload.size() % sizeof(float) != 0) {
      return Fail(err, wire::ErrorCode::BadLength,
                  "a payload of " + std::to_string(payload.size()) + " bytes is no whole floats",
                  env);
    }
    if (reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) != 0) {
      payload = Frame::Copy(payload.data(), payload.size());
    }
  } else if (carries_values) {
    std::optional<uint64_t> want = PayloadBytesFor(keys);
    if (want) *want *= copies;
    if (!want || *want != payload.size()) {
      return Fail(err, wire::ErrorCode::BadLength,
                  "key lengths give " + (want ? std::to_string(*want) : std::string("overflowing")) +
                      " bytes, payload has " + std::to_string(payload.size()),
                  env);
    }
    if (reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) != 0) {
      payload = Frame::Copy(payload.data(), payload.size());
    }
  } else if (!payload.empty()) {
    return Fail(err, wire::ErrorCode::BadLength,
                std::string(wire::EnumNameBody(env.type)) + " carries no payload", env);
  }
  out->env = env;
  out->envelope = f0;
  out->header = std::move(aligned);
  out->payload = std::move(payload);
  out->message = msg;
  out->payload_checked = payload_checked;
  if (!payload_checked &&
      !(options.defer_pull_reply_payload && env.type == wire::Body::PullReply)) {
    // Every block, on the shared pool's threads; the first bad one is named.
    const size_t n = CheckBlocks(out->payload.size());
    std::atomic<size_t> bad{n};
    SharedPool().For(n, 1, [&](size_t first, size_t last) {
      for (size_t b = first; b < last; ++b) {
        if (BlockOk(*out, b)) continue;
        size_t was = bad.load(std::memory_order_relaxed);
        while (b < was && !bad.compare_exchange_weak(was, b, std::memory_order_relaxed)) {
        }
        return;
      }
    });
    if (const size_t b = bad.load(std::memory_order_relaxed); b < n) {
      return Fail(err, wire::ErrorCode::BadCrc,
                  "payload block " + std::to_string(b) + " of " + std::to_string(n) +
                      " fails its check",
                  env);
    }
    out->payload_checked = true;
  }
  return true;
}

Frames Encode(Envelope env, wire::Body type, flatbuffers::FlatBufferBuilder& fbb, Frame payload,
              bool with_crc) {
  auto detached = std::make_shared<flatbuffers::DetachedBuffer>(fbb.Release());
  Frame header(detached, detached->data(), detached->size());
  env.type = type;
  env.payload_bytes = payload.size();
  env.blocks = with_crc ? static_cast<uint32_t>(CheckBlocks(payload.size())) : 0;
  std::vector<uint8_t> e(kEnvelopeBytes + size_t{env.blocks} * sizeof(uint64_t));
  uint8_t* p = e.data();
  Put<uint32_t>(p, kMagic);
  Put<uint16_t>(p, env.version);
  Put<uint16_t>(p, static_cast<uint16_t>(type));
  Put<uint64_t>(p, env.job_id);
  Put<uint32_t>(p, env.sender);
  Put<uint32_t>(p, env.blocks);
  Put<uint64_t>(p, env.request_id);
  Put<uint64_t>(p, env.payload_bytes);
  // The block checks, on the shared pool's threads.
  uint8_t* checks = p;
  SharedPool().For(env.blocks, 1, [&](size_t first, size_t last) {
    for (size_t b = first; b < last; ++b) {
      const size_t off = b * kCheckBlockBytes;
      const uint64_t c = BlockCheck(payload.data() + off, std::min(kCheckBlockBytes, payload.size() - off));
      std::memcpy(checks + b * sizeof(uint64_t), &c, sizeof(c));
    }
  });
  p += size_t{env.blocks} * sizeof(uint64_t);
  env.check = with_crc ? EnvelopeCheck(e.data(), e.size(), header) : 0;
  Put<uint64_t>(p, env.check);
  Frames frames;
  frames.reserve(3);
  frames.push_back(Frame::FromVector(std::move(e)));
  frames.push_back(std::move(header));
  if (!payload.empty()) frames.push_back(std::move(payload));
  return frames;
}

Frames EncodeError(const Envelope& to, uint32_t sender, wire::ErrorCode code,
                   const std::string& reason) {
  flatbuffers::FlatBufferBuilder fbb(128);
  auto body = wire::CreateErrorDirect(fbb, code, reason.c_str());
  Envelope env;
  env.job_id = to.job_id;
  env.sender = sender;
  env.request_id = to.request_id;
  return EncodeBody(env, fbb, body);
}

}  // namespace pacer
