// libFuzzer target: the frame decoder and verifier (ps/wire.h Decode), then
// a configured shard's handler (ShardCore::Handle) on what decodes. Input:
// the frames of one message, each as a 2-byte little-endian length and its
// bytes (the last one takes what is left). Decoded twice: with the CRC
// check, as a shard runs, and without it, so that the fuzzer gets past the
// CRC to the Flatbuffers verifier and the handlers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ps/clock.h"
#include "ps/shard.h"
#include "ps/wire.h"

namespace {

pacer::Frames Split(const uint8_t* data, size_t size) {
  pacer::Frames frames;
  while (size > 0 && frames.size() < 4) {
    size_t n = size;
    if (size >= 2 && frames.size() < 3) {
      const size_t want = static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8);
      data += 2;
      size -= 2;
      n = std::min(want, size);
    }
    frames.push_back(pacer::Frame::Copy(data, n));
    data += n;
    size -= n;
  }
  return frames;
}

// A shard that owns keys 1 (2 values) and 2 (1 value), with two workers.
pacer::ShardCore* Shard() {
  static pacer::FakeClock clock(pacer::TimePoint{} + std::chrono::hours(1));
  static std::unique_ptr<pacer::ShardCore> shard = [] {
    pacer::ShardOptions options;
    auto s = std::make_unique<pacer::ShardCore>(options, &clock);
    pacer::ShardJob job;
    job.job_id = 7;
    s->Configure(job, 3);
    auto send = [&](auto build) {
      flatbuffers::FlatBufferBuilder fbb;
      pacer::Envelope env;
      env.job_id = 7;
      env.sender = 0;
      pacer::Frames f = build(fbb, env);
      uint64_t peer = 1;
      f.insert(f.begin(), pacer::Frame::Copy(&peer, sizeof(peer)));
      std::vector<pacer::ShardCore::Outgoing> out;
      s->Handle(std::move(f), &out);
    };
    const std::vector<pacer::wire::KeyLen> keys = {{1, 2}, {2, 1}};
    send([&](flatbuffers::FlatBufferBuilder& fbb, pacer::Envelope& env) {
      return pacer::EncodeBody(env, fbb, pacer::wire::CreateDeclareModelDirect(fbb, &keys, 1));
    });
    send([&](flatbuffers::FlatBufferBuilder& fbb, pacer::Envelope& env) {
      std::vector<flatbuffers::Offset<pacer::wire::WorkerInfo>> w = {
          pacer::wire::CreateWorkerInfo(fbb, 11, 0, 1), pacer::wire::CreateWorkerInfo(fbb, 12, 1, 3)};
      return pacer::EncodeBody(env, fbb, pacer::wire::CreateMembershipDirect(fbb, 1, &w));
    });
    send([&](flatbuffers::FlatBufferBuilder& fbb, pacer::Envelope& env) {
      env.sender = 11;
      const float values[3] = {1, 2, 3};
      return pacer::EncodeBody(env, fbb, pacer::wire::CreateInitDirect(fbb, &keys),
                               pacer::Frame::Copy(values, sizeof values));
    });
    return s;
  }();
  return shard.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pacer::Frames frames = Split(data, size);
  for (bool crc : {true, false}) {
    pacer::DecodeOptions options;
    options.job_id = 7;
    options.check_crc = crc;
    pacer::Decoded decoded;
    pacer::DecodeError error;
    (void)pacer::Decode(frames, options, &decoded, &error);
  }
  // The shard verifies everything itself: a routed message, peer id first.
  pacer::Frames routed = frames;
  uint64_t peer = 2;
  routed.insert(routed.begin(), pacer::Frame::Copy(&peer, sizeof(peer)));
  std::vector<pacer::ShardCore::Outgoing> out;
  Shard()->Handle(std::move(routed), &out);
  return 0;
}
