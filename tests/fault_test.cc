// The fault layer (ps/base/fault.h) on the in-process transport: rule parsing,
// and each kind of fault on real messages, seeded.
#include "ps/base/fault.h"

#include <gtest/gtest.h>

#include <thread>

#include "ps/base/wire.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;

// A message from `sender` with type `type` (an Ack body; the type in the
// envelope is what the fault rules read).
Frames Message(uint32_t sender, uint64_t request, wire::Body type = wire::Body::Ack) {
  Envelope env;
  env.sender = sender;
  env.request_id = request;
  flatbuffers::FlatBufferBuilder fbb(64);
  auto body = wire::CreateAck(fbb);
  Frames f = EncodeBody(env, fbb, body);
  // Encode took the type from the body; set the one the test wants.
  Envelope e;
  EXPECT_TRUE(PeekEnvelope(f[0], &e));
  if (type != wire::Body::Ack) {
    std::vector<uint8_t> bytes(f[0].data(), f[0].data() + f[0].size());
    const auto t = static_cast<uint16_t>(type);
    std::memcpy(bytes.data() + 6, &t, sizeof(t));
    f[0] = Frame::FromVector(std::move(bytes));
  }
  return f;
}

uint64_t RequestOf(const Frames& f) {
  Envelope e;
  EXPECT_TRUE(PeekEnvelope(f[1], &e));  // f[0]: the ROUTER's peer id
  return e.request_id;
}

class FaultTest : public ::testing::Test {
 protected:
  // Time is the fixture's fake clock, for the transport and the rules
  // alike: nothing here sleeps.
  void SetUp() override { Wire(std::make_shared<FaultInjector>(42, &registry_, &clock_), "mem://0"); }
  // Puts `faults` between a fresh client and server bound at `address`.
  void Wire(std::shared_ptr<FaultInjector> faults, const std::string& address) {
    client_.reset();
    server_.reset();
    faults_ = std::move(faults);
    transport_ = MakeFaultyTransport(MakeInProcTransport(&clock_), faults_);
    auto server = transport_->Bind(address);
    ASSERT_TRUE(server.ok());
    server_ = std::move(*server);
    auto client = transport_->Connect(server_->address());
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void Rules(const std::string& spec) {
    auto rules = ParseFaults(spec);
    ASSERT_TRUE(rules.ok()) << rules.status();
    faults_->SetRules(*rules);
  }
  // Sends messages with request ids `from`..`to` from `sender`.
  void Send(uint32_t sender, uint64_t from, uint64_t to, wire::Body type = wire::Body::Ack) {
    for (uint64_t r = from; r <= to; ++r) ASSERT_TRUE(client_->Send(Message(sender, r, type)).ok());
  }
  // Request ids deliverable now, without waiting.
  std::vector<uint64_t> ReceivedNow() {
    std::vector<uint64_t> got;
    for (;;) {
      Frames f;
      auto r = transport_->Recv(server_.get(), &f, clock_.Now());
      EXPECT_TRUE(r.ok());
      if (!r.ok() || !*r) return got;
      got.push_back(RequestOf(f));
    }
  }
  // Request ids received as `wait` passes: what is deliverable now, then
  // what is due by then.
  std::vector<uint64_t> Received(Duration wait = milliseconds(50)) {
    std::vector<uint64_t> got = ReceivedNow();
    clock_.Advance(wait);
    for (uint64_t r : ReceivedNow()) got.push_back(r);
    return got;
  }

  FakeClock clock_;
  prometheus::Registry registry_;
  std::shared_ptr<FaultInjector> faults_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Socket> server_, client_;
};

TEST(ParseFaultsTest, ReadsEveryKindAndKey) {
  auto r = ParseFaults("drop:p=0.1; delay:ms=200,jitter=50;duplicate:p=0.2,type=Push|Pull;"
                       "reorder;corrupt:p=0.05;partition:peers=3|4");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 6u);
  EXPECT_EQ((*r)[0].kind, FaultKind::kDrop);
  EXPECT_DOUBLE_EQ((*r)[0].probability, 0.1);
  EXPECT_EQ((*r)[1].delay, milliseconds(200));
  EXPECT_EQ((*r)[1].jitter, milliseconds(50));
  EXPECT_EQ((*r)[2].types, (std::set<wire::Body>{wire::Body::Push, wire::Body::Pull}));
  EXPECT_DOUBLE_EQ((*r)[3].probability, 1.0);
  EXPECT_EQ((*r)[5].peers, (std::set<uint32_t>{3, 4}));
  // It prints back to the same rules.
  auto again = ParseFaults(FaultsToString(*r));
  ASSERT_TRUE(again.ok()) << again.status() << " " << FaultsToString(*r);
  EXPECT_EQ(FaultsToString(*again), FaultsToString(*r));
  EXPECT_TRUE(ParseFaults("")->empty());
}

TEST(ParseFaultsTest, RejectsBadRulesWithTheReason) {
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"explode", "unknown kind"},
           {"drop:p=2", "p must be"},
           {"drop:ms=5", "delay and slow_disk only"},
           {"drop:type=Nope", "unknown message type"},
           {"partition:peers=x", "not an id"},
           {"drop:colour=red", "unknown key"},
           {"drop:p", "KEY=VALUE"}}) {
    auto r = ParseFaults(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  }
}

TEST_F(FaultTest, NoRulesPassEverythingInOrder) {
  Send(7, 1, 5);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

TEST_F(FaultTest, DropWithProbabilityIsSeededAndCounted) {
  Rules("drop:p=0.5");
  Send(7, 1, 400);
  const auto got = Received();
  // Binomial(400, 0.5): 200 +- 50 is over 5 standard deviations.
  EXPECT_GT(got.size(), 150u);
  EXPECT_LT(got.size(), 250u);
  EXPECT_EQ(faults_->injected(FaultKind::kDrop), 400.0 - static_cast<double>(got.size()));
  // The same seed drops the same messages.
  auto again = std::make_shared<FaultInjector>(42, nullptr);
  again->SetRules(faults_->rules());
  std::vector<uint64_t> kept;
  for (uint64_t r = 1; r <= 400; ++r) {
    Frames f = Message(7, r);
    Envelope e;
    PeekEnvelope(f[0], &e);
    if (!again->Decide(&e).drop) kept.push_back(r);
  }
  EXPECT_EQ(kept, got);
}

TEST_F(FaultTest, DelayHoldsMessagesBackAndRecvWaitsForThem) {
  Rules("delay:ms=150,jitter=20");
  Send(7, 1, 3);
  // The fault layer takes them in (and starts their delay) at the first
  // receive; on a fake clock every receive here is one that does not wait.
  EXPECT_TRUE(ReceivedNow().empty()) << "delivered before its delay";
  clock_.Advance(milliseconds(100));
  EXPECT_TRUE(ReceivedNow().empty()) << "delivered before its delay (at 100 ms)";
  clock_.Advance(milliseconds(49));
  EXPECT_TRUE(ReceivedNow().empty()) << "delivered before its delay (at 149 ms)";
  clock_.Advance(milliseconds(21));  // 170 ms: past the delay and its jitter
  EXPECT_EQ(ReceivedNow().size(), 3u);
  EXPECT_EQ(faults_->injected(FaultKind::kDelay), 3);
}

TEST_F(FaultTest, PollWakesForADelayedMessage) {
  Rules("delay:ms=100");
  Send(7, 1, 1);
  Socket* s = server_.get();
  const TimePoint t0 = clock_.Now();
  // A poll that does not wait takes the message in: its delay runs from t0.
  auto none = transport_->Poll(std::span<Socket* const>(&s, 1), t0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "ready before its delay";
  // Poll waits on the fake clock (to a deadline of t0 + 1 s) while this
  // thread moves it past the message's delay.
  // Before 100 ms the message is not due, so Poll cannot return with it;
  // it returns once it is, long before its deadline (else join would hang
  // until ctest's timeout: the fake clock never reaches t0 + 1 s).
  absl::StatusOr<std::vector<size_t>> ready;
  std::thread poller([&] {
    ready = transport_->Poll(std::span<Socket* const>(&s, 1), t0 + milliseconds(1000));
  });
  clock_.Advance(milliseconds(99));
  clock_.Advance(milliseconds(1));
  poller.join();
  ASSERT_TRUE(ready.ok());
  ASSERT_EQ(ready->size(), 1u);
  EXPECT_EQ(clock_.Now() - t0, milliseconds(100));
  Frames f;
  EXPECT_TRUE(*server_->TryRecv(&f));
}

TEST_F(FaultTest, DuplicateDeliversTwice) {
  Rules("duplicate");
  Send(7, 1, 2);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{1, 1, 2, 2}));
}

TEST_F(FaultTest, ReorderLetsTheNextMessageOvertake) {
  Rules("reorder:type=Pull");  // only the Pull is held back
  Send(7, 1, 1, wire::Body::Pull);
  Send(7, 2, 3);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{2, 3, 1}));
}

TEST_F(FaultTest, CorruptedMessagesFailVerification) {
  Rules("corrupt");
  for (uint64_t r = 1; r <= 50; ++r) ASSERT_TRUE(client_->Send(Message(7, r)).ok());
  int rejected = 0;
  for (int i = 0; i < 50; ++i) {
    Frames f;
    auto got = transport_->Recv(server_.get(), &f, clock_.Now());
    ASSERT_TRUE(got.ok() && *got);
    f.erase(f.begin());  // the ROUTER's peer id
    Decoded d;
    DecodeError err;
    DecodeOptions opts;
    opts.check_job = false;
    if (!Decode(f, opts, &d, &err)) {
      ++rejected;
      EXPECT_TRUE(err.code == wire::ErrorCode::BadCrc || err.code == wire::ErrorCode::BadHeader ||
                  err.code == wire::ErrorCode::BadLength)
          << ErrorCodeName(err.code) << ": " << err.reason;
    }
  }
  EXPECT_EQ(rejected, 50) << "a flipped byte got through verification";
  EXPECT_EQ(faults_->injected(FaultKind::kCorrupt), 50);
}

TEST_F(FaultTest, PartitionBlocksOnlyTheNamedPeers) {
  Rules("partition:peers=5");
  Send(5, 1, 3);
  Send(6, 4, 6);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{4, 5, 6}));
  EXPECT_EQ(faults_->injected(FaultKind::kPartition), 3);
  // Lifted: everyone gets through again.
  faults_->SetRules({});
  Send(5, 7, 7);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{7}));
}

TEST_F(FaultTest, ARuleWithForEndsByItself) {
  // The rules' time is the injector's clock (the fixture's fake one).
  Rules("partition:for=0.2");
  Send(7, 1, 1);
  EXPECT_TRUE(ReceivedNow().empty());
  clock_.Advance(milliseconds(199));
  Send(7, 2, 2);
  EXPECT_TRUE(ReceivedNow().empty()) << "still within its 0.2 s";
  clock_.Advance(milliseconds(1));
  Send(7, 3, 3);
  EXPECT_EQ(ReceivedNow(), (std::vector<uint64_t>{3}));
}

TEST_F(FaultTest, SlowDiskDelaysCheckpointsNotMessages) {
  Rules("slow_disk:ms=300,jitter=10");
  Send(7, 1, 2);
  EXPECT_EQ(Received(), (std::vector<uint64_t>{1, 2}));
  const Duration d = faults_->DiskDelay();
  EXPECT_GE(d, milliseconds(300));
  EXPECT_LT(d, milliseconds(310));
  EXPECT_EQ(faults_->injected(FaultKind::kSlowDisk), 1);
}

TEST_F(FaultTest, CountersStartAtZeroForEveryKind) {
  int kinds = 0;
  for (const auto& family : registry_.Collect()) {
    if (family.name != "pacer_faults_injected_total") continue;
    for (const auto& m : family.metric) {
      EXPECT_EQ(m.counter.value, 0);
      ++kinds;
    }
  }
  EXPECT_EQ(kinds, 7);
}

}  // namespace
}  // namespace pacer
