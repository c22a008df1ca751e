// libFuzzer target: the frame decoder and verifier (ps/base/wire.h Decode), then
// a configured shard's handler (ShardCore::Handle) and the monitor's
// (MonitorCore::Handle) on the same message. Input: the frames of one
// message, each as a 2-byte little-endian length and its bytes (the last one
// takes what is left). Decoded twice: with the CRC check, as a shard runs,
// and without it, so that the fuzzer gets past the CRC to the Flatbuffers
// verifier and the handlers. The handlers get it once as plain ZeroMQ and
// once under CURVE, from worker 11's key (SenderGuard: the sender-id binding
// and the request-id check). The shard and the monitor live across inputs,
// as they do in a process: state an input leaves (a registration, a held
// push part) meets the next one. A crash input that does not crash alone
// needs the inputs before it (libFuzzer keeps them in its corpus).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "monitor/monitor.h"
#include "ps/base/clock.h"
#include "ps/shard.h"
#include "ps/base/wire.h"
#include "spdlog/spdlog.h"

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

pacer::FakeClock& Clock() {
  static pacer::FakeClock clock(pacer::TimePoint{} + std::chrono::hours(1));
  return clock;
}

// A shard that owns keys 1 (2 values) and 2 (1 value), with two workers
// whose keys are "K11" and "K12", and backs up shard 5's range at epoch 1;
// the monitor's key is "K0".
pacer::ShardCore* Shard() {
  static std::unique_ptr<pacer::ShardCore> shard = [] {
    spdlog::set_level(spdlog::level::off);  // refusals are logged: not what is fuzzed
    pacer::FakeClock& clock = Clock();
    pacer::ShardOptions options;
    options.monitor_key = "K0";
    auto s = std::make_unique<pacer::ShardCore>(options, &clock);
    pacer::ShardJob job;
    job.job_id = 7;
    s->Configure(job, 3);
    s->SetBacking({{5, {1, ""}}});  // a backup of shard 5's range (Replicate)
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
          pacer::wire::CreateWorkerInfoDirect(fbb, 11, 0, 1, 0, 0, 0, "K11"),
          pacer::wire::CreateWorkerInfoDirect(fbb, 12, 1, 3, 0, 0, 0, "K12")};
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

// A monitor of job 7 waiting for its members.
pacer::MonitorCore* Monitor() {
  static std::unique_ptr<pacer::MonitorCore> monitor = [] {
    pacer::MonitorOptions options;
    options.job_id = 7;
    options.operator_keys = {"K99"};
    return std::make_unique<pacer::MonitorCore>(options, &Clock());
  }();
  return monitor.get();
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
  // The shard and the monitor verify everything themselves: a routed
  // message, peer id first.
  for (bool curve : {false, true}) {
    uint64_t peer = 2;
    pacer::Frames routed = frames;
    routed.insert(routed.begin(), pacer::Frame::Copy(&peer, sizeof(peer)));
    if (curve) routed[0].set_peer_key("K11");
    pacer::Frames to_monitor = routed;
    std::vector<pacer::ShardCore::Outgoing> out;
    Shard()->Handle(std::move(routed), &out);
    std::vector<pacer::MonitorCore::Outgoing> monitor_out;
    Monitor()->Handle(std::move(to_monitor), &monitor_out);
  }
  return 0;
}
