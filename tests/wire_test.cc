// Tests of the wire edge (ps/base/wire.h): Encode/Decode round trips and every
// generic check Decode runs on a received message.
#include "ps/base/wire.h"
#include "ps/base/messages.h"
#include "tests/wire_test_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace pacer {
namespace {

constexpr uint64_t kJob = 42;

Frame Floats(const std::vector<float>& v) {
  return Frame::Copy(v.data(), v.size() * sizeof(float));
}

DecodeOptions JobOptions(uint64_t job = kJob) {
  DecodeOptions o;
  o.job_id = job;
  return o;
}

Envelope Env(uint64_t job = kJob) {
  Envelope env;
  env.job_id = job;
  env.sender = 7;
  env.request_id = 1234;
  return env;
}

// A Push for `clock` with keys {10: 2 values, 11: 1 value} and its payload.
Frames PushFrames(const Envelope& env = Env()) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<wire::KeyLen> keys = {{10, 2}, {11, 1}};
  auto body = wire::CreatePushDirect(fbb, /*clock=*/5, /*batch=*/32, &keys);
  return EncodeBody(env, fbb, body, Floats({1.5f, -2.0f, 3.25f}));
}

Frames HeartbeatFrames(const Envelope& env = Env()) {
  flatbuffers::FlatBufferBuilder fbb;
  return EncodeBody(env, fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker, 3));
}

Frames RegisterFrames(const Envelope& env) {
  flatbuffers::FlatBufferBuilder fbb;
  return EncodeBody(env, fbb, wire::CreateRegisterDirect(fbb, wire::Role::Worker, "w"));
}

// Frame 0 written by hand, so that tests can put any value in any field.
Frame RawEnvelope(uint32_t magic, uint16_t version, uint16_t type, uint64_t job,
                  const std::vector<uint8_t>& header) {
  return test::RawEnvelope(version, type, job, /*sender=*/7, Frame::Copy(header.data(), header.size()),
                           /*request=*/1234, {}, magic);
}

// A copy of `f` with byte `i` xor-ed with `mask`.
Frame Flip(const Frame& f, size_t i, uint8_t mask = 0x01) {
  std::vector<uint8_t> b(f.data(), f.data() + f.size());
  b.at(i) ^= mask;
  return Frame::FromVector(std::move(b));
}

// Decodes `frames`, expecting a refusal; returns the error.
DecodeError MustFail(const Frames& frames, const DecodeOptions& options = JobOptions()) {
  Decoded d;
  DecodeError err;
  EXPECT_FALSE(Decode(frames, options, &d, &err)) << "message was accepted";
  return err;
}

// Request ids never repeat in a process, also when threads (each with its
// own channels) take them at once, and are never 0.
TEST(WireTest, RequestIdsDoNotRepeat) {
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ids, t] {
      for (int i = 0; i < kEach; ++i) ids[t].push_back(NewRequestId());
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> seen;
  for (const auto& v : ids) {
    for (uint64_t id : v) {
      EXPECT_NE(id, 0u);
      EXPECT_TRUE(seen.insert(id).second) << "request id " << id << " repeated";
    }
  }
  EXPECT_EQ(seen.size(), size_t{kThreads} * kEach);
  // Counting up from a random point below 2^62: far from wrapping.
  EXPECT_LT(*seen.rbegin(), uint64_t{1} << 63);
}

TEST(WireTest, PushRoundTripsWithPayload) {
  Frames frames = PushFrames();
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].size(), kEnvelopeBytes + 8);  // one block check

  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(frames, JobOptions(), &d, &err)) << err.reason;
  EXPECT_EQ(d.type(), wire::Body::Push);
  EXPECT_EQ(d.env.version, kProtocolVersion);
  EXPECT_EQ(d.env.job_id, kJob);
  EXPECT_EQ(d.env.sender, 7u);
  EXPECT_EQ(d.env.request_id, 1234u);
  EXPECT_EQ(d.env.payload_bytes, 3 * sizeof(float));
  const auto* push = d.As<wire::Push>();
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(push->clock(), 5u);
  EXPECT_EQ(push->batch(), 32u);
  ASSERT_EQ(push->keys()->size(), 2u);
  EXPECT_EQ(push->keys()->Get(0)->key(), 10u);
  EXPECT_EQ(push->keys()->Get(0)->length(), 2u);
  EXPECT_EQ(push->keys()->Get(1)->key(), 11u);
  EXPECT_EQ(push->keys()->Get(1)->length(), 1u);
  ASSERT_EQ(d.floats().size(), 3u);
  EXPECT_EQ(d.floats()[0], 1.5f);
  EXPECT_EQ(d.floats()[1], -2.0f);
  EXPECT_EQ(d.floats()[2], 3.25f);
}

TEST(WireTest, MessageWithoutPayloadHasTwoFrames) {
  Frames frames = HeartbeatFrames();
  EXPECT_EQ(frames.size(), 2u);
  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(frames, JobOptions(), &d, &err)) << err.reason;
  EXPECT_EQ(d.type(), wire::Body::Heartbeat);
  EXPECT_EQ(d.As<wire::Heartbeat>()->clock(), 3u);
  EXPECT_TRUE(d.payload.empty());
}

TEST(WireTest, GarbageIsBadEnvelopeWithoutEnvelope) {
  DecodeError err = MustFail({Frame::Copy("not a pacer message"), Frame::Copy("nor this")});
  EXPECT_EQ(err.code, wire::ErrorCode::BadEnvelope);
  EXPECT_FALSE(err.env.has_value());
}

TEST(WireTest, WrongFrameCountIsBadEnvelope) {
  Frames good = PushFrames();
  DecodeError one = MustFail({good[0]});
  EXPECT_EQ(one.code, wire::ErrorCode::BadEnvelope);
  EXPECT_FALSE(one.env.has_value());

  Frames four = good;
  four.push_back(Frame::Copy("extra"));
  EXPECT_EQ(MustFail(four).code, wire::ErrorCode::BadEnvelope);

  EXPECT_EQ(MustFail({}).code, wire::ErrorCode::BadEnvelope);
}

TEST(WireTest, ShortEnvelopeIsBadEnvelope) {
  Frames frames = PushFrames();
  frames[0] = Frame::Copy(frames[0].data(), 39);
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadEnvelope);
  EXPECT_FALSE(err.env.has_value());
}

TEST(WireTest, EnvelopeSizeDisagreeingWithItsBlockChecksIsBadEnvelope) {
  // The fields are readable (so the sender can be answered), but frame 0 is
  // one byte short of its block checks and check.
  Frames frames = PushFrames();
  ASSERT_EQ(frames[0].size(), kEnvelopeBytes + 8);  // one payload block
  frames[0] = Frame::Copy(frames[0].data(), frames[0].size() - 1);
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadEnvelope) << err.reason;
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->request_id, 1234u);
}

TEST(WireTest, BadMagicIsBadEnvelope) {
  Frames frames = PushFrames();
  frames[0] = Flip(frames[0], 0);
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadEnvelope);
  EXPECT_FALSE(err.env.has_value());
}

TEST(WireTest, OtherProtocolVersionIsWrongVersion) {
  Envelope env = Env();
  env.version = kProtocolVersion + 1;
  DecodeError err = MustFail(PushFrames(env));
  EXPECT_EQ(err.code, wire::ErrorCode::WrongVersion);
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->version, kProtocolVersion + 1);
  EXPECT_EQ(err.env->request_id, 1234u);
}

TEST(WireTest, AnotherJobIsWrongJob) {
  DecodeError err = MustFail(PushFrames(Env(kJob + 1)));
  EXPECT_EQ(err.code, wire::ErrorCode::WrongJob);
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->job_id, kJob + 1);
  EXPECT_EQ(err.env->type, wire::Body::Push);
}

TEST(WireTest, JobIsNotCheckedWhenCheckJobIsOff) {
  DecodeOptions o = JobOptions();
  o.check_job = false;
  Decoded d;
  DecodeError err;
  EXPECT_TRUE(Decode(PushFrames(Env(kJob + 1)), o, &d, &err)) << err.reason;
}

TEST(WireTest, UnboundRegisterAcceptedOnlyWhenAllowed) {
  Frames reg = RegisterFrames(Env(/*job=*/0));
  DecodeError err = MustFail(reg);
  EXPECT_EQ(err.code, wire::ErrorCode::WrongJob);

  DecodeOptions allow = JobOptions();
  allow.allow_unbound_register = true;
  Decoded d;
  ASSERT_TRUE(Decode(reg, allow, &d, &err)) << err.reason;
  EXPECT_EQ(d.type(), wire::Body::Register);
  EXPECT_EQ(d.env.job_id, 0u);

  // The exception covers job 0 on Register only.
  EXPECT_EQ(MustFail(HeartbeatFrames(Env(0)), allow).code, wire::ErrorCode::WrongJob);
  EXPECT_EQ(MustFail(RegisterFrames(Env(kJob + 1)), allow).code, wire::ErrorCode::WrongJob);
}

TEST(WireTest, MessageAboveLimitIsTooLarge) {
  Frames frames = PushFrames();
  const size_t total = frames[0].size() + frames[1].size() + frames[2].size();
  DecodeOptions o = JobOptions();
  o.max_message_bytes = total - 1;
  DecodeError err = MustFail(frames, o);
  EXPECT_EQ(err.code, wire::ErrorCode::TooLarge);
  EXPECT_TRUE(err.env.has_value());

  o.max_message_bytes = total;
  Decoded d;
  EXPECT_TRUE(Decode(frames, o, &d, &err)) << err.reason;
}

TEST(WireTest, FlippedPayloadByteIsBadCrc) {
  Frames frames = PushFrames();
  frames[2] = Flip(frames[2], 5);
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadCrc);
  EXPECT_TRUE(err.env.has_value());
}

TEST(WireTest, FlippedHeaderByteIsBadCrc) {
  Frames frames = PushFrames();
  frames[1] = Flip(frames[1], frames[1].size() / 2);
  EXPECT_EQ(MustFail(frames).code, wire::ErrorCode::BadCrc);
}

TEST(WireTest, CrcValidGarbageHeaderIsBadHeader) {
  // The CRC matches, so only the Flatbuffers verifier can catch this.
  std::vector<uint8_t> header(64);
  for (size_t i = 0; i < header.size(); ++i) header[i] = static_cast<uint8_t>(0xA5 ^ (i * 37));
  Frames frames = {
      RawEnvelope(kMagic, kProtocolVersion, static_cast<uint16_t>(wire::Body::Heartbeat), kJob,
                  header),
      Frame::FromVector(header)};
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadHeader) << err.reason;
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->type, wire::Body::Heartbeat);
}

TEST(WireTest, HandWrittenEnvelopeOfAValidMessageDecodes) {
  // Guards the helper above: the same path with a real header succeeds, so
  // the BadHeader test fails for the header alone.
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateMessage(fbb, wire::Body::Heartbeat,
                                 wire::CreateHeartbeat(fbb, wire::Role::Worker, 3).Union()));
  std::vector<uint8_t> header(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  Frames frames = {
      RawEnvelope(kMagic, kProtocolVersion, static_cast<uint16_t>(wire::Body::Heartbeat), kJob,
                  header),
      Frame::FromVector(header)};
  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(frames, JobOptions(), &d, &err)) << err.reason;
  EXPECT_EQ(d.As<wire::Heartbeat>()->clock(), 3u);
}

TEST(WireTest, EnvelopeTypeDisagreeingWithHeaderIsWrongType) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateMessage(fbb, wire::Body::Push, wire::CreatePush(fbb, 1, 1).Union()));
  Frames frames = Encode(Env(), wire::Body::Pull, fbb);  // envelope says Pull
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::WrongType) << err.reason;
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->type, wire::Body::Pull);
}

TEST(WireTest, UnknownMessageTypeIsWrongType) {
  Frames frames = HeartbeatFrames();
  std::vector<uint8_t> e(frames[0].data(), frames[0].data() + frames[0].size());
  uint16_t type = static_cast<uint16_t>(wire::Body::MAX) + 1;
  std::memcpy(e.data() + 6, &type, sizeof(type));
  frames[0] = Frame::FromVector(std::move(e));
  EXPECT_EQ(MustFail(frames).code, wire::ErrorCode::WrongType);
}

TEST(WireTest, KeyLengthsDisagreeingWithPayloadIsBadLength) {
  // Encode computes a consistent CRC and payload size, so only the key-length
  // check can refuse this: the keys describe 3 floats, the payload holds 2.
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<wire::KeyLen> keys = {{10, 2}, {11, 1}};
  Frames frames =
      EncodeBody(Env(), fbb, wire::CreatePushDirect(fbb, 5, 32, &keys), Floats({1.0f, 2.0f}));
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadLength) << err.reason;
  EXPECT_TRUE(err.env.has_value());
}

TEST(WireTest, InitAndPullReplyLengthsAreCheckedToo) {
  std::vector<wire::KeyLen> keys = {{1, 4}};
  {
    flatbuffers::FlatBufferBuilder fbb;
    Frames f = EncodeBody(Env(), fbb, wire::CreateInitDirect(fbb, &keys), Floats({1, 2, 3}));
    EXPECT_EQ(MustFail(f).code, wire::ErrorCode::BadLength);
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto kv = fbb.CreateVectorOfStructs(keys);
    Frames f =
        EncodeBody(Env(), fbb, wire::CreatePullReply(fbb, 0, -1, kv), Floats({1, 2, 3, 4, 5}));
    EXPECT_EQ(MustFail(f).code, wire::ErrorCode::BadLength);
  }
}

TEST(WireTest, EnvelopePayloadSizeDisagreeingWithFrameIsBadLength) {
  Frames frames = PushFrames();
  std::vector<uint8_t> e(frames[0].data(), frames[0].data() + frames[0].size());
  uint64_t bytes = 4 * sizeof(float);
  std::memcpy(e.data() + 32, &bytes, sizeof(bytes));
  frames[0] = Frame::FromVector(std::move(e));
  EXPECT_EQ(MustFail(frames).code, wire::ErrorCode::BadLength);
}

TEST(WireTest, PayloadOnMessageWithoutValuesIsBadLength) {
  flatbuffers::FlatBufferBuilder fbb;
  Frames frames =
      EncodeBody(Env(), fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker, 3), Floats({1.0f}));
  ASSERT_EQ(frames.size(), 3u);
  DecodeError err = MustFail(frames);
  EXPECT_EQ(err.code, wire::ErrorCode::BadLength) << err.reason;
  EXPECT_TRUE(err.env.has_value());
}

TEST(WireTest, CrcCheckCanBeTurnedOff) {
  Frames frames = PushFrames();
  frames[2] = Flip(frames[2], 0);
  DecodeOptions o = JobOptions();
  o.check_crc = false;
  Decoded d;
  DecodeError err;
  EXPECT_TRUE(Decode(frames, o, &d, &err)) << err.reason;
}

// A PullReply for key 3 with `n` floats (value i at i).
Frames PullReplyFrames(size_t n, bool with_crc = true) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<wire::KeyLen> keys = {{3, n}};
  auto kv = fbb.CreateVectorOfStructs(keys);
  return EncodeBody(Env(), fbb, wire::CreatePullReply(fbb, 0, -1, kv), Floats(v), with_crc);
}

constexpr size_t kBlockFloats = kCheckBlockBytes / sizeof(float);

// Encode writes frame 0 exactly as ps/base/wire.h describes it (the test
// helper computes the checks from that description with libxxhash).
TEST(WireTest, EnvelopeIsLaidOutAsDocumented) {
  // 20 blocks: checked on the shared pool's threads.
  for (size_t n : {size_t{1}, kBlockFloats, kBlockFloats * 2 + 7, kBlockFloats * 19 + 11}) {
    Frames f = PullReplyFrames(n);
    ASSERT_EQ(f.size(), 3u);
    const Frame want = test::RawEnvelope(kProtocolVersion, static_cast<uint16_t>(wire::Body::PullReply),
                                         kJob, 7, f[1], 1234, f[2]);
    ASSERT_EQ(f[0].size(), want.size()) << n;
    EXPECT_EQ(std::memcmp(f[0].data(), want.data(), want.size()), 0) << n;
    EXPECT_EQ(f[0].size(), kEnvelopeBytes + 8 * CheckBlocks(n * sizeof(float))) << n;
  }
}

// Every block of a payload of several blocks is checked, and so is every
// envelope field and block check: one flipped bit anywhere after the version
// is refused.
TEST(WireTest, EveryPayloadBlockAndEnvelopeByteIsChecked) {
  const Frames good = PullReplyFrames(kBlockFloats * 2 + 7);  // 3 blocks
  ASSERT_EQ(CheckBlocks(good[2].size()), 3u);
  for (size_t b = 0; b < 3; ++b) {
    Frames f = good;
    f[2] = Flip(f[2], std::min(good[2].size() - 1, b * kCheckBlockBytes + 100), 0x10);
    DecodeError err = MustFail(f);
    EXPECT_EQ(err.code, wire::ErrorCode::BadCrc) << "block " << b;
    EXPECT_NE(err.reason.find("block " + std::to_string(b)), std::string::npos) << err.reason;
  }
  // Envelope bytes the other checks do not look at: sender (16..19),
  // request id (24..31), each block check (40..63) and the check itself.
  for (size_t i : {size_t{16}, size_t{24}, size_t{31}, size_t{40}, size_t{50}, size_t{63},
                   good[0].size() - 1}) {
    Frames f = good;
    f[0] = Flip(f[0], i);
    EXPECT_EQ(MustFail(f).code, wire::ErrorCode::BadCrc) << "envelope byte " << i;
  }
}

TEST(WireTest, Version2EnvelopeIsWrongVersion) {
  // A version 2 peer's 40-byte envelope (a CRC-32 where `blocks` is now).
  Frames f = PullReplyFrames(4);
  std::vector<uint8_t> e(f[0].data(), f[0].data() + 40);
  const uint16_t v2 = 2;
  std::memcpy(e.data() + 4, &v2, sizeof(v2));
  f[0] = Frame::FromVector(std::move(e));
  DecodeError err = MustFail(f);
  EXPECT_EQ(err.code, wire::ErrorCode::WrongVersion) << err.reason;
  ASSERT_TRUE(err.env.has_value());
  EXPECT_EQ(err.env->request_id, 1234u);
}

TEST(WireTest, DeferredPullReplyPayloadIsCheckedAsItIsCopied) {
  const size_t n = kBlockFloats * 2 + 7;
  Frames f = PullReplyFrames(n);
  f[2] = Flip(f[2], kCheckBlockBytes + 8);  // block 1
  DecodeOptions o = JobOptions();
  EXPECT_EQ(MustFail(f, o).code, wire::ErrorCode::BadCrc);  // not deferred: refused

  o.defer_pull_reply_payload = true;
  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(f, o, &d, &err)) << err.reason;
  EXPECT_FALSE(d.payload_checked);
  std::vector<float> dst(n, -1.0f);
  EXPECT_FALSE(CopyCheckedPayload(d, dst.data()));
  EXPECT_EQ(dst[kBlockFloats - 1], static_cast<float>(kBlockFloats - 1));  // block 0 copied
  EXPECT_EQ(dst[kBlockFloats + 2], -1.0f);  // the damaged block is not
  EXPECT_EQ(dst[n - 1], static_cast<float>(n - 1));  // the intact block after it is

  Frames intact = PullReplyFrames(n);
  ASSERT_TRUE(Decode(intact, o, &d, &err)) << err.reason;
  ASSERT_TRUE(CopyCheckedPayload(d, dst.data()));
  for (size_t i = 0; i < n; i += 4099) EXPECT_EQ(dst[i], static_cast<float>(i)) << i;
  EXPECT_EQ(dst[n - 1], static_cast<float>(n - 1));

  // Deferral is for pull replies only: a damaged push is still refused.
  Frames push = PushFrames();
  push[2] = Flip(push[2], 1);
  EXPECT_EQ(MustFail(push, o).code, wire::ErrorCode::BadCrc);
  // And a damaged header of a pull reply too.
  Frames header = PullReplyFrames(n);
  header[1] = Flip(header[1], header[1].size() / 2);
  EXPECT_EQ(MustFail(header, o).code, wire::ErrorCode::BadCrc);
}

// A payload of many blocks is checked on the shared pool's threads
// (ps/base/parallel.h): a damaged block anywhere is found, the first of
// several is named, and a checked copy leaves out exactly the bad blocks.
TEST(WireTest, ManyBlockPayloadIsCheckedOnEveryBlockInParallel) {
  const size_t blocks = 20;
  const size_t n = kBlockFloats * (blocks - 1) + 11;
  const Frames good = PullReplyFrames(n);
  ASSERT_EQ(CheckBlocks(good[2].size()), blocks);
  for (size_t b : {size_t{0}, size_t{7}, size_t{13}, blocks - 1}) {
    Frames f = good;
    f[2] = Flip(f[2], std::min(good[2].size() - 1, b * kCheckBlockBytes + 5), 0x01);
    DecodeError err = MustFail(f);
    EXPECT_EQ(err.code, wire::ErrorCode::BadCrc) << "block " << b;
    EXPECT_NE(err.reason.find("block " + std::to_string(b) + " of"), std::string::npos)
        << err.reason;
  }
  Frames two = good;
  two[2] = Flip(two[2], 16 * kCheckBlockBytes + 3);
  two[2] = Flip(two[2], 4 * kCheckBlockBytes + 3);
  DecodeError err = MustFail(two);
  EXPECT_NE(err.reason.find("block 4 of"), std::string::npos) << err.reason;

  DecodeOptions o = JobOptions();
  o.defer_pull_reply_payload = true;
  Decoded d;
  ASSERT_TRUE(Decode(two, o, &d, &err)) << err.reason;
  std::vector<float> dst(n, -1.0f);
  EXPECT_FALSE(CopyCheckedPayload(d, dst.data()));
  for (size_t b = 0; b < blocks; ++b) {
    const size_t i = b * kBlockFloats;
    const float want = (b == 4 || b == 16) ? -1.0f : static_cast<float>(i);
    EXPECT_EQ(dst[i], want) << "block " << b;
  }
  ASSERT_TRUE(Decode(good, o, &d, &err)) << err.reason;
  ASSERT_TRUE(CopyCheckedPayload(d, dst.data()));
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(dst[i], static_cast<float>(i)) << i;
  EXPECT_EQ(dst[n - 1], static_cast<float>(n - 1));
}

TEST(WireTest, UncheckedSenderIsRefusedByACheckingReceiver) {
  Frames f = PullReplyFrames(10, /*with_crc=*/false);
  EXPECT_EQ(f[0].size(), kEnvelopeBytes);  // no block checks
  EXPECT_EQ(MustFail(f).code, wire::ErrorCode::BadCrc);
  DecodeOptions o = JobOptions();
  o.check_crc = false;
  Decoded d;
  DecodeError err;
  EXPECT_TRUE(Decode(f, o, &d, &err)) << err.reason;
  EXPECT_TRUE(d.payload_checked);  // nothing to check
}

TEST(WireTest, ErrorReplyEchoesRequest) {
  Envelope to = Env();
  Frames frames = EncodeError(to, /*sender=*/3, wire::ErrorCode::Stale, "too late");
  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(frames, JobOptions(), &d, &err)) << err.reason;
  EXPECT_EQ(d.type(), wire::Body::Error);
  EXPECT_EQ(d.env.request_id, to.request_id);
  EXPECT_EQ(d.env.sender, 3u);
  EXPECT_EQ(d.As<wire::Error>()->code(), wire::ErrorCode::Stale);
  EXPECT_EQ(d.As<wire::Error>()->reason()->str(), "too late");
}

TEST(WireTest, PayloadBytesForOverflowIsNullopt) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<wire::KeyLen> keys = {{1, uint64_t{1} << 62}};
  fbb.Finish(fbb.CreateVectorOfStructs(keys));
  const auto* v =
      flatbuffers::GetRoot<flatbuffers::Vector<const wire::KeyLen*>>(fbb.GetBufferPointer());
  EXPECT_FALSE(PayloadBytesFor(v).has_value());
  EXPECT_EQ(PayloadBytesFor(nullptr), 0u);
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

// The files' CRC (checkpoints, model files) is zlib's CRC-32: ISA-L's kernel must give crc32()'s values,
// also when chained, for sizes around its block boundaries.
TEST(WireCrcTest, Crc32MatchesZlibCrc32) {
  std::mt19937 rng(12345);
  std::vector<unsigned char> data(1 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64},
                   size_t{255}, size_t{4097}, data.size()}) {
    const uLong want = crc32_z(crc32_z(0L, Z_NULL, 0), data.data(), n);
    EXPECT_EQ(Crc32(0, data.data(), n), static_cast<uint32_t>(want)) << n;
    const uint32_t chained = Crc32(Crc32(0, data.data(), n / 3), data.data() + n / 3, n - n / 3);
    EXPECT_EQ(chained, static_cast<uint32_t>(want)) << n;
  }
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

TEST(ParseModeTest, LowerCaseSchemaNames) {
  EXPECT_EQ(ParseMode("bsp"), wire::Mode::Bsp);
  EXPECT_EQ(ParseMode("dssp"), wire::Mode::Dssp);
  EXPECT_EQ(ParseMode("backup"), wire::Mode::Backup);
  EXPECT_FALSE(ParseMode("Bsp").has_value());
  EXPECT_FALSE(ParseMode("sideways").has_value());
}


// MonitorRecord (ps/base/messages.h): every field comes back as saved, and
// what is not a state of this format is DataLoss.
TEST(RecordsTest, AMonitorRecordRoundTripsAndGarbageIsDataLoss) {
  MonitorRecord r;
  r.job_id = 42;
  r.state = wire::JobState::Running;
  r.stop_reason = "";
  r.next_id = 9;
  r.next_rank = 3;
  r.model = {wire::KeyLen(1, 10), wire::KeyLen(2, 20)};
  r.map_built = true;
  r.map_version = 4;
  r.membership_version = 7;
  r.partition_count = 2;
  r.workers.push_back({5, 1, 64, 2, 3, 10, 12, 6, true, false, "tok", "KEY"});
  r.workers.push_back({6, 2, 32, 0, 0, 0, 11, 7, false, true, "", ""});
  r.shards.push_back({1, "tcp://127.0.0.1:1", 77, 0, 2, 11, 1, false, "", {2}, 5, "node-a", 3,
                      "tcp://127.0.0.1:9", {4}, false, 2});
  r.shards.push_back({2, "tcp://127.0.0.1:2", 78, 2, 2, -1, 0, true, "K2", {}, 0, "", 0, "", {}, true,
                      0});
  r.partitions.push_back({0, 1, 640, 5, 0});
  r.partitions.push_back({1, 0, 0, 6, 5});
  r.seconds_running = 12.5;
  r.saved_unix = 1.7e9;
  r.last_accuracy = 0.8f;
  r.slack_open = false;
  r.batch_per_worker = 32;
  r.epoch = 9;
  auto back = DecodeMonitorRecord(EncodeMonitorRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job_id, 42u);
  EXPECT_EQ(back->state, wire::JobState::Running);
  EXPECT_EQ(back->next_id, 9u);
  EXPECT_EQ(back->next_rank, 3u);
  ASSERT_EQ(back->model.size(), 2u);
  EXPECT_EQ(back->model[1].key(), 2u);
  EXPECT_EQ(back->model[1].length(), 20u);
  EXPECT_TRUE(back->map_built);
  EXPECT_EQ(back->map_version, 4u);
  EXPECT_EQ(back->membership_version, 7u);
  EXPECT_EQ(back->partition_count, 2u);
  ASSERT_EQ(back->workers.size(), 2u);
  EXPECT_EQ(back->workers[0].token, "tok");
  EXPECT_EQ(back->workers[0].public_key, "KEY");
  EXPECT_EQ(back->workers[0].staleness_range, 3u);
  EXPECT_EQ(back->workers[0].start_clock, 10u);
  EXPECT_EQ(back->workers[1].token, "");
  EXPECT_TRUE(back->workers[1].done);
  EXPECT_FALSE(back->workers[1].alive);
  ASSERT_EQ(back->shards.size(), 2u);
  EXPECT_EQ(back->shards[0].address, "tcp://127.0.0.1:1");
  EXPECT_EQ(back->shards[0].incarnation, 77u);
  EXPECT_EQ(back->shards[0].applied_clock, 11);
  EXPECT_EQ(back->shards[1].applied_clock, -1);
  EXPECT_TRUE(back->shards[1].drained);
  EXPECT_EQ(back->shards[1].public_key, "K2");
  EXPECT_EQ(back->shards[0].backups, std::vector<uint32_t>{2});
  EXPECT_EQ(back->shards[0].epoch, 5u);
  EXPECT_EQ(back->shards[0].node, "node-a");
  EXPECT_EQ(back->shards[0].host, 3u);
  EXPECT_EQ(back->shards[0].served_at, "tcp://127.0.0.1:9");
  EXPECT_EQ(back->shards[1].host, 0u);
  EXPECT_TRUE(back->shards[1].backups.empty());
  EXPECT_EQ(back->shards[0].standby, std::vector<uint32_t>{4});
  EXPECT_TRUE(back->shards[1].standby.empty());
  EXPECT_FALSE(back->shards[0].retired);
  EXPECT_TRUE(back->shards[1].retired);
  EXPECT_EQ(back->shards[0].promoted_from, 2u);
  EXPECT_EQ(back->shards[1].promoted_from, 0u);
  ASSERT_EQ(back->partitions.size(), 2u);
  EXPECT_EQ(back->partitions[0].offset, 640u);
  EXPECT_EQ(back->partitions[1].owner, 6u);
  EXPECT_EQ(back->partitions[1].releasing, 5u);
  EXPECT_EQ(back->seconds_running, 12.5);
  EXPECT_EQ(back->saved_unix, 1.7e9);
  EXPECT_EQ(back->last_accuracy, 0.8f);
  EXPECT_FALSE(back->time_to_target.has_value());
  EXPECT_FALSE(back->slack_open);
  EXPECT_EQ(back->batch_per_worker, 32);
  EXPECT_EQ(back->epoch, 9u);
  MonitorRecord fresh;  // not started, nothing measured
  auto none = DecodeMonitorRecord(EncodeMonitorRecord(fresh));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->seconds_running.has_value());
  EXPECT_FALSE(none->last_accuracy.has_value());
  EXPECT_EQ(DecodeMonitorRecord("not a state").status().code(), absl::StatusCode::kDataLoss);
}


// The typed messages (ps/base/messages.h) through frames and back.
TEST(MessagesTest, TypedMessagesRoundTripThroughFrames) {
  Envelope env;
  env.job_id = kJob;
  env.sender = 3;
  env.request_id = 99;
  auto decode = [](const Frames& f) {
    Decoded d;
    DecodeError err;
    EXPECT_TRUE(Decode(f, JobOptions(), &d, &err)) << err.reason;
    return d;
  };
  const Decoded out = decode(EncodeMessage(env, msg::MoveOut{5, 9, /*drop=*/true}));
  ASSERT_EQ(out.type(), wire::Body::MoveOut);
  EXPECT_EQ(out.env.request_id, 99u);
  const msg::MoveOut mo = msg::Read<msg::MoveOut>(out);
  EXPECT_EQ(mo.key_begin, 5u);
  EXPECT_EQ(mo.key_end, 9u);
  EXPECT_TRUE(mo.drop);

  std::vector<float> values = {1, 2, 3, 4, 5, 6};  // 3 parameters, then 3 momenta
  Frame payload = Frame::FromVector(std::vector<uint8_t>(
      reinterpret_cast<uint8_t*>(values.data()),
      reinterpret_cast<uint8_t*>(values.data()) + values.size() * sizeof(float)));
  msg::MoveData move;
  move.keys = {wire::KeyLen(7, 2), wire::KeyLen(8, 1)};
  move.applied_clock = 41;
  move.steps = 12;
  const Decoded data = decode(EncodeMessage(env, move, payload));
  ASSERT_EQ(data.type(), wire::Body::MoveData);
  const msg::MoveData md = msg::Read<msg::MoveData>(data);
  ASSERT_EQ(md.keys.size(), 2u);
  EXPECT_EQ(md.keys[0].key(), 7u);
  EXPECT_EQ(md.keys[1].length(), 1u);
  EXPECT_EQ(md.applied_clock, 41);
  EXPECT_EQ(md.steps, 12u);
  ASSERT_EQ(data.floats().size(), 6u);
  EXPECT_EQ(data.floats()[5], 6.0f);

  EXPECT_EQ(msg::Read<msg::Stop>(decode(EncodeMessage(env, msg::Stop{"drained"}))).reason, "drained");
  const msg::Error e =
      msg::Read<msg::Error>(decode(EncodeMessage(env, msg::Error{wire::ErrorCode::NotReady, "busy"})));
  EXPECT_EQ(e.code, wire::ErrorCode::NotReady);
  EXPECT_EQ(e.reason, "busy");
  EXPECT_EQ(decode(EncodeMessage(env, msg::Ack{})).type(), wire::Body::Ack);

  // Replication: a record with two steps and marks, a seed, the reply, and
  // the durable seq on push and pull replies.
  msg::Replicate rec;
  rec.range = 4;
  rec.epoch = 7;
  rec.record = 12;
  rec.steps.push_back({{}, 0.25f, {0.1f, 0.2f}, 3, false, {}, 0.375f});
  rec.steps.push_back({{wire::KeyLen(8, 1)}, 1.0f, {0.3f, 0.4f}, 1, false, {}});
  // A batch's state, not gradients: no lr; the keys' step counts.
  rec.steps.push_back({{wire::KeyLen(8, 1)}, 1.0f, {}, 2, true, {17}});
  rec.marks = {{5, 30}, {6, 31}};
  rec.applied_clock = 40;
  rec.step_count = 41;
  rec.check_begin = 7;
  rec.check_end = 9;
  rec.check = 0xdeadbeef;
  rec.applied = {{5, 30}, {6, 31}, {5, 29}};
  rec.last = true;
  const msg::Replicate rb = msg::Read<msg::Replicate>(
      decode(EncodeMessage(env, rec, Frame::Copy(values.data(), 4 * sizeof(float)))));
  EXPECT_EQ(rb.range, 4u);
  EXPECT_EQ(rb.epoch, 7u);
  EXPECT_EQ(rb.record, 12u);
  EXPECT_FALSE(rb.seed.has_value());
  ASSERT_EQ(rb.steps.size(), 3u);
  EXPECT_FALSE(rb.steps[0].assign);
  EXPECT_TRUE(rb.steps[2].assign);
  EXPECT_EQ(rb.steps[2].key_steps, (std::vector<uint64_t>{17}));
  EXPECT_EQ(rb.steps[2].values, 2u);
  EXPECT_TRUE(rb.steps[0].keys.empty());
  EXPECT_EQ(rb.steps[0].grad_scale, 0.25f);
  EXPECT_EQ(rb.steps[0].fraction, 0.375f);
  EXPECT_EQ(rb.steps[1].fraction, 1.0f);  // not said: a full step
  EXPECT_EQ(rb.steps[0].values, 3u);
  EXPECT_EQ(rb.steps[1].keys.at(0).key(), 8u);
  EXPECT_EQ(rb.steps[1].lr, (std::vector<float>{0.3f, 0.4f}));
  EXPECT_EQ(rb.marks, rec.marks);
  EXPECT_EQ(rb.applied_clock, 40);
  EXPECT_EQ(rb.step_count, 41u);
  EXPECT_EQ(rb.check_begin, 7u);
  EXPECT_EQ(rb.check_end, 9u);
  EXPECT_EQ(rb.check, 0xdeadbeefu);
  EXPECT_EQ(rb.applied, rec.applied);
  EXPECT_TRUE(rb.last);
  msg::Replicate seed;
  seed.seed = move;
  seed.ledger = {{5, 1, 30}, {6, 2, 31}};
  seed.doubles = 3;
  const msg::Replicate sb = msg::Read<msg::Replicate>(decode(EncodeMessage(env, seed, payload)));
  ASSERT_TRUE(sb.seed.has_value());
  EXPECT_EQ(sb.ledger, seed.ledger);
  EXPECT_EQ(sb.doubles, 3u);
  EXPECT_FALSE(sb.last);
  EXPECT_EQ(sb.seed->keys.size(), 2u);
  EXPECT_EQ(sb.seed->steps, 12u);
  const msg::ReplicateReply rr = msg::Read<msg::ReplicateReply>(
      decode(EncodeMessage(env, msg::ReplicateReply{4, 12, true})));
  EXPECT_EQ(rr.range, 4u);
  EXPECT_EQ(rr.record, 12u);
  EXPECT_TRUE(rr.need_seed);
  EXPECT_EQ(msg::Read<msg::PushReply>(decode(EncodeMessage(env, msg::PushReply{3, true, 17})))
                .durable_seq,
            17u);
  msg::PullReply pr;
  pr.durable_seq = 18;
  EXPECT_EQ(msg::Read<msg::PullReply>(decode(EncodeMessage(env, pr))).durable_seq, 18u);
  // A primary's heartbeat carries each range's lag; pacerctl status shows it.
  msg::Heartbeat hb;
  hb.role = wire::Role::Shard;
  hb.lag = {{4, 7, 3, 0.25f}, {9, 2, 0, 0.0f}};
  EXPECT_EQ(msg::Read<msg::Heartbeat>(decode(EncodeMessage(env, hb))).lag, hb.lag);
  EXPECT_TRUE(msg::Read<msg::Heartbeat>(decode(EncodeMessage(env, msg::Heartbeat{}))).lag.empty());
  msg::HeartbeatReply hr;
  hr.hold_durable_ranges = {4, 9};
  EXPECT_EQ(msg::Read<msg::HeartbeatReply>(decode(EncodeMessage(env, hr))).hold_durable_ranges,
            hr.hold_durable_ranges);
  msg::StatusReply st;
  st.shards.push_back({});
  st.shards.back().id = 4;
  st.shards.back().lag_records = 3;
  st.shards.back().lag_seconds = 0.25f;
  st.shards.push_back({});  // no lag known
  const msg::StatusReply sr = msg::Read<msg::StatusReply>(decode(EncodeMessage(env, st)));
  ASSERT_EQ(sr.shards.size(), 2u);
  EXPECT_EQ(sr.shards[0].lag_records, 3);
  EXPECT_EQ(sr.shards[0].lag_seconds, 0.25f);
  EXPECT_EQ(sr.shards[1].lag_records, -1);
  EXPECT_EQ(sr.shards[1].lag_seconds, -1.0f);
  // A record's payload must be whole floats.
  Decoded d;
  DecodeError err;
  EXPECT_FALSE(Decode(EncodeMessage(env, rec, Frame::Copy(values.data(), 5)), JobOptions(), &d,
                      &err));
  EXPECT_EQ(err.code, wire::ErrorCode::BadLength);
}


// What is absent stays absent: a push with no read clock, a heartbeat
// reply with no shard map or assignment (a shard's) — the readers tell
// these apart from zeros.
TEST(MessagesTest, AbsentOptionalFieldsStayAbsent) {
  Envelope env;
  env.job_id = kJob;
  env.request_id = 7;
  auto decode = [](const Frames& f) {
    Decoded d;
    DecodeError err;
    EXPECT_TRUE(Decode(f, JobOptions(), &d, &err)) << err.reason;
    return d;
  };
  msg::Push push;
  push.clock = 3;
  push.batch = 16;
  push.keys = {wire::KeyLen(1, 2)};
  push.seq = 9;
  std::vector<float> g = {0.5f, 0.25f};
  Frame payload = Frame::FromVector(std::vector<uint8_t>(
      reinterpret_cast<uint8_t*>(g.data()), reinterpret_cast<uint8_t*>(g.data()) + 8));
  msg::Push back = msg::Read<msg::Push>(decode(EncodeMessage(env, push, payload)));
  EXPECT_FALSE(back.read_applied.has_value());
  EXPECT_FALSE(back.read_steps.has_value());
  EXPECT_EQ(back.parts, 1u);
  push.read_applied = 0;  // a pull of clock 0 is not "no pull"
  push.read_steps = 5;
  push.part = 1;
  push.parts = 2;
  back = msg::Read<msg::Push>(decode(EncodeMessage(env, push, payload)));
  ASSERT_TRUE(back.read_applied.has_value());
  EXPECT_EQ(*back.read_applied, 0);
  EXPECT_EQ(back.read_steps, 5u);
  EXPECT_EQ(back.part, 1u);
  EXPECT_EQ(back.seq, 9u);

  msg::HeartbeatReply shard_reply;
  shard_reply.state = wire::JobState::Running;
  shard_reply.faults = "drop:p=0.1";
  shard_reply.faults_version = 4;
  const auto r = msg::Read<msg::HeartbeatReply>(decode(EncodeMessage(env, shard_reply)));
  EXPECT_FALSE(r.shard_map.has_value());
  EXPECT_FALSE(r.assignment.has_value());
  EXPECT_EQ(r.faults, "drop:p=0.1");
  EXPECT_EQ(r.faults_version, 4u);
  EXPECT_EQ(r.replica_epoch, 0u);
  EXPECT_TRUE(r.replica_backups.empty());
  EXPECT_TRUE(r.backing.empty());
  msg::HeartbeatReply replicated = shard_reply;
  replicated.replica_epoch = 6;
  replicated.replica_backups = {{2, "tcp://127.0.0.1:8", 0, 0, "KEY2", {}, 6}};
  replicated.backing = {{3, "tcp://127.0.0.1:7", 0, 0, "KEY3", {}, 5}};
  replicated.hold_durable = true;
  replicated.hand_off_given_up = true;
  const auto rep = msg::Read<msg::HeartbeatReply>(decode(EncodeMessage(env, replicated)));
  EXPECT_EQ(rep.replica_epoch, 6u);
  EXPECT_TRUE(rep.hold_durable);
  EXPECT_TRUE(rep.hand_off_given_up);
  EXPECT_FALSE(r.hold_durable);
  EXPECT_FALSE(r.hand_off_given_up);
  ASSERT_EQ(rep.replica_backups.size(), 1u);
  EXPECT_EQ(rep.replica_backups[0].address, "tcp://127.0.0.1:8");
  EXPECT_EQ(rep.replica_backups[0].public_key, "KEY2");
  ASSERT_EQ(rep.backing.size(), 1u);
  EXPECT_EQ(rep.backing[0].id, 3u);
  EXPECT_EQ(rep.backing[0].epoch, 5u);
  msg::HeartbeatReply worker_reply = shard_reply;
  worker_reply.shard_map = msg::ShardMap{3, {{1, "tcp://127.0.0.1:9", 0, 10, "", {2, 3}, 4}}};
  worker_reply.assignment = msg::Assignment{32, 1, 2};
  worker_reply.partitions = {wire::PartitionPosition(2, 1, 64)};
  const auto w = msg::Read<msg::HeartbeatReply>(decode(EncodeMessage(env, worker_reply)));
  ASSERT_TRUE(w.shard_map.has_value());
  EXPECT_EQ(w.shard_map->version, 3u);
  ASSERT_EQ(w.shard_map->shards.size(), 1u);
  EXPECT_EQ(w.shard_map->shards[0].address, "tcp://127.0.0.1:9");
  EXPECT_EQ(w.shard_map->shards[0].backups, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(w.shard_map->shards[0].epoch, 4u);
  ASSERT_TRUE(w.assignment.has_value());
  EXPECT_EQ(w.assignment->staleness_range, 2u);
  ASSERT_EQ(w.partitions.size(), 1u);
  EXPECT_EQ(w.partitions[0].offset(), 64u);
}

}  // namespace
}  // namespace pacer
