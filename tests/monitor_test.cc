// Tests of MonitorCore (monitor/monitor.h) with a fake clock: registration,
// the start of a run, worker leases and membership, model declarations and
// the target-accuracy stop; and the key-move machine (monitor/key_move.h).
#include "monitor/monitor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "monitor/key_move.h"
#include "ps/base/wire.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kJob = 77;
const std::vector<wire::KeyLen> kModel = {{1, 100}, {2, 50}, {3, 10}};

Frame PeerFrame(uint64_t id) { return Frame::Copy(&id, sizeof(id)); }

// Replies echo the request's job id (0 for a newcomer's Register, another
// job's id for WrongJob), so the job is checked by the tests where it matters.
Decoded MustDecode(const Frames& frames) {
  DecodeOptions opts;
  opts.check_job = false;
  Decoded d;
  DecodeError err;
  EXPECT_TRUE(Decode(frames, opts, &d, &err)) << err.reason;
  return d;
}

std::string Describe(const Decoded& d) {
  if (d.message == nullptr) return "undecodable";
  if (d.type() == wire::Body::Error) {
    const auto* e = d.As<wire::Error>();
    return std::string("Error ") + ErrorCodeName(e->code()) + ": " +
           (e->reason() ? e->reason()->str() : "");
  }
  return wire::EnumNameBody(d.type());
}

// The worker ids of a Membership message, sorted.
std::vector<uint32_t> MemberIds(const wire::Membership* m) {
  std::vector<uint32_t> ids;
  if (m->workers() != nullptr) {
    for (const auto* w : *m->workers()) ids.push_back(w->id());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

class MonitorTest : public ::testing::Test {
 protected:
  MonitorTest() : clock_(TimePoint{} + std::chrono::hours(1)) {
    options_.job_id = kJob;
    options_.min_shards = 1;
    options_.min_workers = 2;
    options_.lease = std::chrono::seconds(1);
    options_.target_accuracy = 0.9f;
    core_ = std::make_unique<MonitorCore>(options_, &clock_);
  }

  // Sends one message from routing id `peer` and returns the replies to peers
  // (shard_index < 0); messages for shards are kept in to_shards_.
  template <class T>
  std::vector<Decoded> Send(uint64_t peer, uint64_t job, uint32_t sender,
                            flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<T> body) {
    Envelope env;
    env.job_id = job;
    env.sender = sender;
    env.request_id = ++next_request_;
    Frames frames = EncodeBody(env, fbb, body);
    frames.insert(frames.begin(), PeerFrame(peer));
    // Under CURVE every connection has its key: here "K" and the routing id.
    if (curve_) frames[0].set_peer_key(std::string("K").append(std::to_string(peer)));
    std::vector<MonitorCore::Outgoing> out;
    core_->Handle(std::move(frames), &out);
    return Sort(out);
  }

  std::vector<Decoded> Sort(const std::vector<MonitorCore::Outgoing>& out) {
    std::vector<Decoded> replies;
    for (const auto& o : out) {
      Decoded d = MustDecode(o.frames);
      if (o.shard_index >= 0) {
        EXPECT_EQ(d.env.job_id, kJob);
        EXPECT_EQ(d.env.sender, 0u);  // the monitor
        to_shards_.push_back({o.shard_index, d});
      } else {
        replies.push_back(d);
      }
    }
    return replies;
  }

  // One reply, which must be of type `type`.
  static Decoded Only(const std::vector<Decoded>& replies, wire::Body type) {
    EXPECT_EQ(replies.size(), 1u);
    if (replies.empty()) return Decoded();
    EXPECT_EQ(replies[0].type(), type) << Describe(replies[0]);
    return replies[0];
  }

  static std::optional<wire::ErrorCode> ErrorOf(const std::vector<Decoded>& replies) {
    EXPECT_EQ(replies.size(), 1u);
    if (replies.size() != 1 || replies[0].type() != wire::Body::Error) return std::nullopt;
    return replies[0].As<wire::Error>()->code();
  }

  std::vector<Decoded> Register(uint64_t peer, wire::Role role, const std::string& address,
                                uint64_t job = 0) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(peer, job, 0, fbb, wire::CreateRegisterDirect(fbb, role, address.c_str()));
  }
  // Registers a worker and returns its id.
  uint32_t RegisterWorker(uint64_t peer) {
    Decoded d = Only(Register(peer, wire::Role::Worker, ""), wire::Body::RegisterReply);
    if (d.message == nullptr || d.type() != wire::Body::RegisterReply) return 0;
    EXPECT_EQ(d.env.job_id, kJob);  // the newcomer learns the job id here
    return d.As<wire::RegisterReply>()->id();
  }
  std::vector<Decoded> Declare(uint32_t sender, const std::vector<wire::KeyLen>& keys) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, kJob, sender, fbb, wire::CreateDeclareModelDirect(fbb, &keys));
  }
  std::vector<Decoded> Heartbeat(uint32_t sender, uint64_t clock = 0, bool done = false) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, kJob, sender, fbb,
                wire::CreateHeartbeat(fbb, wire::Role::Worker, clock, 10.0f, done));
  }
  std::vector<Decoded> Accuracy(uint32_t sender, float accuracy) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, kJob, sender, fbb,
                wire::CreateAccuracyReport(fbb, 10, accuracy, 0.5f, 1000));
  }
  // A worker's heartbeat with timings: 5 iterations at `batch`, `spp`
  // seconds of compute per sample, 2 ms of communication each.
  Decoded ReportTimings(uint32_t id, uint32_t batch, double spp) {
    flatbuffers::FlatBufferBuilder fbb;
    wire::HeartbeatBuilder hb(fbb);
    hb.add_role(wire::Role::Worker);
    hb.add_iterations(5);
    hb.add_batch(batch);
    hb.add_compute_seconds_per_sample(static_cast<float>(spp));
    hb.add_communication_seconds(0.002f);
    // The exact sums a worker sends too: 5 iterations, each batch x spp.
    const double per_iteration = spp * batch;
    hb.add_samples(5 * uint64_t{batch});
    hb.add_compute_seconds(5 * per_iteration);
    hb.add_batch_squares(5.0 * batch * batch);
    hb.add_batch_compute(5.0 * batch * per_iteration);
    hb.add_compute_min_seconds(per_iteration);
    hb.add_compute_max_seconds(per_iteration);
    auto body = hb.Finish();
    return Only(Send(id, kJob, id, fbb, body), wire::Body::HeartbeatReply);
  }

  void Tick() {
    std::vector<MonitorCore::Outgoing> out;
    core_->Tick(&out);
    auto replies = Sort(out);
    EXPECT_TRUE(replies.empty()) << "Tick answered a peer";
  }

  // Messages for shard `index` of type `type` sent since the last Take, removed.
  std::vector<Decoded> Take(int index, wire::Body type) {
    std::vector<Decoded> got;
    for (auto it = to_shards_.begin(); it != to_shards_.end();) {
      if (it->first == index && it->second.type() == type) {
        got.push_back(it->second);
        it = to_shards_.erase(it);
      } else {
        ++it;
      }
    }
    return got;
  }

  // The shard acknowledges `request`, as its reply would arrive.
  void AckFromShard(size_t index, const Decoded& request) {
    flatbuffers::FlatBufferBuilder fbb;
    Envelope env;
    env.job_id = kJob;
    env.sender = shard_id_;
    env.request_id = request.env.request_id;
    std::vector<MonitorCore::Outgoing> out;
    core_->HandleShardReply(index, MustDecode(EncodeBody(env, fbb, wire::CreateAck(fbb))), &out);
  }
  // Acknowledges every message the shard was sent so far.
  void AckAll() {
    for (auto& [index, d] : to_shards_) AckFromShard(static_cast<size_t>(index), d);
    to_shards_.clear();
  }

  // One shard and workers A and B registered, the model declared by A, the
  // shard told and acknowledging: the job runs.
  void StartJob() {
    Decoded s = Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
    ASSERT_EQ(s.type(), wire::Body::RegisterReply);
    shard_id_ = s.As<wire::RegisterReply>()->id();
    worker_a_ = RegisterWorker(200);
    worker_b_ = RegisterWorker(201);
    ASSERT_NE(worker_a_, 0u);
    ASSERT_NE(worker_b_, 0u);
    ASSERT_NE(worker_a_, worker_b_);
    Only(Declare(worker_a_, kModel), wire::Body::Ack);
    EXPECT_EQ(core_->state(), wire::JobState::Waiting);

    Tick();
    auto declares = Take(0, wire::Body::DeclareModel);
    ASSERT_EQ(declares.size(), 1u);
    const auto* keys = declares[0].As<wire::DeclareModel>()->keys();
    ASSERT_NE(keys, nullptr);
    ASSERT_EQ(keys->size(), kModel.size());  // one shard owns every key
    for (size_t i = 0; i < kModel.size(); ++i) {
      EXPECT_EQ(keys->Get(static_cast<flatbuffers::uoffset_t>(i))->key(), kModel[i].key());
    }
    auto members = Take(0, wire::Body::Membership);
    ASSERT_EQ(members.size(), 1u);
    EXPECT_EQ(MemberIds(members[0].As<wire::Membership>()),
              (std::vector<uint32_t>{worker_a_, worker_b_}));
    EXPECT_EQ(members[0].As<wire::Membership>()->version(), core_->membership_version());
    for (const auto* w : *members[0].As<wire::Membership>()->workers()) {
      EXPECT_EQ(w->batch(), options_.global_batch / 2);
    }
    EXPECT_EQ(core_->state(), wire::JobState::Waiting);  // not before the shard acknowledges

    AckFromShard(0, declares[0]);
    AckFromShard(0, members[0]);
    Tick();
    ASSERT_EQ(core_->state(), wire::JobState::Running);
    to_shards_.clear();
  }

  // Data partitions: these tests' declarations carry no training set size,
  // and several are of the partitions' rules (the data stream's are in
  // data_stream_test and the cluster tests).
  MonitorOptions options_ = [] {
    MonitorOptions o;
    o.data_stream = false;
    return o;
  }();
  FakeClock clock_;
  std::unique_ptr<MonitorCore> core_;
  std::vector<std::pair<int, Decoded>> to_shards_;
  uint64_t next_request_ = 0;
  bool curve_ = false;  // messages carry a CURVE key per routing id
  uint32_t shard_id_ = 0;
  uint32_t worker_a_ = 0;
  uint32_t worker_b_ = 0;
};

TEST_F(MonitorTest, RegistrationDeclarationAndAcksStartTheJob) {
  StartJob();
  EXPECT_EQ(core_->num_shards(), 1u);
  EXPECT_EQ(core_->shard_address(0), "mem://shard0");
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{worker_a_, worker_b_}));
  // A running worker's heartbeat carries the shard map.
  Decoded hb = Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
  const auto* r = hb.As<wire::HeartbeatReply>();
  EXPECT_EQ(r->state(), wire::JobState::Running);
  ASSERT_NE(r->shard_map(), nullptr);
  ASSERT_EQ(r->shard_map()->shards()->size(), 1u);
  EXPECT_EQ(r->shard_map()->shards()->Get(0)->address()->str(), "mem://shard0");
}

TEST_F(MonitorTest, UnderCurveIdsAreBoundToTheKeysTheyRegisteredWith) {
  curve_ = true;
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  const uint32_t a = RegisterWorker(200), b = RegisterWorker(300);
  {
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(200, kJob, a, fbb, wire::CreateDeclareModelDirect(fbb, &kModel)), wire::Body::Ack);
  }
  Tick();
  // Shards learn each worker's key with the membership, and workers each
  // shard's with the map.
  bool keyed = false;
  for (const auto& [shard, d] : to_shards_) {
    if (d.type() != wire::Body::Membership) continue;
    for (const auto* w : *d.As<wire::Membership>()->workers()) {
      ASSERT_NE(w->public_key(), nullptr);
      EXPECT_EQ(w->public_key()->str(), std::string("K").append(w->id() == a ? "200" : "300"));
      keyed = true;
    }
  }
  EXPECT_TRUE(keyed);
  // Worker b's connection claiming to be worker a: refused, counted.
  flatbuffers::FlatBufferBuilder fbb;
  EXPECT_EQ(ErrorOf(Send(300, kJob, a, fbb,
                         wire::CreateHeartbeat(fbb, wire::Role::Worker, 0, 10.0f, /*done=*/true))),
            wire::ErrorCode::Refused);
  EXPECT_TRUE(core_->LiveWorkers().size() == 2u) << "the forged 'done' heartbeat was taken";
  // Each under its own key is heard.
  fbb.Clear();
  Only(Send(200, kJob, a, fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker, 0, 10.0f)),
       wire::Body::HeartbeatReply);
  flatbuffers::FlatBufferBuilder fbb2;
  Only(Send(300, kJob, b, fbb2, wire::CreateHeartbeat(fbb2, wire::Role::Worker, 0, 10.0f)),
       wire::Body::HeartbeatReply);
  // Worker b's key claiming the shard's id (to take its key range to an
  // address of its own), or its address: refused; the shard keeps both.
  const uint32_t shard = core_->shard_id(0);
  flatbuffers::FlatBufferBuilder fbb3;
  wire::RegisterBuilder rb(fbb3);
  auto evil = fbb3.CreateString("mem://evil");
  rb.add_role(wire::Role::Shard);
  rb.add_address(evil);
  rb.add_shard_id(shard);
  rb.add_checkpoint_job(kJob);
  rb.add_incarnation(99);
  auto reg = rb.Finish();
  EXPECT_EQ(ErrorOf(Send(300, kJob, 0, fbb3, reg)), wire::ErrorCode::Refused);
  EXPECT_EQ(ErrorOf(Register(300, wire::Role::Shard, "mem://shard0")), wire::ErrorCode::Refused);
  EXPECT_EQ(core_->shard_address(0), "mem://shard0");
  EXPECT_EQ(core_->shard_key(0), "K100");
  // The shard itself, registering again (a retry), is heard.
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  // Worker a's request again (the same frames, a retry) is answered; its
  // request id again with other contents is refused.
  const uint64_t id = next_request_ + 1;
  const auto heartbeat = [&](float speed) {
    next_request_ = id - 1;
    flatbuffers::FlatBufferBuilder f;
    return Send(200, kJob, a, f, wire::CreateHeartbeat(f, wire::Role::Worker, 0, speed));
  };
  Only(heartbeat(10.0f), wire::Body::HeartbeatReply);
  Only(heartbeat(10.0f), wire::Body::HeartbeatReply);
  EXPECT_EQ(ErrorOf(heartbeat(99.0f)), wire::ErrorCode::Refused);
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_security_refused_messages_total",
                       {{"reason", "request_id_reused"}}),
            1);
}

TEST_F(MonitorTest, UnderCurveCommandsThatChangeTheJobNeedAnOperatorKey) {
  curve_ = true;
  options_.operator_keys = {"K900"};
  core_ = std::make_unique<MonitorCore>(options_, &clock_);
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  worker_a_ = RegisterWorker(200);
  worker_b_ = RegisterWorker(201);
  ASSERT_EQ(core_->LiveWorkers().size(), 2u);
  constexpr uint32_t kToolSender = 0xFFFFFFFFu;  // pacerctl's
  const auto remove = [&](uint64_t peer) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(peer, kJob, kToolSender, fbb, wire::CreateRemoveWorker(fbb, worker_a_));
  };
  // A worker's key (allowed to connect, but no operator) cannot remove a
  // worker, or set faults; it may list them.
  EXPECT_EQ(ErrorOf(remove(201)), wire::ErrorCode::Refused);
  EXPECT_EQ(core_->LiveWorkers().size(), 2u);
  {
    flatbuffers::FlatBufferBuilder fbb;
    EXPECT_EQ(ErrorOf(Send(201, kJob, kToolSender, fbb,
                           wire::CreateFaultControlDirect(fbb, wire::FaultOp::Set, "all",
                                                          "drop:p=1"))),
              wire::ErrorCode::Refused);
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(201, kJob, kToolSender, fbb,
              wire::CreateFaultControlDirect(fbb, wire::FaultOp::List, "", "")),
         wire::Body::FaultControlReply);
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    EXPECT_EQ(ErrorOf(Send(201, kJob, kToolSender, fbb,
                           wire::CreateShardControl(fbb, wire::ShardOp::Pause, 0))),
              wire::ErrorCode::Refused);
  }
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_security_refused_messages_total",
                       {{"reason", "not_operator"}}),
            3);
  // The operator's key can.
  Only(remove(900), wire::Body::Ack);
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{worker_b_}));
}

TEST_F(MonitorTest, JobWaitsForEnoughWorkers) {
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  uint32_t a = RegisterWorker(200);
  Only(Declare(a, kModel), wire::Body::Ack);
  Tick();
  EXPECT_TRUE(to_shards_.empty());  // min_workers is 2
  EXPECT_EQ(core_->state(), wire::JobState::Waiting);
}

TEST_F(MonitorTest, FaultsForAnIdNobodyHasAreRefused) {
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  const uint32_t a = RegisterWorker(200);
  auto set = [&](const std::string& target) {
    flatbuffers::FlatBufferBuilder fbb;
    constexpr uint32_t kToolSender = 0xFFFFFFFFu;  // pacerctl's
    return Send(300, kJob, kToolSender, fbb,
                wire::CreateFaultControlDirect(fbb, wire::FaultOp::Set, target.c_str(), "drop:p=0.1"));
  };
  EXPECT_EQ(ErrorOf(set("worker:99")), wire::ErrorCode::Refused);
  EXPECT_EQ(ErrorOf(set("server:99")), wire::ErrorCode::Refused);
  // Too long for an id: refused, not a crash, and not cut down to one.
  EXPECT_EQ(ErrorOf(set("worker:99999999999999999999")), wire::ErrorCode::Refused);
  EXPECT_EQ(ErrorOf(set("worker:" + std::to_string(uint64_t{1} << 32 | a))), wire::ErrorCode::Refused);
  Only(set("worker:" + std::to_string(a)), wire::Body::FaultControlReply);
  Only(set("server:" + std::to_string(core_->shard_id(0))), wire::Body::FaultControlReply);
}

TEST_F(MonitorTest, OnlyRegisterMayCarryJobZero) {
  // Register with job 0 or with the job's id is accepted.
  Only(Register(100, wire::Role::Shard, "mem://shard0", /*job=*/0), wire::Body::RegisterReply);
  Only(Register(200, wire::Role::Worker, "", /*job=*/kJob), wire::Body::RegisterReply);
  // Anything else with job 0, or another job's id, is refused.
  flatbuffers::FlatBufferBuilder fbb;
  EXPECT_EQ(ErrorOf(Send(200, 0, 2, fbb, wire::CreateHeartbeat(fbb, wire::Role::Worker))),
            wire::ErrorCode::WrongJob);
  EXPECT_EQ(ErrorOf(Register(201, wire::Role::Worker, "", /*job=*/kJob + 1)),
            wire::ErrorCode::WrongJob);
  EXPECT_EQ(core_->rejected(wire::ErrorCode::WrongJob), 2);
  EXPECT_EQ(core_->workers().size(), 1u);
}

TEST_F(MonitorTest, WorkerWithinLeaseStaysLive) {
  StartJob();
  const uint64_t version = core_->membership_version();
  Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
  Only(Heartbeat(worker_b_), wire::Body::HeartbeatReply);
  clock_.Advance(milliseconds(1000));  // exactly the lease: not yet past it
  Tick();
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{worker_a_, worker_b_}));
  EXPECT_EQ(core_->membership_version(), version);
  EXPECT_TRUE(Take(0, wire::Body::Membership).empty());
  Only(Heartbeat(worker_b_), wire::Body::HeartbeatReply);
}

TEST_F(MonitorTest, SilentWorkerLosesItsLease) {
  StartJob();
  const uint64_t version = core_->membership_version();
  Only(Heartbeat(worker_b_), wire::Body::HeartbeatReply);
  // A keeps heartbeating; B falls silent.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(milliseconds(300));
    Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
    Tick();
    if (i < 3) {
      EXPECT_EQ(core_->LiveWorkers().size(), 2u) << "after " << (i + 1) * 300 << " ms";
    }
  }
  // 1.2 s since B's last heartbeat.
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{worker_a_}));
  EXPECT_EQ(core_->membership_version(), version + 1);
  EXPECT_FALSE(core_->workers().at(worker_b_).alive);

  auto members = Take(0, wire::Body::Membership);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].As<wire::Membership>()->version(), version + 1);
  EXPECT_EQ(MemberIds(members[0].As<wire::Membership>()), (std::vector<uint32_t>{worker_a_}));

  EXPECT_EQ(ErrorOf(Heartbeat(worker_b_)), wire::ErrorCode::NotMember);
  Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
}

TEST_F(MonitorTest, UnacknowledgedMembershipIsResent) {
  StartJob();
  clock_.Advance(milliseconds(1500));
  Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
  Tick();  // B expires
  auto first = Take(0, wire::Body::Membership);
  ASSERT_EQ(first.size(), 1u);
  clock_.Advance(options_.shard_resend / 2);
  Tick();
  EXPECT_TRUE(Take(0, wire::Body::Membership).empty());
  clock_.Advance(options_.shard_resend);
  Tick();
  auto again = Take(0, wire::Body::Membership);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].As<wire::Membership>()->version(), first[0].As<wire::Membership>()->version());
  AckFromShard(0, again[0]);
  Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
  clock_.Advance(options_.shard_resend * 2);
  Tick();
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{worker_a_}));
  EXPECT_TRUE(Take(0, wire::Body::Membership).empty());
}

// Regression test for a monitor bug (fixed): HandleShardReply marked the *current*
// membership version as acknowledged when the shard acknowledges an older
// Membership request. If the membership changes while a Membership message
// is in flight (here: worker C registers, the monitor sends v(n), then A
// finishes -> v(n+1) before the shard's ack of v(n) arrives), the newer
// version is never sent: the shard keeps the departed worker in its barrier.
TEST_F(MonitorTest, MembershipChangedWhileAckInFlightIsStillSent) {
  StartJob();
  Only(Heartbeat(worker_b_), wire::Body::HeartbeatReply);
  const uint32_t c = RegisterWorker(202);
  clock_.Advance(options_.shard_resend);
  Tick();
  auto sent = Take(0, wire::Body::Membership);
  ASSERT_EQ(sent.size(), 1u);
  const uint64_t sent_version = sent[0].As<wire::Membership>()->version();
  EXPECT_EQ(MemberIds(sent[0].As<wire::Membership>()).size(), 3u);

  Only(Heartbeat(worker_a_, 5, /*done=*/true), wire::Body::HeartbeatReply);  // A leaves
  ASSERT_EQ(core_->membership_version(), sent_version + 1);
  AckFromShard(0, sent[0]);  // the ack of the older version arrives

  // Every later Tick must eventually tell the shard that A is gone.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(options_.shard_resend);
    Only(Heartbeat(worker_b_), wire::Body::HeartbeatReply);
    Only(Heartbeat(c), wire::Body::HeartbeatReply);
    Tick();
  }
  auto later = Take(0, wire::Body::Membership);
  ASSERT_FALSE(later.empty()) << "membership v" << sent_version + 1 << " never reached the shard";
  EXPECT_EQ(later.back().As<wire::Membership>()->version(), sent_version + 1);
  EXPECT_EQ(MemberIds(later.back().As<wire::Membership>()), (std::vector<uint32_t>{worker_b_, c}));
}

TEST_F(MonitorTest, DifferentModelDeclarationIsMismatch) {
  StartJob();
  Only(Declare(worker_b_, kModel), wire::Body::Ack);  // the same model is fine
  EXPECT_EQ(ErrorOf(Declare(worker_b_, {{1, 100}, {2, 51}, {3, 10}})), wire::ErrorCode::Mismatch);
  EXPECT_EQ(ErrorOf(Declare(worker_b_, {{1, 100}, {2, 50}})), wire::ErrorCode::Mismatch);
  EXPECT_EQ(core_->rejected(wire::ErrorCode::Mismatch), 2);
}

// The first declaration's optimizer is the job's (the monitor's --optimizer,
// sgd here, is only the default): the shards are told it, a newcomer's job
// config says it, a restarted monitor keeps it. A later worker that
// declares another is refused with both named; one that declares none is
// taken.
TEST_F(MonitorTest, FirstDeclaredOptimizerIsTheJobsAndAnotherIsRefused) {
  const auto declare = [&](uint32_t sender, const msg::DeclareModel& m) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, kJob, sender, fbb, msg::Build(fbb, m));
  };
  const auto error_text = [](const std::vector<Decoded>& replies) {
    return replies.size() == 1 ? Describe(replies[0]) : std::string("no single reply");
  };
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  const uint32_t a = RegisterWorker(200);
  const uint32_t b = RegisterWorker(201);
  msg::DeclareModel adamw;
  adamw.keys = kModel;
  adamw.optimizer = JobOptimizer{OptimizerKind::kAdamW, DefaultSettings(OptimizerKind::kAdamW)};
  adamw.optimizer->settings.lr = 0.002f;
  Only(declare(a, adamw), wire::Body::Ack);

  Tick();
  auto to_shard = Take(0, wire::Body::DeclareModel);
  ASSERT_EQ(to_shard.size(), 1u);
  const auto* sent = to_shard[0].As<wire::DeclareModel>();
  ASSERT_TRUE(sent->optimizer().has_value());
  EXPECT_EQ(*sent->optimizer(), wire::OptimizerKind::AdamW);
  ASSERT_NE(sent->optimizer_settings(), nullptr);
  EXPECT_FLOAT_EQ(sent->optimizer_settings()->lr().value_or(0), 0.002f);
  Decoded late = Only(Register(202, wire::Role::Worker, ""), wire::Body::RegisterReply);
  EXPECT_EQ(late.As<wire::RegisterReply>()->job()->optimizer(), wire::OptimizerKind::AdamW);

  msg::DeclareModel sgd = adamw;
  sgd.optimizer = JobOptimizer{};  // sgd, its defaults
  auto refused = declare(b, sgd);
  EXPECT_EQ(ErrorOf(refused), wire::ErrorCode::Mismatch);
  EXPECT_NE(error_text(refused).find("declares the optimizer sgd"), std::string::npos)
      << error_text(refused);
  EXPECT_NE(error_text(refused).find("the job runs adamw (lr=0.002"), std::string::npos)
      << error_text(refused);
  msg::DeclareModel other_lr = adamw;
  other_lr.optimizer->settings.lr = 0.001f;
  EXPECT_EQ(ErrorOf(declare(b, other_lr)), wire::ErrorCode::Mismatch);
  msg::DeclareModel none = adamw;
  none.optimizer.reset();
  Only(declare(b, none), wire::Body::Ack);
  Only(declare(b, adamw), wire::Body::Ack);

  MonitorCore restarted(options_, &clock_);
  ASSERT_TRUE(restarted.RestoreState(core_->SaveState()).ok());
  core_ = std::make_unique<MonitorCore>(options_, &clock_);
  ASSERT_TRUE(core_->RestoreState(restarted.SaveState()).ok());
  Decoded after = Only(Register(203, wire::Role::Worker, ""), wire::Body::RegisterReply);
  EXPECT_EQ(after.As<wire::RegisterReply>()->job()->optimizer(), wire::OptimizerKind::AdamW);
  EXPECT_EQ(ErrorOf(declare(b, sgd)), wire::ErrorCode::Mismatch);
}

// A job whose first worker declares no optimizer runs the monitor's; a
// later one that declares another is told so.
TEST_F(MonitorTest, AnOptimizerDeclaredAfterNoneMustBeTheMonitors) {
  StartJob();  // worker A declared none: sgd, as the monitor's flags say
  msg::DeclareModel adam;
  adam.keys = kModel;
  adam.optimizer = JobOptimizer{OptimizerKind::kAdam, DefaultSettings(OptimizerKind::kAdam)};
  flatbuffers::FlatBufferBuilder fbb;
  auto refused = Send(worker_b_, kJob, worker_b_, fbb, msg::Build(fbb, adam));
  EXPECT_EQ(ErrorOf(refused), wire::ErrorCode::Mismatch);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(Describe(refused[0]).find("pacer-monitor --optimizer; its first worker declared none"),
            std::string::npos)
      << Describe(refused[0]);
}

// A refused worker leaves the membership at once. When as many workers as
// the job needs (--min-workers, 2 here) were refused, none was taken and
// none was left for a lease, nothing will train: the job stops, as a
// failure.
TEST_F(MonitorTest, AJobWhoseEveryWorkerIsRefusedStopsAsAFailure) {
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  const uint32_t a = RegisterWorker(200);
  const uint32_t b = RegisterWorker(201);
  EXPECT_EQ(ErrorOf(Declare(a, {{1, 100}, {1, 100}})), wire::ErrorCode::Mismatch);
  EXPECT_EQ(core_->LiveWorkers(), (std::vector<uint32_t>{b}));
  Tick();
  EXPECT_EQ(core_->state(), wire::JobState::Waiting);  // b may yet declare
  EXPECT_EQ(ErrorOf(Declare(b, {{1, 100}, {1, 100}})), wire::ErrorCode::Mismatch);
  EXPECT_EQ(ErrorOf(Declare(b, {{1, 100}, {1, 100}})), wire::ErrorCode::Mismatch);  // counted once
  Tick();
  EXPECT_EQ(core_->state(), wire::JobState::Waiting);  // a correct worker may yet come
  clock_.Advance(options_.lease);
  Tick();
  EXPECT_EQ(core_->state(), wire::JobState::Stopped);
  EXPECT_TRUE(core_->stop_failed());
  EXPECT_NE(core_->stop_reason().find(
                "every worker was refused (2 worker(s); the last: duplicate key in model)"),
            std::string::npos)
      << core_->stop_reason();
}

// A worker may ask for a rank (pacer-run: its launch index): it gets it
// when it is below --min-workers (so the workers a job starts with hold
// ranks 0 .. min-workers - 1) and no live worker holds it, else the lowest
// free one.
TEST_F(MonitorTest, AWorkerGetsTheRankItAsksForWhenNoLiveWorkerHoldsIt) {
  options_.min_workers = 3;
  core_ = std::make_unique<MonitorCore>(options_, &clock_);
  const auto rank_of = [&](uint64_t peer, std::optional<uint32_t> hint) {
    msg::Register r;
    r.role = wire::Role::Worker;
    r.rank_hint = hint;
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(peer, 0, 0, fbb, msg::Build(fbb, r)), wire::Body::RegisterReply);
    return d.message == nullptr ? UINT32_MAX : d.As<wire::RegisterReply>()->rank();
  };
  EXPECT_EQ(rank_of(200, 2), 2u);
  EXPECT_EQ(rank_of(201, 0), 0u);
  EXPECT_EQ(rank_of(202, 2), 1u);  // 2 is held: the lowest free
  EXPECT_EQ(rank_of(203, std::nullopt), 3u);
  EXPECT_EQ(rank_of(204, 7), 4u);  // not below --min-workers: the lowest free
}

TEST_F(MonitorTest, FirstDeclarationWithDuplicateKeyIsMismatch) {
  Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  uint32_t a = RegisterWorker(200);
  EXPECT_EQ(ErrorOf(Declare(a, {{1, 100}, {1, 100}})), wire::ErrorCode::Mismatch);
  // The refused declaration was not kept: a good one is the first.
  Only(Declare(a, kModel), wire::Body::Ack);
}

TEST_F(MonitorTest, AccuracyAboveTargetStopsTheJob) {
  StartJob();
  Only(Accuracy(worker_a_, 0.5f), wire::Body::Ack);
  EXPECT_EQ(core_->state(), wire::JobState::Running);
  EXPECT_TRUE(Take(0, wire::Body::Stop).empty());

  Only(Accuracy(worker_a_, 0.95f), wire::Body::Ack);
  EXPECT_EQ(core_->state(), wire::JobState::Stopped);
  EXPECT_NE(core_->stop_reason().find("target accuracy"), std::string::npos)
      << core_->stop_reason();
  auto stops = Take(0, wire::Body::Stop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].env.job_id, kJob);
  ASSERT_TRUE(core_->last_accuracy().has_value());
  EXPECT_NEAR(*core_->last_accuracy(), 0.95, 1e-6);

  // The stopped job tells heartbeating workers so, and refuses newcomers.
  Decoded hb = Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
  EXPECT_EQ(hb.As<wire::HeartbeatReply>()->state(), wire::JobState::Stopped);
  EXPECT_EQ(ErrorOf(Register(300, wire::Role::Worker, "")), wire::ErrorCode::Refused);
  EXPECT_FALSE(core_->finished());
  clock_.Advance(options_.stop_grace);
  EXPECT_TRUE(core_->finished());
}

TEST_F(MonitorTest, AllWorkersDoneStopsTheJob) {
  StartJob();
  Only(Heartbeat(worker_a_, 10, /*done=*/true), wire::Body::HeartbeatReply);
  Tick();
  EXPECT_EQ(core_->state(), wire::JobState::Running);
  Only(Heartbeat(worker_b_, 10, /*done=*/true), wire::Body::HeartbeatReply);
  Tick();
  EXPECT_EQ(core_->state(), wire::JobState::Stopped);
  EXPECT_EQ(Take(0, wire::Body::Stop).size(), 1u);
}

TEST_F(MonitorTest, ShardRegistrationRetryKeepsItsId) {
  Decoded first = Only(Register(100, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  Decoded again = Only(Register(101, wire::Role::Shard, "mem://shard0"), wire::Body::RegisterReply);
  EXPECT_EQ(first.As<wire::RegisterReply>()->id(), again.As<wire::RegisterReply>()->id());
  EXPECT_EQ(core_->num_shards(), 1u);
}

// Replica sets (--replicas K): the monitor gives each key range K backups on
// other shards, on other hosts where it can, keeps them live, saves them and
// hands them out with the shard map.
class ReplicaTest : public MonitorTest {
 protected:
  // A monitor with K backups per range and `min_shards` shards to start.
  void Make(uint32_t k, uint32_t min_shards) {
    options_.replicas = k;
    options_.min_shards = min_shards;
    core_ = std::make_unique<MonitorCore>(options_, &clock_);
  }
  uint32_t RegisterShard(uint64_t peer, const std::string& address, const std::string& node = "") {
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(peer, 0, 0, fbb,
                          wire::CreateRegisterDirect(fbb, wire::Role::Shard, address.c_str(), 0, 0,
                                                     0, 0, node.c_str())),
                     wire::Body::RegisterReply);
    if (d.message == nullptr || d.type() != wire::Body::RegisterReply) return 0;
    return d.As<wire::RegisterReply>()->id();
  }
  void ShardHeartbeat(uint32_t id) {
    flatbuffers::FlatBufferBuilder fbb;
    Send(id, kJob, id, fbb, wire::CreateHeartbeat(fbb, wire::Role::Shard, 0, 0.0f, false));
  }
  // Registers the shards, two workers and the model; every shard
  // acknowledges: the job runs.
  void Start(const std::vector<std::pair<std::string, std::string>>& shards) {
    for (size_t i = 0; i < shards.size(); ++i) {
      ASSERT_NE(RegisterShard(100 + i, shards[i].first, shards[i].second), 0u);
    }
    worker_a_ = RegisterWorker(200);
    worker_b_ = RegisterWorker(201);
    // Enough keys for a range on every shard.
    std::vector<wire::KeyLen> model;
    for (uint64_t k = 1; k <= 8; ++k) model.emplace_back(k, 100);
    Only(Declare(worker_a_, model), wire::Body::Ack);
    Tick();
    AckAll();
    Tick();
    ASSERT_EQ(core_->state(), wire::JobState::Running);
    to_shards_.clear();
  }
  // Index of the shard with id `id`.
  size_t IndexOf(uint32_t id) const {
    for (size_t i = 0; i < core_->num_shards(); ++i) {
      if (core_->shard_id(i) == id) return i;
    }
    ADD_FAILURE() << "no shard " << id;
    return 0;
  }
  // Each shard's backups as the workers' map says: shard id -> backups.
  std::map<uint32_t, std::vector<uint32_t>> MapBackups(uint64_t* version = nullptr) {
    std::map<uint32_t, std::vector<uint32_t>> got;
    Decoded hb = Only(Heartbeat(worker_a_), wire::Body::HeartbeatReply);
    const auto* m = hb.As<wire::HeartbeatReply>()->shard_map();
    EXPECT_NE(m, nullptr);
    if (m == nullptr) return got;
    if (version != nullptr) *version = m->version();
    for (const auto* s : *m->shards()) {
      std::vector<uint32_t>& b = got[s->id()];
      if (s->backups() != nullptr) b.assign(s->backups()->begin(), s->backups()->end());
      EXPECT_GT(s->epoch(), 0u) << "shard " << s->id() << " has no epoch";
    }
    return got;
  }
};

TEST_F(ReplicaTest, EachRangeGetsItsBackupsOnOtherShardsAndHostsEvenly) {
  Make(1, 4);
  // Two hosts, two shards each: one by --node, one by the address's host.
  Start({{"tcp://10.0.0.1:5000", ""}, {"tcp://10.0.0.1:5001", ""},
         {"tcp://10.0.0.9:5000", "node-b"}, {"tcp://10.0.0.9:5001", "node-b"}});
  std::map<uint32_t, std::string> host;
  std::map<uint32_t, int> backs;  // ranges each shard backs
  for (size_t i = 0; i < core_->num_shards(); ++i) {
    host[core_->shard_id(i)] = core_->shard_address(i).find("10.0.0.1") != std::string::npos ? "a" : "b";
  }
  std::set<uint64_t> epochs;
  const auto sets = MapBackups();
  ASSERT_EQ(sets.size(), 4u);
  for (const auto& [primary, backups] : sets) {
    ASSERT_EQ(backups.size(), 1u) << "shard " << primary;
    EXPECT_NE(backups[0], primary);
    EXPECT_NE(host[backups[0]], host[primary]) << "shard " << primary << "'s backup shares its host";
    ++backs[backups[0]];
    EXPECT_EQ(core_->shard_backups(IndexOf(primary)), backups);
    epochs.insert(core_->shard_epoch(IndexOf(primary)));
  }
  EXPECT_EQ(epochs.size(), 4u) << "each range has an epoch of its own";
  for (const auto& [id, n] : backs) EXPECT_EQ(n, 1) << "shard " << id << " backs " << n << " ranges";
  EXPECT_EQ(core_->ranges_under_replicated(), 0u);
}

TEST_F(ReplicaTest, WithTooFewShardsRangesRunShortUntilAShardRegisters) {
  Make(2, 2);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}});
  uint64_t v1 = 0;
  auto sets = MapBackups(&v1);
  ASSERT_EQ(sets.size(), 2u);
  for (const auto& [primary, backups] : sets) EXPECT_EQ(backups.size(), 1u) << "shard " << primary;
  EXPECT_EQ(core_->ranges_under_replicated(), 2u);
  // An idle shard registers: it backs both ranges, and holds none itself.
  const uint32_t idle = RegisterShard(110, "mem://shard2");
  ASSERT_NE(idle, 0u);
  Tick();
  AckAll();  // it takes the model (none of it) and the members
  Tick();
  uint64_t v2 = 0;
  sets = MapBackups(&v2);
  EXPECT_GT(v2, v1) << "workers must learn the new sets";
  ASSERT_EQ(sets.size(), 2u) << "the idle shard holds no range";
  for (const auto& [primary, backups] : sets) {
    EXPECT_EQ(backups.size(), 2u) << "shard " << primary;
    EXPECT_EQ(std::count(backups.begin(), backups.end(), idle), 1) << "shard " << primary;
  }
  EXPECT_EQ(core_->ranges_under_replicated(), 0u);
}

TEST_F(ReplicaTest, ABackupThatLosesItsLeaseIsReplacedAndTheSetsAreSaved) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  auto sets = MapBackups();
  ASSERT_EQ(sets.size(), 3u);
  const uint32_t primary = sets.begin()->first;
  const uint32_t lost = sets.begin()->second.at(0);
  // `lost` goes silent; the others keep their leases.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(milliseconds(200));
    for (const auto& [id, b] : sets) {
      if (id != lost) ShardHeartbeat(id);
    }
    Heartbeat(worker_a_);
    Heartbeat(worker_b_);
    Tick();
  }
  ASSERT_TRUE(core_->shard_down(IndexOf(lost)));
  sets = MapBackups();
  for (const auto& [id, backups] : sets) {
    for (uint32_t b : backups) EXPECT_NE(b, lost) << "shard " << id << " is still backed by a dead shard";
    if (id != lost) {
      EXPECT_EQ(backups.size(), 1u) << "shard " << id;
    }
  }
  ASSERT_EQ(sets[primary].size(), 1u);
  EXPECT_NE(sets[primary][0], primary);

  // A new monitor loads the same sets and epochs.
  auto restarted = std::make_unique<MonitorCore>(options_, &clock_);
  ASSERT_TRUE(restarted->RestoreState(core_->SaveState()).ok());
  EXPECT_EQ(restarted->map_version(), core_->map_version());
  for (size_t i = 0; i < core_->num_shards(); ++i) {
    EXPECT_EQ(restarted->shard_backups(i), core_->shard_backups(i));
    EXPECT_EQ(restarted->shard_epoch(i), core_->shard_epoch(i));
  }
}

// Shards that report their replicas and hand their ranges over.
class HandoffTest : public ReplicaTest {
 protected:
  // Shard `id`'s heartbeat with the replicas it holds (range -> epoch) and
  // whether it handed its range over; its reply.
  msg::HeartbeatReply Beat(uint32_t id, const std::map<uint32_t, uint64_t>& replicas = {},
                           bool handed_off = false) {
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    for (const auto& [range, epoch] : replicas) {
      msg::ShardInfo r;
      r.id = range;
      r.epoch = epoch;
      hb.replicas.push_back(r);
    }
    hb.handed_off = handed_off;
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(id, kJob, id, fbb, msg::Build(fbb, hb)), wire::Body::HeartbeatReply);
    return d.message == nullptr ? msg::HeartbeatReply{} : msg::Read<msg::HeartbeatReply>(d);
  }
  // Shard `from` reports that `backup` of range `range` fell behind; its reply.
  msg::HeartbeatReply ReportLagging(uint32_t from, uint32_t range, uint32_t backup) {
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    msg::ShardInfo r;
    r.id = range;
    r.backups = {backup};
    hb.lagging = {r};
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(from, kJob, from, fbb, msg::Build(fbb, hb)), wire::Body::HeartbeatReply);
    return d.message == nullptr ? msg::HeartbeatReply{} : msg::Read<msg::HeartbeatReply>(d);
  }
  // Shard `from` reports range `range`'s lag at `epoch` in its heartbeat.
  void ReportLag(uint32_t from, uint32_t range, uint64_t epoch, uint64_t records, float seconds) {
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    hb.lag = {{range, epoch, records, seconds}};
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(from, kJob, from, fbb, msg::Build(fbb, hb)), wire::Body::HeartbeatReply);
  }
  // pacerctl status's row of shard `id`.
  msg::ShardStatus StatusOf(uint32_t id) {
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(301, kJob, kTool, fbb, wire::CreateStatusRequest(fbb)),
                     wire::Body::StatusReply);
    if (d.message == nullptr) return {};
    for (const msg::ShardStatus& s : msg::Read<msg::StatusReply>(d).shards) {
      if (s.id == id) return s;
    }
    return {};
  }
  // Of three shards' sets: the one that is neither p nor b.
  static uint32_t Third(const std::map<uint32_t, std::vector<uint32_t>>& sets, uint32_t p,
                        uint32_t b) {
    uint32_t other = 0;
    for (const auto& [id, unused] : sets) {
      if (id != p && id != b) other = id;
    }
    return other;
  }
  // Shard `id` registers again from its checkpoints as a new process.
  void ReturnShard(uint32_t id, uint64_t incarnation) {
    const std::string address = core_->shard_address(IndexOf(id));
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(100 + IndexOf(id), 0, 0, fbb,
              wire::CreateRegisterDirect(fbb, wire::Role::Shard, address.c_str(), id, kJob, 1,
                                         incarnation)),
         wire::Body::RegisterReply);
  }
  // Time passes (the shard lease and more), with heartbeats from the
  // workers and from `live` only (shard id -> the replicas it reports).
  void OnlyHeard(const std::map<uint32_t, std::map<uint32_t, uint64_t>>& live) {
    for (int i = 0; i < 8; ++i) {
      clock_.Advance(milliseconds(200));
      for (const auto& [id, replicas] : live) Beat(id, replicas);
      Heartbeat(worker_a_);
      Heartbeat(worker_b_);
      Tick();
    }
  }
  static constexpr uint32_t kTool = 0xFFFFFFFFu;  // pacerctl's sender id
};

// pacerctl status shows each range's replication lag as its primary last
// reported it: only the primary's report, only at the range's epoch, and
// only while recent.
TEST_F(HandoffTest, StatusShowsEachRangesLagAsItsPrimaryReportsIt) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t epoch = core_->shard_epoch(IndexOf(p));
  EXPECT_EQ(StatusOf(p).lag_records, -1) << "nothing reported yet";
  ReportLag(b, p, epoch, 9, 1.5f);
  EXPECT_EQ(StatusOf(p).lag_records, -1) << "a backup's report of the range was taken";
  ReportLag(p, p, epoch + 1, 9, 1.5f);
  EXPECT_EQ(StatusOf(p).lag_records, -1) << "a report of another epoch was taken";
  ReportLag(p, p, epoch, 3, 0.25f);
  msg::ShardStatus s = StatusOf(p);
  EXPECT_EQ(s.lag_records, 3);
  EXPECT_EQ(s.lag_seconds, 0.25f);
  EXPECT_EQ(StatusOf(b).lag_records, -1) << "another range's lag";
  clock_.Advance(milliseconds(4000));
  EXPECT_EQ(StatusOf(p).lag_records, -1) << "a report older than 3 s is still shown";
}

// pacerctl drain-shard with --replicas: the primary is asked to hand its
// range over, and only once it says its backups hold everything is the
// backup promoted (at once, no lease), counted as a drain, and the drained
// shard told to stop; it never backs anything up again.
TEST_F(HandoffTest, DrainHandsTheRangeToItsBackupOnceThePrimarySaysSo) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t epoch = core_->shard_epoch(IndexOf(p));
  Beat(b, {{p, epoch}});  // the backup holds a replica of this epoch
  {
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(300, kJob, kTool, fbb, wire::CreateShardControl(fbb, wire::ShardOp::Drain, p)),
         wire::Body::Ack);
  }
  EXPECT_TRUE(core_->moving());
  msg::HeartbeatReply r = Beat(p);
  EXPECT_TRUE(r.hand_off);
  EXPECT_EQ(r.state, wire::JobState::Running);
  clock_.Advance(milliseconds(200));
  Tick();
  EXPECT_EQ(core_->shard_host(IndexOf(p)), p) << "promoted before the primary stopped";
  r = Beat(p, {}, /*handed_off=*/true);
  EXPECT_EQ(core_->shard_host(IndexOf(p)), b);
  EXPECT_GT(core_->shard_epoch(IndexOf(p)), epoch);
  EXPECT_EQ(r.state, wire::JobState::Stopped) << "the drained shard must stop";
  EXPECT_TRUE(r.deposed);
  EXPECT_FALSE(core_->moving());
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_failovers_total", {{"reason", "drain"}}), 1);
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_failovers_total", {{"reason", "lease"}}), 0);
  for (const auto& [id, backups] : MapBackups()) {
    EXPECT_EQ(std::count(backups.begin(), backups.end(), p), 0) << "shard " << id << " backed by the drained shard";
  }
}

// A primary cut off past its lease loses its range to its backup; when it
// is heard again (the same process), its reply says so (deposed, with the
// range's new epoch) and gives it no backups.
TEST_F(HandoffTest, APrimaryHeardAgainAfterItsFailoverIsDeposed) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t epoch = core_->shard_epoch(IndexOf(p));
  EXPECT_FALSE(Beat(p).deposed);
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(milliseconds(200));
    for (const auto& [id, unused] : sets) {
      if (id != p) Beat(id, id == b ? std::map<uint32_t, uint64_t>{{p, epoch}} : std::map<uint32_t, uint64_t>{});
    }
    Heartbeat(worker_a_);
    Heartbeat(worker_b_);
    Tick();
  }
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_failovers_total", {{"reason", "lease"}}), 1);
  const msg::HeartbeatReply r = Beat(p);
  EXPECT_TRUE(r.deposed);
  EXPECT_EQ(r.replica_epoch, core_->shard_epoch(IndexOf(p)));
  EXPECT_TRUE(r.replica_backups.empty());
  // A shard that still serves a range since an older promotion (the range
  // failed over again while it was cut off) is told to let go of it; the
  // range's current host is not.
  const auto serving = [&](uint32_t from, uint64_t e) {
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    msg::ShardInfo r;
    r.id = p;
    r.epoch = e;
    hb.serving = {r};
    flatbuffers::FlatBufferBuilder fbb;
    Decoded d = Only(Send(from, kJob, from, fbb, msg::Build(fbb, hb)), wire::Body::HeartbeatReply);
    return d.message == nullptr ? msg::HeartbeatReply{} : msg::Read<msg::HeartbeatReply>(d);
  };
  uint32_t other = 0;
  for (const auto& [id, unused] : sets) {
    if (id != p && id != b) other = id;
  }
  const uint64_t now_epoch = core_->shard_epoch(IndexOf(p));
  const msg::HeartbeatReply stale = serving(other, epoch);
  ASSERT_EQ(stale.deposed_ranges.size(), 1u);
  EXPECT_EQ(stale.deposed_ranges[0].id, p);
  EXPECT_EQ(stale.deposed_ranges[0].epoch, now_epoch);
  EXPECT_TRUE(serving(b, now_epoch).deposed_ranges.empty());
}

// A primary reports a backup that fell behind: the monitor drops it from
// the range's set (counted), gives the range a free shard instead, and not
// the dropped one again for a while; a report from a shard that is not the
// range's primary changes nothing.
TEST_F(HandoffTest, ABackupThatFallsBehindIsDroppedAndReplaced) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint32_t other = Third(sets, p, b);
  const auto beat = [&](uint32_t from, uint32_t backup) { ReportLagging(from, p, backup); };
  beat(other, b);  // not p's primary
  EXPECT_EQ(core_->shard_backups(IndexOf(p)), (std::vector<uint32_t>{b}));
  uint64_t v1 = 0, v2 = 0;
  MapBackups(&v1);
  beat(p, b);
  sets = MapBackups(&v2);
  EXPECT_GT(v2, v1) << "the workers and shards must learn the new set";
  EXPECT_EQ(sets[p], (std::vector<uint32_t>{other}));
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_backups_dropped_total", {}), 1);
  // The new backup falls behind too: none is left that may take the range.
  beat(p, other);
  sets = MapBackups();
  EXPECT_TRUE(sets[p].empty());
  EXPECT_EQ(core_->ranges_under_replicated(), 1u);
}

// A backup dropped for falling behind still holds every push that was
// durable when it was dropped (durability waited for it). It stands by,
// still told to back the range, until a backup in the set holds a replica
// of the range's epoch: a primary lost in between fails over to it, not to
// a checkpoint. Once the replacement holds the range it lets go.
TEST_F(HandoffTest, ADroppedLaggingBackupStandsByUntilItsReplacementHoldsTheRange) {
  for (const bool replaced : {false, true}) {
    SCOPED_TRACE(replaced ? "replacement seeded" : "replacement not seeded");
    Make(1, 3);
    Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
    auto sets = MapBackups();
    const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
    const uint32_t other = Third(sets, p, b);
    const uint64_t epoch = core_->shard_epoch(IndexOf(p));
    const auto backs = [&](const msg::HeartbeatReply& r) {
      return std::any_of(r.backing.begin(), r.backing.end(),
                         [&](const msg::ShardInfo& x) { return x.id == p; });
    };
    ASSERT_TRUE(backs(Beat(b, {{p, epoch}})));
    ReportLagging(p, p, b);
    ASSERT_EQ(MapBackups()[p], (std::vector<uint32_t>{other}));
    EXPECT_EQ(core_->shard_standby(IndexOf(p)), (std::vector<uint32_t>{b}));
    EXPECT_TRUE(backs(Beat(b, {{p, epoch}}))) << "the standby must keep its replica";
    // Its primary holds durability where it is: the new backup's
    // acknowledgements must not make durable what the standby lacks.
    EXPECT_TRUE(Beat(p).hold_durable);
    // The monitor restarts: the standby is in its saved state.
    {
      auto restarted = std::make_unique<MonitorCore>(options_, &clock_);
      ASSERT_TRUE(restarted->RestoreState(core_->SaveState()).ok());
      EXPECT_EQ(restarted->shard_standby(IndexOf(p)), (std::vector<uint32_t>{b}));
    }
    if (replaced) {
      Beat(other, {{p, epoch}});  // the new backup got its seed
      Tick();
      EXPECT_TRUE(core_->shard_standby(IndexOf(p)).empty());
      EXPECT_FALSE(backs(Beat(b, {{p, epoch}}))) << "a standby no longer needed must let go of its replica";
      EXPECT_FALSE(Beat(p).hold_durable);
    }
    // The primary goes silent.
    for (int i = 0; i < 8; ++i) {
      clock_.Advance(milliseconds(200));
      Beat(b, replaced ? std::map<uint32_t, uint64_t>{} : std::map<uint32_t, uint64_t>{{p, epoch}});
      Beat(other, replaced ? std::map<uint32_t, uint64_t>{{p, epoch}} : std::map<uint32_t, uint64_t>{});
      Heartbeat(worker_a_);
      Heartbeat(worker_b_);
      Tick();
    }
    EXPECT_EQ(core_->shard_host(IndexOf(p)), replaced ? other : b);
    EXPECT_GT(core_->shard_epoch(IndexOf(p)), epoch);
    EXPECT_TRUE(core_->shard_standby(IndexOf(p)).empty());
  }
}

// The same for a range served since a promotion: its host is told to hold
// the range's durability (hold_durable_ranges), and if the host dies
// before the replacement holds the range, the standby takes it over.
TEST_F(HandoffTest, APromotedRangesDroppedBackupStandsByToo) {
  Make(1, 4);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}, {"mem://shard3", ""}});
  auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  std::vector<uint32_t> others;  // neither p nor b
  for (const auto& [id, unused] : sets) {
    if (id != p && id != b) others.push_back(id);
  }
  ASSERT_EQ(others.size(), 2u);
  // p dies; b holds its replica and takes the range over.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(milliseconds(200));
    Beat(b, {{p, e0}});
    for (uint32_t o : others) Beat(o);
    Heartbeat(worker_a_);
    Heartbeat(worker_b_);
    Tick();
  }
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  const uint64_t e1 = core_->shard_epoch(IndexOf(p));
  ASSERT_GT(e1, e0);
  sets = MapBackups();
  ASSERT_EQ(sets[p].size(), 1u);
  const uint32_t x = sets[p][0];  // the promoted range's new backup
  const uint32_t y = x == others[0] ? others[1] : others[0];
  ASSERT_TRUE(x == others[0] || x == others[1]);
  Beat(x, {{p, e1}});  // seeded
  EXPECT_TRUE(Beat(b).hold_durable_ranges.empty());
  // x falls behind: dropped, replaced by y, and kept as a standby.
  ReportLagging(b, p, x);
  EXPECT_EQ(MapBackups()[p], (std::vector<uint32_t>{y}));
  EXPECT_EQ(core_->shard_standby(IndexOf(p)), (std::vector<uint32_t>{x}));
  const msg::HeartbeatReply host = Beat(b);
  EXPECT_EQ(host.hold_durable_ranges, (std::vector<uint32_t>{p}));
  EXPECT_FALSE(host.hold_durable) << "b's own range has no standby";
  const msg::HeartbeatReply standby = Beat(x, {{p, e1}});
  EXPECT_TRUE(std::any_of(standby.backing.begin(), standby.backing.end(),
                          [&](const msg::ShardInfo& r) { return r.id == p; }))
      << "the standby must keep its replica";
  // b dies before y holds the range: the standby serves it.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(milliseconds(200));
    Beat(x, {{p, e1}});
    Beat(y);
    Heartbeat(worker_a_);
    Heartbeat(worker_b_);
    Tick();
  }
  EXPECT_EQ(core_->shard_host(IndexOf(p)), x);
  EXPECT_GT(core_->shard_epoch(IndexOf(p)), e1);
}

// A primary that registers again as a new process before its lease ran out
// (so no failover happened yet) would serve its range from its checkpoint,
// which lacks what its backup's replica holds: the backup takes the range
// over at once, counted as a restart, and the new process is deposed.
TEST_F(HandoffTest, APrimaryRestartedWithinItsLeaseFailsOverAtOnce) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  Beat(b, {{p, e0}});
  ReturnShard(p, 99);
  EXPECT_EQ(core_->shard_host(IndexOf(p)), b);
  EXPECT_GT(core_->shard_epoch(IndexOf(p)), e0);
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_failovers_total", {{"reason", "restart"}}), 1);
  EXPECT_EQ(ReadMetric(core_->registry(), "pacer_monitor_failovers_total", {{"reason", "lease"}}), 0);
  EXPECT_TRUE(Beat(p).deposed);
}

// A shard registered again as a new process holds no replica until its
// heartbeats say so: a range it backed whose primary is down is not given
// to it on the strength of what the old process reported.
TEST_F(HandoffTest, ARestartedShardHoldsNoReplicaUntilItSaysSo) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  // q's range is backed by p; t is the third shard.
  const uint32_t q = sets.begin()->first, p = sets.begin()->second.at(0);
  const uint32_t t = Third(sets, q, p);
  const uint64_t eq = core_->shard_epoch(IndexOf(q));
  Beat(p, {{q, eq}});
  // p and q die together; p is back before its lease runs out, and q's
  // runs out before the new p's first heartbeat.
  const auto pass = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      clock_.Advance(milliseconds(200));
      Beat(t);
      Heartbeat(worker_a_);
      Heartbeat(worker_b_);
      Tick();
    }
  };
  pass(3);
  ReturnShard(p, 99);
  pass(3);
  EXPECT_EQ(core_->shard_host(IndexOf(q)), q) << "promoted to a process holding no replica";
}

// A range promoted to a backup that is lost before it serves the range (so
// no worker was told where, and it acknowledged nothing of it) goes back to
// the last shard that served it, at a new epoch: at once if that one is
// live, else when it returns (a backup seeded meanwhile may still report);
// one that was served stays.
TEST_F(HandoffTest, APromotionLostBeforeItIsServedGoesBack) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint32_t x = Third(sets, p, b);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{b, {{p, e0}}}, {x, {}}});  // p dies; b takes its range
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  const uint64_t e1 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{x, {}}});  // b dies before it reports serving the range
  EXPECT_EQ(core_->shard_host(IndexOf(p)), b) << "p is down: nothing to go back to yet";
  ReturnShard(p, 99);  // from its checkpoint, with nothing newer anywhere
  EXPECT_EQ(core_->shard_host(IndexOf(p)), p);
  EXPECT_GT(core_->shard_epoch(IndexOf(p)), e1);
  const msg::HeartbeatReply r = Beat(p);
  EXPECT_FALSE(r.deposed);
  EXPECT_EQ(r.replica_epoch, core_->shard_epoch(IndexOf(p)));
}

// The same with the old primary only cut off: heard again, it has
// everything it acknowledged, and the range goes back to it at once.
TEST_F(HandoffTest, APromotionLostBeforeItIsServedGoesBackToALivePrimaryAtOnce) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint32_t x = Third(sets, p, b);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{b, {{p, e0}}}, {x, {}}});  // p cut off; b takes its range
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  const uint64_t e1 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{p, {}}, {x, {}}});  // p heard again; b dies before serving
  EXPECT_EQ(core_->shard_host(IndexOf(p)), p);
  EXPECT_GT(core_->shard_epoch(IndexOf(p)), e1);
  const msg::HeartbeatReply r = Beat(p);
  EXPECT_FALSE(r.deposed);
  EXPECT_EQ(r.replica_epoch, core_->shard_epoch(IndexOf(p)));
}

// Promoted on from a shard that never served the range: it would go back
// to the last shard that did, not to that one (which holds nothing of it).
TEST_F(HandoffTest, AChainOfUnservedPromotionsGoesBackToTheLastThatServed) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint32_t x = Third(sets, p, b);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{b, {{p, e0}}}, {x, {}}});  // p cut off; b takes its range
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  ASSERT_EQ(MapBackups()[p], (std::vector<uint32_t>{x}));
  const uint64_t e1 = core_->shard_epoch(IndexOf(p));
  // b seeds x and dies before it reports serving; x holds the range.
  OnlyHeard({{x, {{p, e1}}}});
  ASSERT_EQ(core_->shard_host(IndexOf(p)), x);
  // p is heard again, and x dies before it reports serving: back to p.
  OnlyHeard({{p, {}}});
  EXPECT_EQ(core_->shard_host(IndexOf(p)), p);
}

TEST_F(HandoffTest, APromotionServedStaysWhenItsHostIsLost) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint32_t x = Third(sets, p, b);
  const uint64_t e0 = core_->shard_epoch(IndexOf(p));
  OnlyHeard({{b, {{p, e0}}}, {x, {}}});
  ASSERT_EQ(core_->shard_host(IndexOf(p)), b);
  msg::Heartbeat hb;  // b serves the range
  hb.role = wire::Role::Shard;
  msg::ShardInfo r;
  r.id = p;
  r.epoch = core_->shard_epoch(IndexOf(p));
  r.address = "mem://b-serves-p";
  hb.serving = {r};
  flatbuffers::FlatBufferBuilder fbb;
  Only(Send(b, kJob, b, fbb, msg::Build(fbb, hb)), wire::Body::HeartbeatReply);
  OnlyHeard({{x, {}}});  // then dies
  EXPECT_EQ(core_->shard_host(IndexOf(p)), b) << "its checkpoint holds what it acknowledged";
}

// With no backup left in the set (two shards, the only other one dropped)
// the primary calls every applied push durable at once, so a standby would
// lack durable pushes: none is kept, and durability is not held.
TEST_F(HandoffTest, NoStandbyIsKeptWhenTheSetIsLeftEmpty) {
  Make(1, 2);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}});
  auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const msg::HeartbeatReply reply = ReportLagging(p, p, b);
  EXPECT_TRUE(MapBackups()[p].empty());
  EXPECT_TRUE(core_->shard_standby(IndexOf(p)).empty());
  EXPECT_FALSE(reply.hold_durable);
}

// A drain given up (its primary never said its backups hold its last
// record): the primary's heartbeat replies say so, so that one that
// stopped applying for it applies again; asked again, they no longer do.
TEST_F(HandoffTest, ADrainGivenUpIsSaidSo) {
  Make(1, 3);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}, {"mem://shard2", ""}});
  const auto sets = MapBackups();
  const uint32_t p = sets.begin()->first, b = sets.begin()->second.at(0);
  const uint64_t epoch = core_->shard_epoch(IndexOf(p));
  Beat(b, {{p, epoch}});
  const auto drain = [&] {
    flatbuffers::FlatBufferBuilder fbb;
    Only(Send(300, kJob, kTool, fbb, wire::CreateShardControl(fbb, wire::ShardOp::Drain, p)),
         wire::Body::Ack);
  };
  drain();
  msg::HeartbeatReply r = Beat(p);
  EXPECT_TRUE(r.hand_off);
  EXPECT_FALSE(r.hand_off_given_up);
  for (int i = 0; i < 130; ++i) {  // 65 s, every member heard
    clock_.Advance(milliseconds(500));
    for (const auto& [id, unused] : sets) {
      Beat(id, id == b ? std::map<uint32_t, uint64_t>{{p, epoch}} : std::map<uint32_t, uint64_t>{});
    }
    Heartbeat(worker_a_);
    Heartbeat(worker_b_);
    Tick();
  }
  EXPECT_FALSE(core_->moving());
  r = Beat(p);
  EXPECT_FALSE(r.hand_off);
  EXPECT_TRUE(r.hand_off_given_up);
  EXPECT_EQ(core_->shard_host(IndexOf(p)), p);
  drain();
  r = Beat(p);
  EXPECT_TRUE(r.hand_off);
  EXPECT_FALSE(r.hand_off_given_up);
}

TEST_F(ReplicaTest, WithoutReplicasNoRangeHasBackups) {
  Make(0, 2);
  Start({{"mem://shard0", ""}, {"mem://shard1", ""}});
  uint64_t version = 0;
  for (const auto& [id, backups] : MapBackups(&version)) EXPECT_TRUE(backups.empty()) << "shard " << id;
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(core_->ranges_under_replicated(), 0u);
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

// Regression test: a worker that retries Register (its first one may still be
// queued in ZeroMQ) must not become two members holding the barrier.
TEST(MonitorRegistrationTest, RetriedWorkerRegistrationKeepsOneMember) {
  FakeClock clock(TimePoint(std::chrono::hours(1)));
  MonitorOptions options;
  options.job_id = 5;
  MonitorCore core(options, &clock);
  auto reg = [&](const std::string& token) {
    flatbuffers::FlatBufferBuilder fbb;
    Envelope env;
    env.request_id = 1;
    Frames frames = EncodeBody(env, fbb, wire::CreateRegisterDirect(fbb, wire::Role::Worker,
                                                                     token.c_str()));
    uint64_t peer = 42;
    frames.insert(frames.begin(), Frame::Copy(&peer, sizeof(peer)));
    std::vector<MonitorCore::Outgoing> out;
    core.Handle(std::move(frames), &out);
    EXPECT_EQ(out.size(), 1u);
    DecodeOptions d;
    d.check_job = false;
    Decoded dec;
    DecodeError err;
    EXPECT_TRUE(Decode(out[0].frames, d, &dec, &err)) << err.reason;
    return dec.As<wire::RegisterReply>()->id();
  };
  const uint32_t first = reg("worker-1-abc");
  const uint32_t again = reg("worker-1-abc");
  const uint32_t other = reg("worker-2-def");
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  EXPECT_EQ(core.LiveWorkers().size(), 2u);
}


// The straggler policy at work: timing reports in, batch sizes and bounds out.
TEST_F(MonitorTest, PolicyResizesBatchesFromReportsAndShardsGetTheBounds) {
  options_.mode = wire::Mode::Dssp;
  options_.policy.kind = policy::Kind::kPacer;
  options_.policy.staleness = 1;
  options_.policy.staleness_range = 3;
  options_.policy.warmup_reports = 0;  // every report here counts
  core_ = std::make_unique<MonitorCore>(options_, &clock_);
  StartJob();
  // The membership the shard got at the start carried each worker's bounds;
  // check the next one, after a bounds change, below.
  auto report = [&](uint32_t id, double compute_per_sample) {
    return ReportTimings(id, 96, compute_per_sample);
  };
  Decoded first = report(worker_a_, 1e-4);
  EXPECT_EQ(first.As<wire::HeartbeatReply>()->assignment()->batch_size(), 96u);
  EXPECT_EQ(first.As<wire::HeartbeatReply>()->assignment()->staleness_bound(), 1u);
  // pacer's DSSP slack starts closed (r_max 0) until an imbalance outlasts
  // the sizes meant to absorb it.
  EXPECT_EQ(first.As<wire::HeartbeatReply>()->assignment()->staleness_range(), 0u);
  report(worker_b_, 4e-4);  // B is 4x slower
  Tick();                   // a policy round
  Decoded reply_a = report(worker_a_, 1e-4);
  Decoded reply_b = report(worker_b_, 4e-4);
  const auto* a = reply_a.As<wire::HeartbeatReply>()->assignment();
  const auto* b = reply_b.As<wire::HeartbeatReply>()->assignment();
  // Equal iteration times want shares of about 4:1 of 192.
  EXPECT_EQ(a->batch_size() + b->batch_size(), 192u);
  EXPECT_LT(b->batch_size() * 2, a->batch_size());
  EXPECT_EQ(core_->workers().at(worker_b_).batch, b->batch_size());

  // An operator narrows B's bounds: the shards hear through a new membership.
  const uint64_t before = core_->membership_version();
  ASSERT_TRUE(core_->SetWorkerBounds(worker_b_, 0, 2));
  EXPECT_GT(core_->membership_version(), before);
  clock_.Advance(std::chrono::seconds(1));
  Tick();
  auto members = Take(0, wire::Body::Membership);
  ASSERT_FALSE(members.empty());
  bool seen = false;
  for (const auto* w : *members.back().As<wire::Membership>()->workers()) {
    if (w->id() == worker_b_) {
      EXPECT_EQ(w->staleness(), 0u);
      EXPECT_EQ(w->staleness_range(), 2u);
      seen = true;
    } else {
      EXPECT_EQ(w->staleness(), 1u);
      EXPECT_EQ(w->staleness_range(), 0u);  // the slack still closed (B just resized)
    }
  }
  EXPECT_TRUE(seen);
  EXPECT_FALSE(core_->SetWorkerBounds(999, 0, 0));
}

TEST_F(MonitorTest, AWorkerWhoseSpeedJumpsGetsItsNewSizeInTheSameReply) {
  options_.policy.kind = policy::Kind::kAdaptiveBatch;
  options_.policy.probe = 0;  // sizes stay even until a speed moves
  options_.policy.warmup_reports = 0;
  options_.policy.shift_min_iterations = 0;
  options_.policy.shift_seconds = 0;
  core_ = std::make_unique<MonitorCore>(options_, &clock_);
  StartJob();
  auto report = [&](uint32_t id, double compute_per_sample) {
    return ReportTimings(id, core_->workers().at(id).batch, compute_per_sample);
  };
  report(worker_a_, 1e-4);
  report(worker_b_, 1e-4);
  Tick();  // a round with equal speeds: 96 each
  ASSERT_EQ(core_->workers().at(worker_b_).batch, 96u);
  clock_.Advance(std::chrono::milliseconds(10));  // far inside --policy-interval
  // B becomes 4x slower, every one of its 5 iterations: no tick, no report
  // from A, and still its reply brings the smaller batch.
  Decoded reply = report(worker_b_, 4e-4);
  const uint32_t b = reply.As<wire::HeartbeatReply>()->assignment()->batch_size();
  EXPECT_LT(b * 2, core_->workers().at(worker_a_).batch);
  EXPECT_EQ(b + core_->workers().at(worker_a_).batch, 192u);
  // A 20% wobble is noise: sizes stay until the next round.
  clock_.Advance(std::chrono::milliseconds(10));
  const uint32_t a_before = core_->workers().at(worker_a_).batch;
  Decoded steady = report(worker_a_, 1.2e-4);
  EXPECT_EQ(steady.As<wire::HeartbeatReply>()->assignment()->batch_size(), a_before);
  EXPECT_EQ(core_->workers().at(worker_b_).batch, b);
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

uint32_t BatchSum(const MonitorCore& core) {
  uint32_t sum = 0;
  for (uint32_t id : core.LiveWorkers()) sum += core.workers().at(id).batch;
  return sum;
}

// --rescale-batch: a third worker brings its share with it; without it the
// global batch is kept and split three ways.
TEST_F(MonitorTest, GlobalBatchIsKeptOrScaledWithTheWorkers) {
  for (bool rescale : {false, true}) {
    SCOPED_TRACE(rescale ? "rescale" : "keep");
    options_.rescale_batch = rescale;
    core_ = std::make_unique<MonitorCore>(options_, &clock_);
    to_shards_.clear();
    StartJob();
    EXPECT_EQ(BatchSum(*core_), options_.global_batch);
    RegisterWorker(202);
    EXPECT_EQ(BatchSum(*core_), rescale ? options_.global_batch * 3 / 2 : options_.global_batch);
    EXPECT_EQ(core_->LiveWorkers().size(), 3u);
    // A restarted monitor keeps the scaled B.
    MonitorCore restarted(options_, &clock_);
    ASSERT_TRUE(restarted.RestoreState(core_->SaveState()).ok());
    EXPECT_EQ(restarted.straggler_policy().global_batch(),
              rescale ? options_.global_batch * 3 / 2 : options_.global_batch);
    EXPECT_EQ(BatchSum(restarted), BatchSum(*core_));
  }
}

// Data partitions follow the workers: a dead worker's go to the live ones,
// positions move only forward and only by their reader, and a saved state
// brings back the job, its members and the positions.
TEST_F(MonitorTest, PartitionsFollowTheWorkersAndSurviveARestart) {
  StartJob();
  ASSERT_EQ(core_->partitions().size(), 2u);
  const uint32_t owner0 = core_->partitions()[0].owner;
  ASSERT_TRUE(owner0 == worker_a_ || owner0 == worker_b_);
  const uint32_t other = owner0 == worker_a_ ? worker_b_ : worker_a_;
  auto report = [&](uint32_t sender, uint32_t partition, uint32_t epoch, uint64_t offset) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<wire::PartitionPosition> pos = {{partition, epoch, offset}};
    auto v = fbb.CreateVectorOfStructs(pos);
    wire::HeartbeatBuilder hb(fbb);
    hb.add_role(wire::Role::Worker);
    hb.add_positions(v);
    auto body = hb.Finish();
    return Send(200, kJob, sender, fbb, body);
  };
  Only(report(owner0, 0, 1, 640), wire::Body::HeartbeatReply);
  Only(report(other, 0, 5, 0), wire::Body::HeartbeatReply);  // not its partition: ignored
  Only(report(owner0, 0, 1, 320), wire::Body::HeartbeatReply);  // backwards: ignored
  EXPECT_EQ(core_->partitions()[0].epoch, 1u);
  EXPECT_EQ(core_->partitions()[0].offset, 640u);

  // The saved state, loaded by a new monitor.
  const std::string saved = core_->SaveState();
  const uint64_t version = core_->membership_version();
  auto restarted = std::make_unique<MonitorCore>(options_, &clock_);
  ASSERT_TRUE(restarted->RestoreState(saved).ok());
  EXPECT_EQ(restarted->state(), wire::JobState::Running);
  EXPECT_EQ(restarted->LiveWorkers(), core_->LiveWorkers());
  EXPECT_GT(restarted->membership_version(), version) << "shards must take the live set again";
  EXPECT_EQ(restarted->partitions()[0].owner, owner0);
  EXPECT_EQ(restarted->partitions()[0].offset, 640u);
  EXPECT_EQ(BatchSum(*restarted), options_.global_batch);
  EXPECT_EQ(restarted->RestoreState("not a state").code(), absl::StatusCode::kDataLoss);
  MonitorOptions other_job = options_;
  other_job.job_id = kJob + 1;
  EXPECT_EQ(MonitorCore(other_job, &clock_).RestoreState(saved).code(),
            absl::StatusCode::kInvalidArgument);

  // The owner of partition 0 dies: the other worker takes it, at 640.
  core_ = std::move(restarted);
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(std::chrono::milliseconds(200));
    Only(Heartbeat(other), wire::Body::HeartbeatReply);
    Tick();
  }
  EXPECT_EQ(core_->LiveWorkers(), std::vector<uint32_t>{other});
  EXPECT_EQ(core_->partitions()[0].owner, other);
  EXPECT_EQ(core_->partitions()[1].owner, other);
  Decoded hb = Only(Heartbeat(other), wire::Body::HeartbeatReply);
  const auto* parts = hb.As<wire::HeartbeatReply>()->partitions();
  ASSERT_NE(parts, nullptr);
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ(parts->Get(0)->index(), 0u);
  EXPECT_EQ(parts->Get(0)->offset(), 640u);
}


// KeyMove (monitor/key_move.h): copy from the old owner, adopt at the new
// one, drop at the old one, each request re-sent unchanged until answered.
TEST(KeyMoveTest, CopiesAdoptsThenDropsAndResendsEachStepUntilAnswered) {
  FakeClock clock;
  KeyMove m(/*from=*/1, /*to=*/2, 100, 200, /*job_id=*/7, clock.Now());
  EXPECT_EQ(m.stage(), KeyMove::Stage::kHolding);
  EXPECT_FALSE(m.Resend(clock.Now() + std::chrono::seconds(5))) << "nothing sent yet";
  auto reply = [](const Decoded& to, auto make) {
    Envelope env;
    env.job_id = 7;
    env.request_id = to.env.request_id;
    flatbuffers::FlatBufferBuilder fbb(128);
    return MustDecode(EncodeBody(env, fbb, make(fbb)));
  };
  // Copy: MoveOut [100, 200) to the old owner.
  KeyMove::Request copy = m.Start(clock.Now());
  EXPECT_EQ(copy.shard, 1u);
  const Decoded ask = MustDecode(copy.frames);
  ASSERT_EQ(ask.type(), wire::Body::MoveOut);
  EXPECT_EQ(ask.As<wire::MoveOut>()->key_begin(), 100u);
  EXPECT_FALSE(ask.As<wire::MoveOut>()->drop());
  // Unanswered for a second: the very same request again.
  EXPECT_FALSE(m.Resend(clock.Now() + std::chrono::milliseconds(999)));
  clock.Advance(std::chrono::seconds(1));
  auto again = m.Resend(clock.Now());
  ASSERT_TRUE(again);
  EXPECT_EQ(MustDecode(again->frames).env.request_id, ask.env.request_id);
  // A refusal (not quiet yet) moves nothing; a reply from another shard is ignored.
  EXPECT_FALSE(m.OnReply(1, reply(ask, [](auto& fbb) {
    return wire::CreateErrorDirect(fbb, wire::ErrorCode::NotReady, "busy");
  }), clock.Now()));
  EXPECT_FALSE(m.OnReply(2, reply(ask, [](auto& fbb) { return wire::CreateAck(fbb); }), clock.Now()));
  EXPECT_EQ(m.stage(), KeyMove::Stage::kCopying);
  // The old owner's keys go to the new owner.
  auto send = m.OnReply(1, reply(ask, [](auto& fbb) {
    std::vector<wire::KeyLen> keys = {wire::KeyLen(150, 0)};
    return wire::CreateMoveData(fbb, fbb.CreateVectorOfStructs(keys), 41, 9);
  }), clock.Now());
  ASSERT_TRUE(send);
  EXPECT_EQ(send->shard, 2u);
  const Decoded adopt = MustDecode(send->frames);
  ASSERT_EQ(adopt.type(), wire::Body::MoveData);
  EXPECT_EQ(adopt.As<wire::MoveData>()->applied_clock(), 41);
  EXPECT_NE(adopt.env.request_id, ask.env.request_id);
  EXPECT_FALSE(m.Answers(reply(ask, [](auto& fbb) { return wire::CreateAck(fbb); })))
      << "an answer to the old step is stale";
  // Adopted: the old owner drops them; once it has, the move is done.
  auto drop = m.OnReply(2, reply(adopt, [](auto& fbb) { return wire::CreateAck(fbb); }), clock.Now());
  ASSERT_TRUE(drop);
  EXPECT_EQ(drop->shard, 1u);
  const Decoded dropping = MustDecode(drop->frames);
  ASSERT_EQ(dropping.type(), wire::Body::MoveOut);
  EXPECT_TRUE(dropping.As<wire::MoveOut>()->drop());
  EXPECT_FALSE(m.done());
  EXPECT_FALSE(m.OnReply(1, reply(dropping, [](auto& fbb) { return wire::CreateAck(fbb); }), clock.Now()));
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.Resend(clock.Now() + std::chrono::seconds(5)));
}

}  // namespace
}  // namespace pacer
