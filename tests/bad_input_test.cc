// Bad input against a live shard and a live monitor: every kind of bad
// message is answered with an Error or dropped, its reason's counter goes up,
// and the process keeps serving valid requests.
#include <gtest/gtest.h>

#include <cstring>

#include "ps/client.h"
#include "ps/base/rpc.h"
#include "ps/base/wire.h"
#include "tests/process_util.h"
#include "tests/wire_test_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;
constexpr uint64_t kJob = 42;
constexpr size_t kMaxBytes = 1 << 20;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    monitor_ = Process::Start({PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--metrics-addr",
                               "127.0.0.1:0", "--job-id", std::to_string(kJob), "--lease", "60",
                               "--max-message-bytes", std::to_string(kMaxBytes),
                               // The test's raw client declares no training set.
                               "--data-partitions", "1"},
                              dir_.path(), "monitor");
    auto ma = monitor_->WaitForLine("listening ", seconds(10));
    auto mm = monitor_->WaitForLine("metrics ", seconds(10));
    ASSERT_TRUE(ma && mm) << monitor_->Stderr();
    monitor_addr_ = *ma;
    monitor_metrics_ = *mm;
    shard_ = Process::Start({PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0", "--monitor",
                             monitor_addr_, "--metrics-addr", "127.0.0.1:0", "--max-message-bytes",
                             std::to_string(kMaxBytes)},
                            dir_.path(), "shard");
    auto sa = shard_->WaitForLine("listening ", seconds(10));
    auto sm = shard_->WaitForLine("metrics ", seconds(10));
    ASSERT_TRUE(sa && sm) << shard_->Stderr();
    shard_addr_ = *sa;
    shard_metrics_ = *sm;

    transport_ = MakeZmqTransport({});
    // Join as a worker: register, declare a two-key model, wait for the run.
    RpcOptions boot;
    boot.check_job = false;
    auto ch = RpcChannel::Connect(transport_.get(), monitor_addr_, boot);
    ASSERT_TRUE(ch.ok());
    monitor_ch_ = std::move(*ch);
    flatbuffers::FlatBufferBuilder fbb;
    auto reg = monitor_ch_->Call(fbb, wire::CreateRegisterDirect(fbb, wire::Role::Worker, ""),
                                 Deadline(seconds(5)));
    ASSERT_TRUE(reg.ok()) << reg.status();
    id_ = reg->As<wire::RegisterReply>()->id();
    monitor_ch_->options().job_id = kJob;
    monitor_ch_->options().sender = id_;
    monitor_ch_->options().check_job = true;
    keys_ = {wire::KeyLen(0, 1000), wire::KeyLen(1, 1000)};
    flatbuffers::FlatBufferBuilder f2;
    auto decl = monitor_ch_->Call(f2, wire::CreateDeclareModel(f2, f2.CreateVectorOfStructs(keys_), 0),
                                  Deadline(seconds(5)));
    ASSERT_TRUE(decl.ok()) << decl.status();
    ShardMapInfo map;
    for (int i = 0; i < 100 && map.shards.empty(); ++i) {
      auto hb = Heartbeat();
      ASSERT_TRUE(hb.ok()) << hb.status();
      const auto* r = hb->As<wire::HeartbeatReply>();
      if (r->state() == wire::JobState::Running && r->shard_map()) map = ShardMapFromWire(r->shard_map());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(map.shards.size(), 1u);
    ClientOptions copts;
    copts.rpc.job_id = kJob;
    copts.rpc.sender = id_;
    copts.request_timeout = seconds(5);
    auto client = PsClient::Create(transport_.get(), copts, map, keys_);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    for (size_t i = 0; i < client_->params().size(); ++i) client_->params()[i] = float(i);
    ASSERT_TRUE(client_->Init().ok());
    auto raw = transport_->Connect(shard_addr_);
    ASSERT_TRUE(raw.ok());
    raw_shard_ = std::move(*raw);
    auto rawm = transport_->Connect(monitor_addr_);
    ASSERT_TRUE(rawm.ok());
    raw_monitor_ = std::move(*rawm);
  }

  TimePoint Deadline(Duration d) { return transport_->clock()->Now() + d; }

  absl::StatusOr<Decoded> Heartbeat() {
    flatbuffers::FlatBufferBuilder fbb;
    return monitor_ch_->Call(fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker, 0, 0, false),
                             Deadline(seconds(5)));
  }

  // A well-formed message of ours, for mutation.
  Frames ValidPull(uint64_t key = 0, uint64_t len = 1000) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::KeyLen> k = {wire::KeyLen(key, len)};
    Envelope env;
    env.job_id = kJob;
    env.sender = id_;
    env.request_id = ++request_;
    return EncodeBody(env, fbb, wire::CreatePull(fbb, 0, fbb.CreateVectorOfStructs(k), true));
  }
  Frames ValidPush(size_t floats, uint64_t key = 0, uint64_t len = 1000) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::KeyLen> k = {wire::KeyLen(key, len)};
    std::vector<float> values(floats, 0.5f);
    Envelope env;
    env.job_id = kJob;
    env.sender = id_;
    env.request_id = ++request_;
    return EncodeBody(env, fbb, wire::CreatePush(fbb, 0, 1, fbb.CreateVectorOfStructs(k)),
                      Frame::Copy(values.data(), values.size() * sizeof(float)));
  }

  double Rejected(const std::string& metrics_addr, const std::string& role, const std::string& reason) {
    auto v = MetricValue(FetchMetrics(metrics_addr), "pacer_rejected_messages_total",
                         {"role=\"" + role + "\"", "reason=\"" + reason + "\""});
    return v.value_or(-1);
  }

  // Sends `frames` on `socket` and checks the outcome: an Error with
  // `reason` (or nothing, when `answered` is false), the counter up by one,
  // and the process still serving.
  void Expect(Socket* socket, const std::string& role, const std::string& metrics_addr,
              Frames frames, const std::string& reason, bool answered) {
    SCOPED_TRACE(role + " / " + reason);
    const double before = Rejected(metrics_addr, role, reason);
    ASSERT_GE(before, 0) << "no counter for reason " << reason;
    ASSERT_TRUE(socket->Send(std::move(frames)).ok());
    Frames reply;
    auto got = transport_->Recv(socket, &reply, Deadline(answered ? seconds(5) : std::chrono::milliseconds(500)));
    ASSERT_TRUE(got.ok());
    if (answered) {
      ASSERT_TRUE(*got) << "no Error reply";
      DecodeOptions d;
      d.check_job = false;
      Decoded dec;
      DecodeError err;
      ASSERT_TRUE(Decode(reply, d, &dec, &err)) << err.reason;
      ASSERT_EQ(dec.type(), wire::Body::Error);
      EXPECT_EQ(ErrorCodeName(dec.As<wire::Error>()->code()), reason)
          << dec.As<wire::Error>()->reason()->str();
      EXPECT_FALSE(dec.As<wire::Error>()->reason()->str().empty());
    } else {
      EXPECT_FALSE(*got) << "expected the message to be dropped";
    }
    double after = before;
    for (int i = 0; i < 50 && after == before; ++i) {
      after = Rejected(metrics_addr, role, reason);
      if (after == before) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(after, before + 1);
    // Still serving.
    auto pulled = client_->Pull(0, /*latest=*/true);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(client_->params()[1500], 1500.0f);
    auto hb = Heartbeat();
    ASSERT_TRUE(hb.ok()) << hb.status();
    EXPECT_TRUE(shard_->Running());
    EXPECT_TRUE(monitor_->Running());
  }

  TempDir dir_;
  std::unique_ptr<Process> monitor_, shard_;
  std::string monitor_addr_, monitor_metrics_, shard_addr_, shard_metrics_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<RpcChannel> monitor_ch_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<Socket> raw_shard_, raw_monitor_;
  std::vector<wire::KeyLen> keys_;
  uint32_t id_ = 0;
  uint64_t request_ = 1000;
};

TEST_F(BadInputTest, ShardRejectsEachKindAndKeepsServing) {
  Socket* s = raw_shard_.get();
  const std::string r = "shard", m = shard_metrics_;
  // Garbage: nothing identifies a sender to answer.
  Expect(s, r, m, {Frame::Copy("garbage, not a Pacer message")}, "bad_envelope", false);
  // Truncated frames: a cut envelope is dropped; a cut header is answered.
  {
    Frames f = ValidPull();
    f[0] = Frame::Copy(f[0].data(), 20);
    Expect(s, r, m, f, "bad_envelope", false);
  }
  {
    Frames f = ValidPull();
    Frame half = Frame::Copy(f[1].data(), f[1].size() / 2);
    f[0] = RawEnvelope(kProtocolVersion, uint16_t(wire::Body::Pull), kJob, id_, half, 1);
    f[1] = half;
    Expect(s, r, m, f, "bad_header", true);
  }
  // Oversized: above --max-message-bytes.
  Expect(s, r, m, ValidPush(kMaxBytes / sizeof(float) + 1000, 0, kMaxBytes / sizeof(float) + 1000),
         "too_large", true);
  // Wrong type: a reply type that a shard does not serve.
  {
    flatbuffers::FlatBufferBuilder fbb;
    Envelope env;
    env.job_id = kJob;
    env.sender = id_;
    env.request_id = 7;
    Expect(s, r, m, EncodeBody(env, fbb, wire::CreateRegisterReply(fbb, 1, 0)), "wrong_type", true);
  }
  // Envelope type disagreeing with the header.
  {
    Frames f = ValidPull();
    f[0] = RawEnvelope(kProtocolVersion, uint16_t(wire::Body::Push), kJob, id_, f[1], 8);
    Expect(s, r, m, f, "wrong_type", true);
  }
  // Bad CRC: one payload byte flipped in flight.
  {
    Frames f = ValidPush(1000);
    std::vector<uint8_t> p(f[2].data(), f[2].data() + f[2].size());
    p[17] ^= 0x40;
    f[2] = Frame::FromVector(std::move(p));
    Expect(s, r, m, f, "bad_crc", true);
  }
  // Well-formed, CRC right, but the key lengths disagree with the payload.
  {
    Frames f = ValidPush(999);  // the key says 1000 values
    Expect(s, r, m, f, "bad_length", true);
  }
  // Wrong protocol version.
  {
    Frames f = ValidPull();
    f[0] = RawEnvelope(99, uint16_t(wire::Body::Pull), kJob, id_, f[1], 9);
    Expect(s, r, m, f, "wrong_version", true);
  }
  // Another job's id.
  {
    Frames f = ValidPull();
    f[0] = RawEnvelope(kProtocolVersion, uint16_t(wire::Body::Pull), kJob + 1, id_, f[1], 10);
    Expect(s, r, m, f, "wrong_job", true);
  }
  // A key this shard does not own.
  Expect(s, r, m, ValidPull(999, 10), "not_owner", true);
}

TEST_F(BadInputTest, MonitorRejectsEachKindAndKeepsServing) {
  Socket* s = raw_monitor_.get();
  const std::string r = "monitor", m = monitor_metrics_;
  Expect(s, r, m, {Frame::Copy("\x01\x02\x03")}, "bad_envelope", false);
  {
    Frames f = ValidPull();
    f[0] = Frame::Copy(f[0].data(), 39);
    Expect(s, r, m, f, "bad_envelope", false);
  }
  Expect(s, r, m, ValidPush(kMaxBytes / sizeof(float) + 10, 0, kMaxBytes / sizeof(float) + 10),
         "too_large", true);
  Expect(s, r, m, ValidPull(), "wrong_type", true);  // the monitor serves no pulls
  {
    Frames f = ValidPull();
    Frame half = Frame::Copy(f[1].data(), f[1].size() / 2);
    f[0] = RawEnvelope(kProtocolVersion, uint16_t(wire::Body::Pull), kJob, id_, half, 13);
    f[1] = half;
    Expect(s, r, m, f, "bad_header", true);
  }
  Expect(s, r, m, ValidPush(999), "bad_length", true);  // the key says 1000 values
  {
    Frames f = ValidPush(1000);
    std::vector<uint8_t> p(f[1].data(), f[1].data() + f[1].size());
    p[p.size() - 1] ^= 0x01;
    f[1] = Frame::FromVector(std::move(p));
    Expect(s, r, m, f, "bad_crc", true);
  }
  {
    Frames f = ValidPull();
    f[0] = RawEnvelope(kProtocolVersion + 1, uint16_t(wire::Body::Pull), kJob, id_, f[1], 11);
    Expect(s, r, m, f, "wrong_version", true);
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    Envelope env;
    env.job_id = kJob + 5;
    env.sender = id_;
    env.request_id = 12;
    Expect(s, r, m, EncodeBody(env, fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker, 0, 0, false)),
           "wrong_job", true);
  }
}

}  // namespace
}  // namespace pacer::test
