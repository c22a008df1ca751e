// Tests of the worker-side client library (ps/client.h): SplitByShard, and
// PsClient over the in-process transport against fake shards on threads.
#include "ps/client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ps/base/rpc.h"
#include "ps/base/transport.h"
#include "ps/base/wire.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kJob = 5;
constexpr uint32_t kWorker = 21;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

ShardMapInfo Map(const std::vector<std::pair<std::string, KeyRange>>& shards) {
  ShardMapInfo map;
  map.version = 3;
  uint32_t id = 100;
  for (const auto& [address, range] : shards) map.shards.push_back({id++, address, range});
  return map;
}

// ---------------------------------------------------------------------------
// SplitByShard.

TEST(SplitByShardTest, ContiguousSlicesWithOffsets) {
  ShardMapInfo map = Map({{"a", {0, 10}}, {"b", {10, 20}}, {"c", {20, kMax}}});
  std::vector<wire::KeyLen> keys = {{1, 2}, {5, 3}, {12, 4}, {25, 1}, {30, 6}};
  auto slices = SplitByShard(keys, map);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 3u);
  const Slice& a = (*slices)[0];
  const Slice& b = (*slices)[1];
  const Slice& c = (*slices)[2];
  EXPECT_EQ(a.shard, 0u);
  EXPECT_EQ(a.first_key, 0u);
  EXPECT_EQ(a.num_keys, 2u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.length, 5u);
  EXPECT_EQ(b.shard, 1u);
  EXPECT_EQ(b.first_key, 2u);
  EXPECT_EQ(b.num_keys, 1u);
  EXPECT_EQ(b.offset, 5u);
  EXPECT_EQ(b.length, 4u);
  EXPECT_EQ(c.shard, 2u);
  EXPECT_EQ(c.first_key, 3u);
  EXPECT_EQ(c.num_keys, 2u);
  EXPECT_EQ(c.offset, 9u);
  EXPECT_EQ(c.length, 7u);
}

// After add-shard takes the upper half of the first range, the new shard
// is listed last: slices follow the keys, whatever the shards' order.
TEST(SplitByShardTest, ShardsListedOutOfKeyOrder) {
  ShardMapInfo map = Map({{"a", {0, 5}}, {"c", {10, kMax}}, {"b", {5, 10}}});
  std::vector<wire::KeyLen> keys = {{1, 2}, {6, 3}, {12, 4}};
  auto slices = SplitByShard(keys, map);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 3u);
  EXPECT_EQ((*slices)[0].offset, 0u);
  EXPECT_EQ((*slices)[0].length, 2u);
  EXPECT_EQ((*slices)[2].shard, 2u);  // "b"
  EXPECT_EQ((*slices)[2].first_key, 1u);
  EXPECT_EQ((*slices)[2].offset, 2u);
  EXPECT_EQ((*slices)[2].length, 3u);
  EXPECT_EQ((*slices)[1].first_key, 2u);  // "c"
  EXPECT_EQ((*slices)[1].offset, 5u);
  EXPECT_EQ((*slices)[1].length, 4u);
}

TEST(SplitByShardTest, ShardOwningNoKeyGetsEmptySlice) {
  ShardMapInfo map = Map({{"a", {0, 10}}, {"b", {10, 20}}, {"c", {20, kMax}}});
  std::vector<wire::KeyLen> keys = {{1, 2}, {25, 3}};
  auto slices = SplitByShard(keys, map);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 3u);
  EXPECT_EQ((*slices)[0].num_keys, 1u);
  EXPECT_EQ((*slices)[0].length, 2u);
  EXPECT_EQ((*slices)[1].shard, 1u);
  EXPECT_EQ((*slices)[1].num_keys, 0u);
  EXPECT_EQ((*slices)[1].length, 0u);
  EXPECT_EQ((*slices)[2].first_key, 1u);
  EXPECT_EQ((*slices)[2].offset, 2u);
  EXPECT_EQ((*slices)[2].length, 3u);
}

TEST(SplitByShardTest, KeyWithoutOwnerFails) {
  ShardMapInfo map = Map({{"a", {0, 10}}, {"b", {10, 20}}});
  std::vector<wire::KeyLen> keys = {{1, 2}, {30, 1}};
  auto slices = SplitByShard(keys, map);
  ASSERT_FALSE(slices.ok());
  EXPECT_NE(slices.status().message().find("30"), std::string_view::npos) << slices.status();
}

TEST(SplitByShardTest, NoKeysGivesEmptySlices) {
  ShardMapInfo map = Map({{"a", {0, 10}}, {"b", {10, kMax}}});
  auto slices = SplitByShard({}, map);
  ASSERT_TRUE(slices.ok());
  for (const Slice& s : *slices) EXPECT_EQ(s.num_keys, 0u);
}

// ---------------------------------------------------------------------------
// PsClient against fake shards.

// A shard stand-in on its own thread: it binds `address`, answers `expected`
// requests (Pull from `values`, Push and Init recorded and acknowledged) and
// exits; it gives up after 10 s of real time so a broken client cannot hang
// the test.
class FakeShard {
 public:
  struct Request {
    wire::Body type;
    uint64_t clock = 0;
    uint32_t batch = 0;
    std::vector<wire::KeyLen> keys;
    std::vector<float> floats;
    uint64_t seq = 0;     // Push
    uint32_t part = 0;    // Push
    uint32_t parts = 1;   // Push
  };

  FakeShard(Transport* transport, const std::string& address,
            std::map<uint64_t, std::vector<float>> values, int64_t applied_clock = 0)
      : values_(std::move(values)), applied_clock_(applied_clock) {
    auto socket = transport->Bind(address);
    EXPECT_TRUE(socket.ok()) << socket.status();
    if (socket.ok()) socket_ = std::move(*socket);
  }
  ~FakeShard() { Join(); }

  // Runs on the shard's thread, after a request is decoded and before it is
  // answered.
  std::function<void(const Request&)> on_request;
  // When set, every request is answered with this error instead.
  std::optional<wire::ErrorCode> fail_with;
  // How many requests get fail_with (-1: all), the rest a normal answer.
  int fail_times = -1;
  // When false, requests are read and recorded but never answered.
  bool reply = true;
  // After this many requests, the parts of pushes held so far are
  // forgotten (as by a restart); -1: never.
  int forget_parts_after = -1;
  // How many pull replies get one payload bit flipped after they are
  // encoded (damaged on the way, as by the `corrupt` fault).
  int damage_pull_replies = 0;
  // >= 0: push replies say the pushes are durable through this many seqs
  // before theirs (replication); -1: they say nothing.
  int64_t durable_behind = -1;

  void Start(int expected) {
    thread_ = std::thread([this, expected] { Serve(expected); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // Valid after Join().
  const std::vector<Request>& requests() const { return requests_; }

 private:
  void Serve(int expected) {
    if (socket_ == nullptr) return;
    const auto give_up = std::chrono::steady_clock::now() + seconds(10);
    int served = 0;
    while (served < expected && std::chrono::steady_clock::now() < give_up) {
      Frames frames;
      auto got = socket_->TryRecv(&frames);
      if (!got.ok()) return;
      if (!*got) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      Frame peer = frames[0];
      frames.erase(frames.begin());
      DecodeOptions opts;
      opts.job_id = kJob;
      Decoded d;
      DecodeError err;
      if (!Decode(frames, opts, &d, &err)) {
        ADD_FAILURE() << "fake shard got a bad message: " << err.reason;
        continue;
      }
      ++served;
      Request r = ToRequest(d);
      requests_.push_back(r);
      if (on_request) on_request(r);
      if (!reply) continue;
      Frames answer = Answer(d, r);
      if (r.type == wire::Body::Pull && damage_pull_replies > 0 && answer.size() == 3) {
        --damage_pull_replies;
        std::vector<uint8_t> bytes(answer[2].data(), answer[2].data() + answer[2].size());
        bytes.back() ^= 0x10;
        answer[2] = Frame::FromVector(std::move(bytes));
      }
      answer.insert(answer.begin(), peer);
      EXPECT_TRUE(socket_->Send(std::move(answer)).ok());
    }
  }

  static Request ToRequest(const Decoded& d) {
    Request r;
    r.type = d.type();
    const flatbuffers::Vector<const wire::KeyLen*>* keys = nullptr;
    if (d.type() == wire::Body::Pull) {
      r.clock = d.As<wire::Pull>()->clock();
      keys = d.As<wire::Pull>()->keys();
    } else if (d.type() == wire::Body::Push) {
      r.clock = d.As<wire::Push>()->clock();
      r.batch = d.As<wire::Push>()->batch();
      r.seq = d.As<wire::Push>()->seq();
      r.part = d.As<wire::Push>()->part();
      r.parts = d.As<wire::Push>()->parts();
      keys = d.As<wire::Push>()->keys();
    } else if (d.type() == wire::Body::Init) {
      keys = d.As<wire::Init>()->keys();
    }
    if (keys != nullptr) {
      for (const auto* k : *keys) r.keys.push_back(*k);
    }
    r.floats.assign(d.floats().begin(), d.floats().end());
    return r;
  }

  Frames Answer(const Decoded& d, const Request& r) {
    Envelope env;
    env.job_id = kJob;
    env.sender = 1;
    env.request_id = d.env.request_id;
    if (fail_with && fail_times != 0) {
      if (fail_times > 0) --fail_times;
      return EncodeError(d.env, 1, *fail_with, "fake shard refuses");
    }
    flatbuffers::FlatBufferBuilder fbb;
    switch (r.type) {
      case wire::Body::Pull: {
        std::vector<float> payload;
        for (const auto& k : r.keys) {
          const std::vector<float>& v = values_.at(k.key());
          EXPECT_EQ(v.size(), k.length());
          payload.insert(payload.end(), v.begin(), v.end());
        }
        auto kv = fbb.CreateVectorOfStructs(r.keys);
        return EncodeBody(env, fbb, wire::CreatePullReply(fbb, r.clock, applied_clock_, kv),
                          payload.empty()
                              ? Frame()
                              : Frame::Copy(payload.data(), payload.size() * sizeof(float)));
      }
      case wire::Body::Push: {
        // As a shard: a push in parts is complete with its last part.
        std::set<uint32_t>& held = held_parts_[r.seq];
        held.insert(r.part);
        const bool complete = held.size() == r.parts;
        if (forget_parts_after >= 0 && static_cast<int>(requests_.size()) == forget_parts_after) {
          held_parts_.clear();
        }
        const uint64_t durable =
            durable_behind < 0 || r.seq <= static_cast<uint64_t>(durable_behind)
                ? 0
                : r.seq - static_cast<uint64_t>(durable_behind);
        return EncodeBody(env, fbb, wire::CreatePushReply(fbb, r.clock, complete, durable));
      }
      default:
        return EncodeBody(env, fbb, wire::CreateAck(fbb));
    }
  }

  std::unique_ptr<Socket> socket_;
  std::map<uint64_t, std::vector<float>> values_;
  int64_t applied_clock_;
  std::thread thread_;
  std::vector<Request> requests_;  // owned by the thread until Join()
  std::map<uint64_t, std::set<uint32_t>> held_parts_;  // per push seq
};

ClientOptions Options() {
  ClientOptions o;
  o.rpc.job_id = kJob;
  o.rpc.sender = kWorker;
  o.request_timeout = seconds(5);
  return o;
}

// Shard a owns keys [0, 10): key 1 (2 values), key 2 (1 value); shard b owns
// [10, max): key 10 (3 values).
class PsClientTest : public ::testing::Test {
 protected:
  PsClientTest()
      : transport_(MakeInProcTransport()),
        a_(transport_.get(), "mem://a", {{1, {1.0f, 2.0f}}, {2, {3.0f}}}, /*applied_clock=*/4),
        b_(transport_.get(), "mem://b", {{10, {4.0f, 5.0f, 6.0f}}}, /*applied_clock=*/3) {}

  std::unique_ptr<PsClient> MakeClient() {
    // Not in key order on purpose: the client lays values out by key.
    std::vector<wire::KeyLen> keys = {{10, 3}, {2, 1}, {1, 2}};
    auto c = PsClient::Create(transport_.get(), Options(),
                              Map({{"mem://a", {0, 10}}, {"mem://b", {10, kMax}}}), keys);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<Transport> transport_;
  FakeShard a_;
  FakeShard b_;
};

TEST_F(PsClientTest, PullMergesBothShardsAtTheirOffsets) {
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->params().size(), 6u);
  auto applied = client->Pull(/*clock=*/7);
  a_.Join();
  b_.Join();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(*applied, 3);  // the lowest of the shards' applied clocks
  std::vector<float> params(client->params().begin(), client->params().end());
  EXPECT_EQ(params, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
  ASSERT_EQ(a_.requests().size(), 1u);
  EXPECT_EQ(a_.requests()[0].type, wire::Body::Pull);
  EXPECT_EQ(a_.requests()[0].clock, 7u);
  ASSERT_EQ(a_.requests()[0].keys.size(), 2u);
  EXPECT_EQ(a_.requests()[0].keys[0].key(), 1u);
  EXPECT_EQ(a_.requests()[0].keys[1].key(), 2u);
  ASSERT_EQ(b_.requests().size(), 1u);
  ASSERT_EQ(b_.requests()[0].keys.size(), 1u);
  EXPECT_EQ(b_.requests()[0].keys[0].key(), 10u);
}

TEST_F(PsClientTest, PushSendsEachShardItsSlice) {
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  const std::vector<float> g = {0.5f, -0.5f, 1.5f, 2.5f, -3.5f, 4.5f};
  std::copy(g.begin(), g.end(), client->grads().begin());
  absl::Status s = client->Push(/*clock=*/9, /*batch=*/32);
  a_.Join();
  b_.Join();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(a_.requests().size(), 1u);
  const FakeShard::Request& ra = a_.requests()[0];
  EXPECT_EQ(ra.type, wire::Body::Push);
  EXPECT_EQ(ra.clock, 9u);
  EXPECT_EQ(ra.batch, 32u);
  ASSERT_EQ(ra.keys.size(), 2u);
  EXPECT_EQ(ra.keys[0].key(), 1u);
  EXPECT_EQ(ra.keys[0].length(), 2u);
  EXPECT_EQ(ra.keys[1].key(), 2u);
  EXPECT_EQ(ra.floats, (std::vector<float>{0.5f, -0.5f, 1.5f}));
  ASSERT_EQ(b_.requests().size(), 1u);
  const FakeShard::Request& rb = b_.requests()[0];
  ASSERT_EQ(rb.keys.size(), 1u);
  EXPECT_EQ(rb.keys[0].key(), 10u);
  EXPECT_EQ(rb.floats, (std::vector<float>{2.5f, -3.5f, 4.5f}));
}

// The flat layout is key 1 [0, 2), key 2 [2, 3) on shard a, key 10 [3, 6)
// on shard b. A backward pass that finishes [3, 6), then [2, 3), then [0, 2)
// gives shard b one message at stage 0 and shard a two parts: key 2 at
// stage 1 (part 1), key 1 at stage 2 (part 0).
TEST_F(PsClientTest, LayerWisePushSendsEachStageAsItIsReported) {
  a_.Start(2);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  client->SetPushStages({{3, 6}, {2, 3}, {0, 2}});
  const std::vector<float> g = {0.5f, -0.5f, 1.5f, 2.5f, -3.5f, 4.5f};
  client->StartPush(/*clock=*/9, /*batch=*/32);
  std::copy(g.begin() + 3, g.end(), client->grads().begin() + 3);
  ASSERT_TRUE(client->PushStage(0).ok());
  b_.Join();  // shard b has its whole push before the rest is computed
  ASSERT_EQ(b_.requests().size(), 1u);
  EXPECT_EQ(b_.requests()[0].parts, 1u);
  EXPECT_EQ(b_.requests()[0].floats, (std::vector<float>{2.5f, -3.5f, 4.5f}));
  client->grads()[2] = g[2];
  ASSERT_TRUE(client->PushStage(1).ok());
  client->grads()[0] = g[0];
  client->grads()[1] = g[1];
  ASSERT_TRUE(client->PushStage(2).ok());
  absl::Status s = client->FinishPush();
  a_.Join();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(a_.requests().size(), 2u);
  const FakeShard::Request& first = a_.requests()[0];
  const FakeShard::Request& second = a_.requests()[1];
  EXPECT_EQ(first.part, 1u);
  EXPECT_EQ(first.parts, 2u);
  ASSERT_EQ(first.keys.size(), 1u);
  EXPECT_EQ(first.keys[0].key(), 2u);
  EXPECT_EQ(first.floats, (std::vector<float>{1.5f}));
  EXPECT_EQ(second.part, 0u);
  EXPECT_EQ(second.parts, 2u);
  ASSERT_EQ(second.keys.size(), 1u);
  EXPECT_EQ(second.keys[0].key(), 1u);
  EXPECT_EQ(second.floats, (std::vector<float>{0.5f, -0.5f}));
  EXPECT_EQ(first.seq, second.seq);
  EXPECT_EQ(first.clock, 9u);
  EXPECT_EQ(second.batch, 32u);
  EXPECT_EQ(client->push_messages(), 3u);
  EXPECT_EQ(client->push_parts(), 2u);
}

TEST_F(PsClientTest, PartsThatNeverCompleteAreAllSentAgain) {
  // Shard a forgets the part it held after the first request (a restart):
  // both parts are answered, neither completes, and the client sends both
  // again.
  a_.forget_parts_after = 1;
  a_.Start(4);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  client->SetPushStages({{3, 6}, {2, 3}, {0, 2}});
  absl::Status s = client->Push(/*clock=*/2, /*batch=*/8);
  a_.Join();
  b_.Join();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(a_.requests().size(), 4u);
  std::multiset<uint32_t> parts;
  for (const auto& r : a_.requests()) parts.insert(r.part);
  EXPECT_EQ(parts, (std::multiset<uint32_t>{0, 0, 1, 1}));
}

TEST_F(PsClientTest, InitSendsParamsSlices) {
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  std::copy(w.begin(), w.end(), client->params().begin());
  absl::Status s = client->Init();
  a_.Join();
  b_.Join();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(a_.requests().size(), 1u);
  EXPECT_EQ(a_.requests()[0].type, wire::Body::Init);
  EXPECT_EQ(a_.requests()[0].floats, (std::vector<float>{1, 2, 3}));
  ASSERT_EQ(b_.requests().size(), 1u);
  EXPECT_EQ(b_.requests()[0].floats, (std::vector<float>{4, 5, 6}));
}

TEST_F(PsClientTest, ShardErrorBecomesStatusWithWireCode) {
  b_.fail_with = wire::ErrorCode::NotOwner;
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  auto applied = client->Pull(0);
  a_.Join();
  b_.Join();
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(WireCode(applied.status()), wire::ErrorCode::NotOwner) << applied.status();
  EXPECT_NE(applied.status().message().find("mem://b"), std::string_view::npos) << applied.status();
  // NotOwner: keys moved; Aborted tells the caller to take the newer map.
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kAborted) << applied.status();
}

// RpcOptions::resend_after: a request lost on the way is sent again (same
// id) until answered; without it the caller waits out its deadline.
TEST(RpcResendTest, ALostRequestIsSentAgainUntilAnswered) {
  auto transport = MakeInProcTransport();
  auto server = transport->Bind("mem://rpc");
  ASSERT_TRUE(server.ok());
  std::vector<uint64_t> ids;
  std::thread peer([&] {
    // Ignores the first copy (as if lost), answers the second.
    for (int seen = 0; seen < 2;) {
      Frames f;
      auto got = transport->Recv(server->get(), &f, transport->clock()->Now() + seconds(3));
      if (!got.ok() || !*got) return;
      ++seen;
      Frame who = f[0];
      f.erase(f.begin());
      Decoded d;
      DecodeError err;
      DecodeOptions dopts;
      dopts.check_job = false;
      ASSERT_TRUE(Decode(f, dopts, &d, &err)) << err.reason;
      ids.push_back(d.env.request_id);
      if (seen < 2) continue;
      flatbuffers::FlatBufferBuilder fbb(64);
      Frames answer = EncodeBody(d.env, fbb, wire::CreateAck(fbb));
      answer.insert(answer.begin(), who);
      ASSERT_TRUE((*server)->Send(std::move(answer)).ok());
    }
  });
  RpcOptions o;
  o.check_job = false;
  o.resend_after = milliseconds(100);
  auto channel = RpcChannel::Connect(transport.get(), "mem://rpc", o);
  ASSERT_TRUE(channel.ok());
  flatbuffers::FlatBufferBuilder fbb(64);
  auto reply = (*channel)->Call(fbb, wire::CreateStatusRequest(fbb),
                                transport->clock()->Now() + seconds(2));
  peer.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], ids[1]) << "a resend is the same request";
}

// A shard that found our push damaged (bad CRC) applied nothing: the client
// sends the same push again at once instead of failing.
TEST_F(PsClientTest, DamagedPushIsSentAgainNotAnError) {
  b_.fail_with = wire::ErrorCode::BadCrc;
  b_.fail_times = 1;
  a_.Start(1);
  b_.Start(2);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status pushed = client->Push(0, 8);
  a_.Join();
  b_.Join();
  EXPECT_TRUE(pushed.ok()) << pushed;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(1)) << "waited for the resend timer";
  ASSERT_EQ(b_.requests().size(), 2u);
  EXPECT_EQ(b_.requests()[1].floats, b_.requests()[0].floats);
}

// A pull reply damaged on the way (its payload fails the block checks as
// the client copies it) is asked for again at once, and the parameters end
// up as the shard holds them.
TEST_F(PsClientTest, DamagedPullReplyIsAskedForAgainNotAnError) {
  b_.damage_pull_replies = 1;
  a_.Start(1);
  b_.Start(2);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  auto applied = client->Pull(/*clock=*/7);
  a_.Join();
  b_.Join();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(1)) << "waited for the resend timer";
  std::vector<float> params(client->params().begin(), client->params().end());
  EXPECT_EQ(params, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
  ASSERT_EQ(b_.requests().size(), 2u);
  EXPECT_EQ(b_.requests()[1].type, wire::Body::Pull);
}

// The spec's concurrency requirement: "Shard A holds its reply until shard B
// has seen its request". A client that sent to one shard at a time and waited
// for each reply would never reach B while A waits.
TEST_F(PsClientTest, ShardAHoldsItsReplyUntilShardBHasSeenItsRequest) {
  std::mutex mu;
  std::condition_variable cv;
  bool b_seen = false;
  bool b_seen_before_a_replied = false;
  b_.on_request = [&](const FakeShard::Request&) {
    std::lock_guard<std::mutex> lock(mu);
    b_seen = true;
    cv.notify_all();
  };
  a_.on_request = [&](const FakeShard::Request&) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, seconds(3), [&] { return b_seen; });
    b_seen_before_a_replied = b_seen;
  };
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  auto applied = client->Pull(1);
  a_.Join();
  b_.Join();
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_TRUE(b_seen_before_a_replied) << "the client did not reach shard B while A held its reply";
  std::vector<float> params(client->params().begin(), client->params().end());
  EXPECT_EQ(params, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
}

TEST(PsClientThreeShardsTest, ShardWithoutKeysGetsEmptyRequests) {
  auto transport = MakeInProcTransport();
  FakeShard a(transport.get(), "mem://a", {{1, {1.0f}}});
  FakeShard b(transport.get(), "mem://b", {});
  FakeShard c(transport.get(), "mem://c", {{30, {3.0f, 4.0f}}});
  for (FakeShard* s : {&a, &b, &c}) s->Start(2);
  auto client =
      PsClient::Create(transport.get(), Options(),
                       Map({{"mem://a", {0, 10}}, {"mem://b", {10, 20}}, {"mem://c", {20, kMax}}}),
                       {{1, 1}, {30, 2}});
  ASSERT_TRUE(client.ok()) << client.status();
  auto applied = (*client)->Pull(0);
  ASSERT_TRUE(applied.ok()) << applied.status();
  std::vector<float> params((*client)->params().begin(), (*client)->params().end());
  EXPECT_EQ(params, (std::vector<float>{1.0f, 3.0f, 4.0f}));
  std::fill((*client)->grads().begin(), (*client)->grads().end(), 1.0f);
  absl::Status s = (*client)->Push(0, 8);
  for (FakeShard* sh : {&a, &b, &c}) sh->Join();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(b.requests().size(), 2u);
  for (const auto& r : b.requests()) {
    EXPECT_TRUE(r.keys.empty());
    EXPECT_TRUE(r.floats.empty());
  }
  ASSERT_EQ(c.requests().size(), 2u);
  EXPECT_EQ(c.requests()[1].floats, (std::vector<float>{1.0f, 1.0f}));
}

TEST(PsClientDeadlineTest, SilentShardGivesDeadlineExceeded) {
  // Fake time: the silent shard moves the clock past the request timeout
  // instead of answering, so nothing waits in real time for the deadline.
  FakeClock clock;
  auto transport = MakeInProcTransport(&clock);
  FakeShard a(transport.get(), "mem://a", {{1, {1.0f}}});
  FakeShard silent(transport.get(), "mem://b", {{10, {2.0f}}});
  silent.reply = false;
  silent.on_request = [&](const FakeShard::Request&) { clock.Advance(seconds(6)); };
  a.Start(1);
  silent.Start(1);
  auto client =
      PsClient::Create(transport.get(), Options(),  // request_timeout 5 s
                       Map({{"mem://a", {0, 10}}, {"mem://b", {10, kMax}}}), {{1, 1}, {10, 1}});
  ASSERT_TRUE(client.ok()) << client.status();
  auto applied = (*client)->Pull(0);
  a.Join();
  silent.Join();
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kDeadlineExceeded) << applied.status();
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

// Replication: with backups in the map, a push is kept until a reply says
// it is durable; after a failover (the range at a new owner, a higher
// epoch) the kept ones go to the new owner first, with their seqs.
TEST_F(PsClientTest, KeptPushesGoAgainToTheNewOwnerAfterAFailover) {
  a_.durable_behind = 1;  // each reply: durable through the seq before
  b_.durable_behind = 0;  // durable at once
  a_.Start(3);
  b_.Start(3);
  std::vector<wire::KeyLen> keys = {{10, 3}, {2, 1}, {1, 2}};
  ShardMapInfo map = Map({{"mem://a", {0, 10}}, {"mem://b", {10, kMax}}});
  map.shards[0].backups = {7};
  map.shards[0].epoch = 1;
  map.shards[1].backups = {8};
  map.shards[1].epoch = 1;
  auto made = PsClient::Create(transport_.get(), Options(), map, keys);
  ASSERT_TRUE(made.ok()) << made.status();
  PsClient& client = **made;
  for (uint64_t c = 0; c < 3; ++c) {
    for (size_t i = 0; i < 6; ++i) client.grads()[i] = static_cast<float>(10 * c + i);
    ASSERT_TRUE(client.Push(c, 8).ok());
  }
  a_.Join();
  b_.Join();
  // Shard a said seqs 1 and 2 are durable; seq 3 is kept (a's 3 values).
  EXPECT_EQ(client.held_pushes(), 1u);
  EXPECT_EQ(client.held_values(), 3u);

  // a dies; its backup c takes the range at epoch 2.
  FakeShard c(transport_.get(), "mem://c", {});
  c.durable_behind = 0;
  c.Start(2);
  b_.Start(1);
  map.version = 4;
  map.shards[0].address = "mem://c";
  map.shards[0].epoch = 2;
  ASSERT_TRUE(client.SetMap(map).ok());
  for (size_t i = 0; i < 6; ++i) client.grads()[i] = 100.0f + static_cast<float>(i);
  ASSERT_TRUE(client.Push(3, 8).ok());
  c.Join();
  b_.Join();
  ASSERT_EQ(c.requests().size(), 2u);
  EXPECT_EQ(c.requests()[0].seq, 3u);  // the kept push, as it was
  EXPECT_EQ(c.requests()[0].clock, 2u);
  EXPECT_EQ(c.requests()[0].floats, (std::vector<float>{20.0f, 21.0f, 22.0f}));
  EXPECT_EQ(c.requests()[1].seq, 4u);  // then the new one
  EXPECT_EQ(c.requests()[1].floats, (std::vector<float>{100.0f, 101.0f, 102.0f}));
  ASSERT_EQ(b_.requests().size(), 4u);  // b's range did not move: nothing again
  EXPECT_EQ(b_.requests()[3].seq, 4u);
  EXPECT_EQ(client.resent_pushes(), 1u);
  EXPECT_EQ(client.held_pushes(), 0u);  // c said durable at once
}

TEST_F(PsClientTest, WithoutBackupsNothingIsKept) {
  a_.Start(1);
  b_.Start(1);
  auto client = MakeClient();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Push(0, 8).ok());
  a_.Join();
  b_.Join();
  EXPECT_EQ(client->held_pushes(), 0u);
}

}  // namespace
}  // namespace pacer
