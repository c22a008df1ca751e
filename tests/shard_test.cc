// Tests of ShardCore (ps/shard.h) driven message by message, as the monitor
// and the workers would, with a fake clock: the optimizer math, the BSP
// barrier, membership changes, deadlines and ASP.
#include "ps/shard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "ps/optimizer.h"
#include "ps/staleness.h"
#include "ps/base/wire.h"

namespace pacer {
namespace {

constexpr uint64_t kJob = 9;
constexpr uint32_t kShardId = 50;
constexpr uint32_t kMonitor = 0;
constexpr uint32_t kWorkerA = 11;  // batch 1
constexpr uint32_t kWorkerB = 12;  // batch 3
constexpr float kLr = 0.5f;
constexpr float kMomentum = 0.9f;
constexpr uint32_t kGlobalBatch = 4;  // B = 1 + 3

// The shard owns key 1 (2 values) and key 2 (1 value).
const std::vector<wire::KeyLen> kKeys = {{1, 2}, {2, 1}};
const std::vector<float> kW0 = {1.0f, -2.0f, 0.5f};

Frame PeerFrame(uint64_t id) { return Frame::Copy(&id, sizeof(id)); }

uint64_t PeerId(const Frame& f) {
  uint64_t id = 0;
  EXPECT_EQ(f.size(), sizeof(id));
  if (f.size() == sizeof(id)) std::memcpy(&id, f.data(), sizeof(id));
  return id;
}

Frame Floats(const std::vector<float>& v) {
  return Frame::Copy(v.data(), v.size() * sizeof(float));
}

struct WorkerSpec {
  uint32_t id;
  uint32_t rank;
  uint32_t batch;
  uint32_t staleness = 0;        // s, or s_L
  uint32_t staleness_range = 0;  // r_max
  uint64_t start_clock = 0;
  std::string key{};             // CURVE public key (empty: plain)
};

class ShardTest : public ::testing::Test {
 protected:
  ShardTest() : clock_(TimePoint{} + std::chrono::hours(1)) {}

  void Start(wire::Mode mode,
             const std::vector<WorkerSpec>& workers = {{kWorkerA, 0, 1}, {kWorkerB, 1, 3}},
             uint32_t backup_workers = 0, bool staleness_aware_lr = true) {
    ShardOptions opts = options_;
    opts.pull_timeout = std::chrono::seconds(5);
    opts.monitor_key = monitor_key_;
    shard_ = std::make_unique<ShardCore>(opts, &clock_);
    ShardJob job;
    job.job_id = kJob;
    job.mode = mode;
    job.optimizer.kind = kind_;
    job.optimizer.defaults = DefaultSettings(kind_);
    job.optimizer.defaults.lr = kLr;
    job.optimizer.defaults.momentum = momentum_;
    job.global_batch = kGlobalBatch;
    job.backup_workers = backup_workers;
    job.staleness_aware_lr = staleness_aware_lr;
    shard_->Configure(job, kShardId);
    job_ = job;

    ExpectAck(Declare(kKeys));
    ExpectAck(Membership(1, workers));
    ExpectAck(Init(kWorkerA, kW0));
    ASSERT_TRUE(shard_->initialized());
  }

  // Sends one message (from peer `sender`, routing id = sender) and returns
  // what the shard put in `out`.
  template <class T>
  std::vector<ShardCore::Outgoing> Send(uint32_t sender, flatbuffers::FlatBufferBuilder& fbb,
                                        flatbuffers::Offset<T> body, Frame payload = {}) {
    Envelope env;
    env.job_id = kJob;
    env.sender = sender;
    env.request_id = ++next_request_;
    Frames frames = EncodeBody(env, fbb, body, std::move(payload));
    frames.insert(frames.begin(), PeerFrame(sender));
    // Under CURVE each sender's messages carry its key (the test's keys:
    // "K" and the sender id).
    if (curve_) frames[0].set_peer_key(KeyOf(sender));
    std::vector<ShardCore::Outgoing> out;
    shard_->Handle(std::move(frames), &out);
    return out;
  }

  std::vector<ShardCore::Outgoing> Declare(const std::vector<wire::KeyLen>& keys) {
    if (!groups_.empty()) {
      flatbuffers::FlatBufferBuilder fbb;
      msg::DeclareModel m;
      m.keys = keys;
      m.shard_map_version = 1;
      m.groups = groups_;
      m.param_groups = param_groups_;
      return Send(kMonitor, fbb, msg::Build(fbb, m));
    }
    flatbuffers::FlatBufferBuilder fbb;
    return Send(kMonitor, fbb, wire::CreateDeclareModelDirect(fbb, &keys, 1));
  }
  // A push with a seq that carries learning rates for some groups.
  std::vector<ShardCore::Outgoing> PushLrs(uint32_t sender, uint64_t clock, uint32_t batch,
                                           const std::vector<float>& grads, uint64_t seq,
                                           std::vector<wire::GroupLr> lrs) {
    msg::Push push;
    push.clock = clock;
    push.batch = batch;
    push.keys = kKeys;
    push.seq = seq;
    push.lrs = std::move(lrs);
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, fbb, msg::Build(fbb, push), Floats(grads));
  }
  std::vector<ShardCore::Outgoing> Membership(uint64_t version,
                                              const std::vector<WorkerSpec>& workers) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<wire::WorkerInfo>> infos;
    for (const auto& w : workers)
      infos.push_back(wire::CreateWorkerInfoDirect(fbb, w.id, w.rank, w.batch, w.start_clock,
                                                   w.staleness, w.staleness_range,
                                                   w.key.empty() ? nullptr : w.key.c_str()));
    return Send(kMonitor, fbb, wire::CreateMembershipDirect(fbb, version, &infos));
  }
  std::vector<ShardCore::Outgoing> Init(uint32_t sender, const std::vector<float>& values) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, fbb, wire::CreateInitDirect(fbb, &kKeys), Floats(values));
  }
  std::vector<ShardCore::Outgoing> Push(uint32_t sender, uint64_t clock, uint32_t batch,
                                        const std::vector<float>& grads,
                                        const std::vector<wire::KeyLen>& keys = kKeys) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, fbb, wire::CreatePushDirect(fbb, clock, batch, &keys), Floats(grads));
  }
  // A push that names the version it was computed on.
  std::vector<ShardCore::Outgoing> PushRead(uint32_t sender, uint64_t clock, uint32_t batch,
                                            const std::vector<float>& grads,
                                            std::optional<int64_t> read_applied,
                                            std::optional<uint64_t> read_steps = {}) {
    flatbuffers::FlatBufferBuilder fbb;
    auto kv = fbb.CreateVectorOfStructs(kKeys);
    wire::PushBuilder pb(fbb);
    pb.add_clock(clock);
    pb.add_batch(batch);
    pb.add_keys(kv);
    if (read_applied) pb.add_read_applied(*read_applied);
    if (read_steps) pb.add_read_steps(*read_steps);
    auto body = pb.Finish();
    return Send(sender, fbb, body, Floats(grads));
  }
  // A push with a (worker, seq) id; `request` > 0 reuses that request id
  // (a resend of the same message).
  std::vector<ShardCore::Outgoing> PushSeq(uint32_t sender, uint64_t clock, uint32_t batch,
                                           const std::vector<float>& grads, uint64_t seq) {
    return PushPart(sender, clock, batch, seq, 0, 1, kKeys, grads);  // a push in one part
  }
  // Part `part` of `parts` of push `seq`: `keys` (a subset) and their values.
  std::vector<ShardCore::Outgoing> PushPart(uint32_t sender, uint64_t clock, uint32_t batch,
                                            uint64_t seq, uint32_t part, uint32_t parts,
                                            const std::vector<wire::KeyLen>& keys,
                                            const std::vector<float>& grads) {
    flatbuffers::FlatBufferBuilder fbb;
    auto kv = fbb.CreateVectorOfStructs(keys);
    wire::PushBuilder pb(fbb);
    pb.add_clock(clock);
    pb.add_batch(batch);
    pb.add_keys(kv);
    pb.add_seq(seq);
    pb.add_part(part);
    pb.add_parts(parts);
    pb.add_epoch(epoch_);
    auto body = pb.Finish();
    return Send(sender, fbb, body, Floats(grads));
  }
  // Whether the single reply in `out` is a PushReply saying its push is complete.
  static bool Completes(const std::vector<ShardCore::Outgoing>& out) {
    EXPECT_EQ(out.size(), 1u);
    if (out.empty()) return false;
    Decoded d = MustDecode(out[0]);
    EXPECT_EQ(d.type(), wire::Body::PushReply)
        << (d.type() == wire::Body::Error ? d.As<wire::Error>()->reason()->str() : "");
    return d.type() == wire::Body::PushReply && d.As<wire::PushReply>()->complete();
  }
  std::vector<ShardCore::Outgoing> Pull(uint32_t sender, uint64_t clock,
                                        const std::vector<wire::KeyLen>& keys = kKeys,
                                        bool latest = false) {
    flatbuffers::FlatBufferBuilder fbb;
    return Send(sender, fbb, wire::CreatePullDirect(fbb, clock, &keys, latest, false, epoch_));
  }

  static Decoded MustDecode(const ShardCore::Outgoing& o) {
    DecodeOptions opts;
    opts.job_id = kJob;
    Decoded d;
    DecodeError err;
    EXPECT_TRUE(Decode(o.frames, opts, &d, &err)) << err.reason;
    return d;
  }

  static void ExpectAck(const std::vector<ShardCore::Outgoing>& out) {
    ASSERT_EQ(out.size(), 1u);
    Decoded d = MustDecode(out[0]);
    if (d.type() == wire::Body::Error) {
      ADD_FAILURE() << "error reply: " << d.As<wire::Error>()->reason()->str();
      return;
    }
    EXPECT_EQ(d.type(), wire::Body::Ack);
  }

  // The error code of the single reply in `out`, or nullopt when it is not an Error.
  static std::optional<wire::ErrorCode> ErrorOf(const std::vector<ShardCore::Outgoing>& out) {
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1) return std::nullopt;
    Decoded d = MustDecode(out[0]);
    if (d.type() != wire::Body::Error) return std::nullopt;
    return d.As<wire::Error>()->code();
  }

  static void ExpectPushReply(const ShardCore::Outgoing& o, uint64_t clock) {
    Decoded d = MustDecode(o);
    ASSERT_EQ(d.type(), wire::Body::PushReply)
        << (d.type() == wire::Body::Error ? d.As<wire::Error>()->reason()->str() : "");
    EXPECT_EQ(d.As<wire::PushReply>()->clock(), clock);
  }

  // The values carried by a PullReply, in key order.
  static std::vector<float> PullValues(const ShardCore::Outgoing& o) {
    Decoded d = MustDecode(o);
    EXPECT_EQ(d.type(), wire::Body::PullReply)
        << (d.type() == wire::Body::Error ? d.As<wire::Error>()->reason()->str() : "");
    if (d.type() != wire::Body::PullReply) return {};
    return {d.floats().begin(), d.floats().end()};
  }

  // The shard's parameters, flat in key order.
  std::vector<float> Params() const {
    std::vector<float> w;
    for (const auto& k : kKeys) {
      std::span<const float> p = shard_->Param(k.key());
      w.insert(w.end(), p.begin(), p.end());
    }
    return w;
  }

  static std::string KeyOf(uint32_t sender) { return std::string("K").append(std::to_string(sender)); }

  FakeClock clock_;
  ShardJob job_;  // as Start configured the shard
  std::unique_ptr<ShardCore> shard_;
  uint64_t next_request_ = 0;
  bool curve_ = false;        // messages carry their sender's key
  std::string monitor_key_;   // ShardOptions::monitor_key
  float momentum_ = kMomentum;
  OptimizerKind kind_ = OptimizerKind::kSgd;
  ShardOptions options_;  // Start's, but for the pull timeout and monitor key
  uint64_t epoch_ = 0;    // the range epoch pushes and pulls name (0: none)
  // The declaration's group per key and groups (empty: none).
  std::vector<uint32_t> groups_;
  std::vector<GroupSettings> param_groups_;
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << "index " << i;
}

// ---------------------------------------------------------------------------
// The optimizer.

// One SGD step of a block held in (w, v), in place.
void SgdStep(std::vector<float>& w, std::vector<float>& v, const std::vector<float>& g,
             const OptimizerSettings& o, uint64_t step, float grad_scale = 1.0f,
             float fraction = 1.0f) {
  BlockStep b;
  b.n = w.size();
  b.w_in = b.w_out = w.data();
  b.state_in[0] = b.state_out[0] = v.data();
  b.grad = g.data();
  b.grad_scale = grad_scale;
  b.lr = o.lr;
  b.step = step;
  b.fraction = fraction;
  MakeOptimizer(OptimizerKind::kSgd, false)->Step(b, o);
}

// SGD's momentum buffer decays by mu^f on a fraction f of a step, and the
// weights take mu (1 - mu^f) / (1 - mu) of it (BlockStep::fraction).
float Decay(float f) { return std::pow(kMomentum, f); }
float Coast(float f) { return kMomentum * (1.0f - Decay(f)) / (1.0f - kMomentum); }

TEST(OptimizerTest, SgdMomentumTwoStepsMatchHandComputation) {
  std::vector<float> w = {1.0f, 2.0f};
  std::vector<float> v = {0.0f, 0.0f};
  OptimizerSettings o;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  const std::vector<float> g1 = {0.5f, -1.0f};
  SgdStep(w, v, g1, o, 1);
  // v1 = g1; w1 = w0 - 0.1 * v1.
  ExpectNear(v, {0.5f, -1.0f});
  ExpectNear(w, {0.95f, 2.1f});
  const std::vector<float> g2 = {1.0f, 2.0f};
  SgdStep(w, v, g2, o, 2);
  // v2 = 0.9 * v1 + g2 = {1.45, 1.1}; w2 = w1 - 0.1 * v2.
  ExpectNear(v, {1.45f, 1.1f});
  ExpectNear(w, {0.805f, 1.99f});
}

TEST(OptimizerTest, GradScaleMultipliesTheGradient) {
  std::vector<float> w = {0.0f};
  std::vector<float> v = {1.0f};
  OptimizerSettings o;
  o.lr = 1.0f;
  o.momentum = 0.5f;
  SgdStep(w, v, std::vector<float>{4.0f}, o, /*step=*/2, /*grad_scale=*/0.25f);
  ExpectNear(v, {1.5f});  // 0.5 * 1 + 0.25 * 4
  ExpectNear(w, {-1.5f});
}

TEST(OptimizerTest, SgdFirstStepTakesTheGradientAsTheBufferDespiteDampening) {
  // torch: the momentum buffer starts as the gradient; dampening applies
  // from the second step.
  std::vector<float> w = {0.0f};
  std::vector<float> v = {123.0f};  // not read on the first step
  OptimizerSettings o;
  o.lr = 1.0f;
  o.momentum = 0.5f;
  o.dampening = 0.5f;
  SgdStep(w, v, std::vector<float>{2.0f}, o, 1);
  ExpectNear(v, {2.0f});
  SgdStep(w, v, std::vector<float>{2.0f}, o, 2);
  ExpectNear(v, {2.0f});  // 0.5 * 2 + (1 - 0.5) * 2
}

// SGD at lr 0.5 with the tests' momentum, plain or nesterov.
OptimizerSettings MomentumSgd(bool nesterov) {
  OptimizerSettings o;
  o.lr = 0.5f;
  o.momentum = kMomentum;
  o.nesterov = nesterov;
  return o;
}

TEST(OptimizerTest, AFractionOfAStepCoastsThatFractionOfTheMomentum) {
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov);
    const OptimizerSettings o = MomentumSgd(nesterov);
    // A buffer at 1 and no gradient: a step of 1/192 of the global batch
    // moves the weights by about 1/192 of a step (torch's whole step: lr mu
    // = 0.45).
    std::vector<float> w = {0.0f};
    std::vector<float> v = {1.0f};
    const float f = 1.0f / 192.0f;
    SgdStep(w, v, std::vector<float>{0.0f}, o, /*step=*/2, /*grad_scale=*/f, f);
    ExpectNear(v, {Decay(f)});
    ExpectNear(w, {-0.5f * (nesterov ? kMomentum * Coast(f) : Coast(f))});
    EXPECT_LT(-w[0], 0.5f * kMomentum / 150.0f);
    // At fraction 1, torch's step.
    std::vector<float> w1 = {0.0f}, v1 = {1.0f};
    SgdStep(w1, v1, std::vector<float>{2.0f}, o, 2, 1.0f, 1.0f);
    ExpectNear(v1, {kMomentum + 2.0f});
    ExpectNear(w1, {-0.5f * (nesterov ? 2.0f + kMomentum * (kMomentum + 2.0f) : kMomentum + 2.0f)});
  }
}

TEST(OptimizerTest, FractionsThatAddUpToFiveCoastAsFarAsFiveFullStepsHoweverCut) {
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov);
    const OptimizerSettings o = MomentumSgd(nesterov);
    std::vector<float> moved;
    for (const int cut : {1, 4, 192}) {
      std::vector<float> w = {0.0f};
      std::vector<float> v = {1.0f};
      const float f = 1.0f / static_cast<float>(cut);
      for (int k = 0; k < 5 * cut; ++k) SgdStep(w, v, std::vector<float>{0.0f}, o, 2 + k, f, f);
      moved.push_back(-w[0]);
    }
    // torch: lr (mu + mu^2 + ... + mu^5), nesterov times mu.
    float torch5 = 0;
    for (int k = 1; k <= 5; ++k) torch5 += std::pow(kMomentum, static_cast<float>(k));
    torch5 *= 0.5f * (nesterov ? kMomentum : 1.0f);
    for (float m : moved) EXPECT_NEAR(m / torch5, 1.0f, 1e-3f);
  }
}

TEST(OptimizerTest, StepsOfAFewSamplesKeepTorchsPaceUnderAConstantGradient) {
  // Under a constant gradient torch's steps approach lr g / (1 - mu) each.
  // Steps of 1/192 of a batch, on the gradient scaled 1/192, keep the
  // same pace: their 40th batch's worth moves the weights as far as torch's
  // 40th step.
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov);
    OptimizerSettings o;
    o.lr = 0.1f;
    o.momentum = kMomentum;
    o.nesterov = nesterov;
    const float g = 1.0f;
    const float f = 1.0f / 192.0f;
    std::vector<float> w = {0.0f};
    std::vector<float> v = {0.0f};
    for (int k = 0; k < 192 * 39; ++k) SgdStep(w, v, std::vector<float>{g}, o, 1 + k, f, f);
    const float before = w[0];
    for (int k = 192 * 39; k < 192 * 40; ++k) SgdStep(w, v, std::vector<float>{g}, o, 1 + k, f, f);
    std::vector<float> tw = {0.0f};
    std::vector<float> tv = {0.0f};
    for (int k = 0; k < 39; ++k) SgdStep(tw, tv, std::vector<float>{g}, o, 1 + k);
    const float torch_before = tw[0];
    SgdStep(tw, tv, std::vector<float>{g}, o, 40);
    EXPECT_NEAR((before - w[0]) / (torch_before - tw[0]), 1.0f, 0.005f);
  }
}

// Each buffer of a step may be in place or fresh on its own: every mix of
// them gives what a step into fresh buffers gives (Adam, AdamW, amsgrad).
TEST(OptimizerTest, AdamStepsAnyMixOfInPlaceAndFreshBuffersAlike) {
  constexpr size_t kN = 37;  // not a multiple of a vector's width
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (bool amsgrad : {false, true}) {
      OptimizerSettings o;
      o.lr = 0.01f;
      o.weight_decay = 0.1f;
      o.amsgrad = amsgrad;
      const size_t slots = amsgrad ? 3 : 2;
      std::vector<std::vector<float>> start(1 + slots, std::vector<float>(kN));
      std::vector<float> g(kN);
      for (size_t i = 0; i < kN; ++i) {
        for (size_t b = 0; b <= slots; ++b) start[b][i] = 0.1f * static_cast<float>(i % 7 + b);
        g[i] = 0.3f - 0.05f * static_cast<float>(i % 5);
      }
      auto step = [&](unsigned in_place_mask) {
        std::vector<std::vector<float>> in = start;
        std::vector<std::vector<float>> out(1 + slots, std::vector<float>(kN, -99.0f));
        BlockStep b;
        b.n = kN;
        auto target = [&](size_t buf) {
          return (in_place_mask >> buf & 1u) != 0 ? in[buf].data() : out[buf].data();
        };
        b.w_in = in[0].data();
        b.w_out = target(0);
        for (size_t s = 0; s < slots; ++s) {
          b.state_in[s] = in[1 + s].data();
          b.state_out[s] = target(1 + s);
        }
        b.grad = g.data();
        b.lr = o.lr;
        b.step = 3;
        MakeOptimizer(kind, amsgrad)->Step(b, o);
        std::vector<std::vector<float>> result;
        for (size_t buf = 0; buf <= slots; ++buf) {
          result.push_back((in_place_mask >> buf & 1u) != 0 ? in[buf] : out[buf]);
        }
        return result;
      };
      const auto fresh = step(0);
      for (unsigned mask = 1; mask < (1u << (1 + slots)); ++mask) {
        const auto mixed = step(mask);
        for (size_t buf = 0; buf <= slots; ++buf) {
          for (size_t i = 0; i < kN; ++i) {
            ASSERT_EQ(mixed[buf][i], fresh[buf][i])
                << OptimizerName(kind) << " amsgrad " << amsgrad << " in-place mask " << mask
                << " buffer " << buf << " value " << i;
          }
        }
      }
    }
  }
}

TEST(OptimizerTest, AccumulateAddsScaledGradient) {
  std::vector<float> acc = {1.0f, 1.0f};
  Accumulate(acc, std::vector<float>{2.0f, -3.0f}, 3.0f);
  ExpectNear(acc, {7.0f, -8.0f});
}

// ---------------------------------------------------------------------------
// BSP.

TEST_F(ShardTest, SetupAsTheMonitorDrivesIt) {
  Start(wire::Mode::Bsp);
  EXPECT_EQ(shard_->membership_version(), 1u);
  EXPECT_EQ(shard_->applied_clock(), -1);
  EXPECT_EQ(shard_->steps(), 0u);
  EXPECT_EQ(shard_->incomplete_steps(), 0u);
  ExpectNear(Params(), kW0);
}

TEST_F(ShardTest, BspStepIsBatchWeightedMeanOfPushes) {
  Start(wire::Mode::Bsp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  auto out = Push(kWorkerA, 0, 1, ga);
  ASSERT_EQ(out.size(), 1u);
  ExpectPushReply(out[0], 0);
  EXPECT_EQ(shard_->applied_clock(), -1);
  ExpectNear(Params(), kW0);  // nothing applied until the barrier closes

  out = Push(kWorkerB, 0, 3, gb);
  ASSERT_EQ(out.size(), 1u);
  ExpectPushReply(out[0], 0);
  EXPECT_EQ(shard_->applied_clock(), 0);
  EXPECT_EQ(shard_->steps(), 1u);
  EXPECT_EQ(shard_->incomplete_steps(), 0u);

  // First step, v = 0: v1 = G0 = (1*ga + 3*gb) / 4; w1 = w0 - lr * v1.
  std::vector<float> v1(3), w1(3);
  for (size_t i = 0; i < 3; ++i) {
    v1[i] = (1 * ga[i] + 3 * gb[i]) / 4;
    w1[i] = kW0[i] - kLr * v1[i];
  }
  ExpectNear(Params(), w1);  // {-0.25, -1.5, -0.5}

  // Second clock: v2 = momentum * v1 + G1; w2 = w1 - lr * v2.
  const std::vector<float> ga1 = {0.0f, 4.0f, 8.0f};
  const std::vector<float> gb1 = {4.0f, 0.0f, -8.0f};
  out = Push(kWorkerB, 1, 3, gb1);
  ExpectPushReply(out.at(0), 1);
  out = Push(kWorkerA, 1, 1, ga1);
  ExpectPushReply(out.at(0), 1);
  EXPECT_EQ(shard_->applied_clock(), 1);
  EXPECT_EQ(shard_->steps(), 2u);
  std::vector<float> w2(3);
  for (size_t i = 0; i < 3; ++i) {
    float v2 = kMomentum * v1[i] + (1 * ga1[i] + 3 * gb1[i]) / 4;
    w2[i] = w1[i] - kLr * v2;
  }
  ExpectNear(Params(), w2);
}

// Workers take a new batch size at their own clocks, so a clock can gather
// fewer samples than the global batch B (1 + 1 after the monitor swaps
// sizes 1 and 3): it steps in proportion, sum_i b_i g_i / B, not a full
// step on the mean of 2 samples.
TEST_F(ShardTest, AClockShortOfTheGlobalBatchStepsInProportion) {
  for (wire::Mode mode : {wire::Mode::Bsp, wire::Mode::Ssp, wire::Mode::Dssp}) {
    SCOPED_TRACE(static_cast<int>(mode));
    Start(mode);
    const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
    const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
    Push(kWorkerA, 0, 1, ga);
    Push(kWorkerB, 0, 1, gb);
    ASSERT_EQ(shard_->applied_clock(), 0);
    std::vector<float> want(3);
    for (size_t i = 0; i < 3; ++i) want[i] = kW0[i] - kLr * (ga[i] + gb[i]) / kGlobalBatch;
    ExpectNear(Params(), want);
    // A clock over B (3 + 3 after the swap back) is the plain mean.
    Push(kWorkerA, 1, 3, ga);
    Push(kWorkerB, 1, 3, gb);
    ASSERT_EQ(shard_->applied_clock(), 1);
    for (size_t i = 0; i < 3; ++i) {
      const float v1 = (ga[i] + gb[i]) / kGlobalBatch;
      want[i] -= kLr * (kMomentum * v1 + (ga[i] + gb[i]) / 2);
    }
    ExpectNear(Params(), want);
  }
}

// A worker left alone at an epoch's end pushes clocks of a few samples while
// the others push nothing. Each such clock is its fraction of a step: 20
// clocks of 1 sample in 4 coast as far as torch's 5 steps of no gradient,
// not 20 (scaling only the gradient left the momentum a full step per clock;
// with momentum 0.9 that dropped a model from 0.85 to 0.71 accuracy at the
// end of a benchmark run).
TEST_F(ShardTest, ClocksOfAFewSamplesCoastOnlyTheirShareOfTheMomentum) {
  for (wire::Mode mode : {wire::Mode::Bsp, wire::Mode::Ssp, wire::Mode::Dssp, wire::Mode::Asp}) {
    SCOPED_TRACE(wire::EnumNameMode(mode));
    Start(mode);
    const std::vector<float> g = {1.0f, 2.0f, -4.0f};
    const std::vector<float> zero = {0.0f, 0.0f, 0.0f};
    // Two full steps build the buffer up.
    for (uint64_t c = 0; c < 2; ++c) {
      Push(kWorkerA, c, 1, g);
      Push(kWorkerB, c, 3, g);
    }
    const std::vector<float> at_full = Params();
    constexpr int kClocks = 20;
    for (uint64_t c = 2; c < 2 + kClocks; ++c) {
      Push(kWorkerA, c, 1, zero);
      if (mode != wire::Mode::Asp) Push(kWorkerB, c, 0, zero);
    }
    if (mode != wire::Mode::Asp) {
      ASSERT_EQ(shard_->applied_clock(), 1 + kClocks);
    }
    const std::vector<float> after_tail = Params();
    // The buffer after the full steps, as each mode built it (asp steps
    // each push: 1/4 then 3/4 of a step).
    std::vector<float> moved(3), torch5(3);
    float coast5 = 0;
    for (int k = 1; k <= 5; ++k) coast5 += std::pow(kMomentum, static_cast<float>(k));
    float buf = 0;
    if (mode == wire::Mode::Asp) {
      for (int c = 0; c < 2; ++c) buf = Decay(0.75f) * (Decay(0.25f) * buf + 0.25f) + 0.75f;
    } else {
      buf = 1.0f + kMomentum * 1.0f;  // v1 = g, v2 = mu g + g (per unit of g)
    }
    for (size_t i = 0; i < 3; ++i) {
      moved[i] = after_tail[i] - at_full[i];
      torch5[i] = -kLr * buf * g[i] * coast5;
      EXPECT_NEAR(moved[i] / torch5[i], 1.0f, 1e-3f) << "index " << i;
    }
  }
}

TEST_F(ShardTest, RestoredSnapshotContinuesExactlyWhereTheShardWas) {
  Start(wire::Mode::Bsp);
  Push(kWorkerA, 0, 1, {1.0f, 2.0f, -4.0f});
  Push(kWorkerB, 0, 3, {3.0f, -2.0f, 4.0f});
  ASSERT_EQ(shard_->applied_clock(), 0);
  const ShardSnapshot snap = shard_->Snapshot();
  EXPECT_EQ(snap.applied_clock, 0);
  EXPECT_EQ(snap.steps, 1u);
  EXPECT_EQ(snap.table.keys.size(), 2u);
  EXPECT_EQ(snap.workers.at(kWorkerA).clock, 0);
  EXPECT_NE(*snap.table.state[0], std::vector<float>(3, 0.0f)) << "momentum is part of the state";
  // The original goes on one more clock...
  const std::vector<float> ga = {0.0f, 4.0f, 8.0f}, gb = {4.0f, 0.0f, -8.0f};
  Push(kWorkerA, 1, 1, ga);
  Push(kWorkerB, 1, 3, gb);
  const std::vector<float> expected = Params();

  // ...and so does a fresh shard restored from the snapshot, after the
  // monitor declares the same keys and sends the membership again.
  ShardOptions opts;
  auto restored = std::make_unique<ShardCore>(opts, &clock_);
  ShardJob job;
  job.job_id = kJob;
  job.mode = wire::Mode::Bsp;
  job.optimizer.defaults.lr = kLr;
  job.optimizer.defaults.momentum = kMomentum;
  job.global_batch = kGlobalBatch;
  EXPECT_EQ(restored->Restore(snap).code(), absl::StatusCode::kFailedPrecondition)
      << "not configured yet";
  restored->Configure(job, kShardId + 1);
  EXPECT_EQ(restored->Restore(snap).code(), absl::StatusCode::kInvalidArgument) << "other shard";
  restored = std::make_unique<ShardCore>(opts, &clock_);
  restored->Configure(job, kShardId);
  ShardSnapshot broken = snap;
  broken.table.state[0] = std::make_shared<std::vector<float>>(2, 0.0f);
  EXPECT_EQ(restored->Restore(broken).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(restored->Restore(snap).ok());
  EXPECT_EQ(restored->Restore(snap).code(), absl::StatusCode::kFailedPrecondition)
      << "already holds a model";
  shard_ = std::move(restored);
  EXPECT_TRUE(shard_->initialized());
  EXPECT_EQ(shard_->applied_clock(), 0);
  ExpectAck(Declare(kKeys));
  ExpectAck(Membership(1, {{kWorkerA, 0, 1}, {kWorkerB, 1, 3}}));
  ExpectAck(Init(kWorkerA, kW0));  // ignored: the restored parameters stay
  Push(kWorkerA, 1, 1, ga);
  Push(kWorkerB, 1, 3, gb);
  EXPECT_EQ(shard_->applied_clock(), 1);
  EXPECT_EQ(shard_->steps(), 2u);
  ExpectNear(Params(), expected);
}

TEST_F(ShardTest, SnapshotSharesTheBuffersAndTheNextStepWritesNewOnes) {
  Start(wire::Mode::Bsp);
  Push(kWorkerA, 0, 1, {1.0f, 2.0f, -4.0f});
  Push(kWorkerB, 0, 3, {3.0f, -2.0f, 4.0f});
  const ShardSnapshot snap = shard_->Snapshot();
  const std::vector<float> at_snapshot = *snap.table.params;
  const std::vector<float> velocity_at_snapshot = *snap.table.state[0];
  EXPECT_EQ(snap.table.params->data(), shard_->Param(1).data()) << "no copy taken";
  Push(kWorkerA, 1, 1, {0.0f, 4.0f, 8.0f});
  Push(kWorkerB, 1, 3, {4.0f, 0.0f, -8.0f});
  ASSERT_EQ(shard_->applied_clock(), 1);
  EXPECT_NE(snap.table.params->data(), shard_->Param(1).data());
  EXPECT_EQ(*snap.table.params, at_snapshot) << "the step must not write into the snapshot";
  EXPECT_EQ(*snap.table.state[0], velocity_at_snapshot);
  EXPECT_NE(Params(), at_snapshot);
}

TEST_F(ShardTest, RetriedPushWithTheSameSeqIsAppliedOnce) {
  Start(wire::Mode::Bsp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f}, gb = {3.0f, -2.0f, 4.0f};
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, ga, 1).at(0), 0);
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, ga, 1).at(0), 0);  // a retry: acknowledged
  ExpectPushReply(PushSeq(kWorkerB, 0, 3, gb, 1).at(0), 0);
  ASSERT_EQ(shard_->applied_clock(), 0);
  EXPECT_EQ(shard_->updates_applied(), 2u);
  // Once more after the clock closed: still acknowledged, never applied.
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, ga, 1).at(0), 0);
  EXPECT_EQ(shard_->updates_applied(), 2u);
  std::vector<float> expected(3);
  for (size_t i = 0; i < 3; ++i) expected[i] = kW0[i] - kLr * (1 * ga[i] + 3 * gb[i]) / 4;
  ExpectNear(Params(), expected);

  Start(wire::Mode::Asp);
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, ga, 1).at(0), 0);
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, ga, 1).at(0), 0);
  EXPECT_EQ(shard_->steps(), 1u);
  EXPECT_EQ(shard_->updates_applied(), 1u);
}

TEST_F(ShardTest, PushInPartsIsHeldUntilTheLastPartThenAppliedOnce) {
  // kKeys: key 1 (2 values), key 2 (1 value). The last layer's key first,
  // as a layer-wise push sends it.
  const std::vector<wire::KeyLen> k1 = {kKeys[0]}, k2 = {kKeys[1]};
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f}, gb = {3.0f, -2.0f, 4.0f};
  for (wire::Mode mode : {wire::Mode::Bsp, wire::Mode::Asp}) {
    SCOPED_TRACE(wire::EnumNameMode(mode));
    Start(mode);
    EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k2, {ga[2]})));
    EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k2, {ga[2]})));  // resent part
    EXPECT_EQ(shard_->updates_applied(), 0u);
    EXPECT_TRUE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k1, {ga[0], ga[1]})));
    EXPECT_EQ(shard_->updates_applied(), 1u);
    // Parts of an applied push again: acknowledged as complete, not applied.
    EXPECT_TRUE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k2, {ga[2]})));
    EXPECT_TRUE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k1, {ga[0], ga[1]})));
    EXPECT_EQ(shard_->updates_applied(), 1u);
    EXPECT_TRUE(Completes(PushSeq(kWorkerB, 0, 3, gb, 1)));  // one message
    EXPECT_EQ(shard_->updates_applied(), 2u);
    std::vector<float> expected(3);
    if (mode == wire::Mode::Bsp) {
      // The same step as two whole pushes.
      ASSERT_EQ(shard_->applied_clock(), 0);
      for (size_t i = 0; i < 3; ++i) expected[i] = kW0[i] - kLr * (1 * ga[i] + 3 * gb[i]) / 4;
      ExpectNear(Params(), expected);
    } else {
      EXPECT_EQ(shard_->steps(), 2u);
    }
  }
}

TEST_F(ShardTest, PushPartsWithoutASeqOrOutOfRangeAreBadHeaders) {
  Start(wire::Mode::Bsp);
  const std::vector<wire::KeyLen> k1 = {kKeys[0]};
  EXPECT_EQ(ErrorOf(PushPart(kWorkerA, 0, 1, /*seq=*/0, 0, 2, k1, {1, 1})),
            wire::ErrorCode::BadHeader);
  EXPECT_EQ(ErrorOf(PushPart(kWorkerA, 0, 1, 1, /*part=*/2, 2, k1, {1, 1})),
            wire::ErrorCode::BadHeader);
  EXPECT_EQ(shard_->updates_applied(), 0u);
}

TEST_F(ShardTest, APartOfAnotherLayoutStartsThePushAfresh) {
  // After a shard-map change the worker sends the same seq in other parts:
  // what was held for it goes, and only the new layout's parts make the push.
  Start(wire::Mode::Bsp);
  const std::vector<wire::KeyLen> k1 = {kKeys[0]}, k2 = {kKeys[1]};
  EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k1, {9, 9})));
  // Part 0 again, now with key 2: not the part 0 held.
  EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k2, {3})));
  EXPECT_TRUE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k1, {1, 2})));
  EXPECT_EQ(shard_->updates_applied(), 1u);
  ExpectPushReply(PushSeq(kWorkerB, 0, 3, {0, 0, 0}, 1).at(0), 0);
  ASSERT_EQ(shard_->applied_clock(), 0);
  // The step used {1, 2, 3} from worker A (batch 1 of 4), not the 9s.
  const std::vector<float> ga = {1, 2, 3};
  std::vector<float> expected(3);
  for (size_t i = 0; i < 3; ++i) expected[i] = kW0[i] - kLr * ga[i] / 4;
  ExpectNear(Params(), expected);
}

TEST_F(ShardTest, PartsLostInARestartNeverCompleteAndTheWholePushIsSentAgain) {
  // The worker sees every part answered with complete=false and sends them
  // all again: the push is applied then, once.
  Start(wire::Mode::Bsp);
  const std::vector<wire::KeyLen> k1 = {kKeys[0]}, k2 = {kKeys[1]};
  EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k2, {3})));
  Start(wire::Mode::Bsp);  // a fresh shard: the held part is gone
  EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k1, {1, 2})));
  EXPECT_EQ(shard_->updates_applied(), 0u);
  EXPECT_FALSE(Completes(PushPart(kWorkerA, 0, 1, 1, 0, 2, k1, {1, 2})));
  EXPECT_TRUE(Completes(PushPart(kWorkerA, 0, 1, 1, 1, 2, k2, {3})));
  EXPECT_EQ(shard_->updates_applied(), 1u);
}

TEST_F(ShardTest, UnderCurveASenderIdIsBoundToItsKey) {
  curve_ = true;
  monitor_key_ = KeyOf(kMonitor);
  Start(wire::Mode::Bsp, {{kWorkerA, 0, 1, 0, 0, 0, KeyOf(kWorkerA)},
                          {kWorkerB, 1, 3, 0, 0, 0, KeyOf(kWorkerB)}});
  const std::vector<float> g = {1, 1, 1};
  ExpectPushReply(PushSeq(kWorkerA, 0, 1, g, /*seq=*/1).at(0), 0);
  const uint64_t a_request = next_request_;
  // Worker B replays worker A's push (A's id, B's connection and key).
  flatbuffers::FlatBufferBuilder fbb;
  Envelope env;
  env.job_id = kJob;
  env.sender = kWorkerA;
  env.request_id = 99;
  Frames replay = EncodeBody(env, fbb, wire::CreatePushDirect(fbb, 0, 1, &kKeys), Floats(g));
  replay.insert(replay.begin(), PeerFrame(kWorkerB));
  replay[0].set_peer_key(KeyOf(kWorkerB));
  std::vector<ShardCore::Outgoing> out;
  shard_->Handle(std::move(replay), &out);
  EXPECT_EQ(ErrorOf(out), wire::ErrorCode::Refused);
  // A worker posing as the monitor: its membership is refused.
  flatbuffers::FlatBufferBuilder mfbb;
  std::vector<flatbuffers::Offset<wire::WorkerInfo>> none;
  env.sender = kMonitor;
  env.request_id = 100;
  Frames fake = EncodeBody(env, mfbb, wire::CreateMembershipDirect(mfbb, 9, &none));
  fake.insert(fake.begin(), PeerFrame(kWorkerB));
  fake[0].set_peer_key(KeyOf(kWorkerB));
  out.clear();
  shard_->Handle(std::move(fake), &out);
  EXPECT_EQ(ErrorOf(out), wire::ErrorCode::Refused);
  EXPECT_EQ(shard_->membership_version(), 1u);
  EXPECT_EQ(shard_->updates_applied(), 1u);
  // B under its own id and key is heard.
  ExpectPushReply(Push(kWorkerB, 0, 3, g).at(0), 0);
  EXPECT_EQ(shard_->applied_clock(), 0);
  const auto refused = [&](const char* reason) {
    return ReadMetric(shard_->registry(), "pacer_security_refused_messages_total",
                      {{"reason", reason}});
  };
  EXPECT_EQ(refused("sender_key_mismatch"), 2);
  // Under CURVE only a member may set the model (Init): not any allowed key.
  EXPECT_EQ(ErrorOf(Init(77, {9, 9, 9})), wire::ErrorCode::NotMember);
  // A's own request id again with other contents is not a retry: refused.
  next_request_ = a_request - 1;
  EXPECT_EQ(ErrorOf(Push(kWorkerA, 1, 1, {5, 5, 5})), wire::ErrorCode::Refused);
  EXPECT_EQ(refused("request_id_reused"), 1);
  EXPECT_EQ(shard_->updates_applied(), 2u);
  // The very same request again is a retry: acknowledged, not applied again.
  next_request_ = a_request - 1;
  auto again = PushSeq(kWorkerA, 0, 1, g, /*seq=*/1);
  ASSERT_EQ(again.size(), 1u);
  ExpectPushReply(again.at(0), 0);
  EXPECT_EQ(shard_->updates_applied(), 2u);
  EXPECT_EQ(refused("request_id_reused"), 1);
  // Plain ZeroMQ authenticates nothing, so nothing is checked there.
  curve_ = false;
  next_request_ = a_request - 1;
  EXPECT_NE(ErrorOf(Push(kWorkerA, 1, 1, {5, 5, 5})), wire::ErrorCode::Refused);
}

TEST_F(ShardTest, ResentPullWaitsOnceAndIsAnsweredOnce) {
  Start(wire::Mode::Bsp);
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  --next_request_;  // the same request again
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);
  Push(kWorkerA, 0, 1, {1.0f, 1.0f, 1.0f});
  auto out = Push(kWorkerB, 0, 3, {1.0f, 1.0f, 1.0f});
  EXPECT_EQ(out.size(), 2u) << "the push reply and one pull reply";
}

// kill -9 after the snapshot: the restored shard counts, from each worker's
// next push seq, the acknowledged pushes it lost, and closes the clocks the
// workers have all passed instead of waiting for pushes that will not come.
TEST_F(ShardTest, RestoredShardCountsLostPushesAndCatchesUp) {
  Start(wire::Mode::Bsp);
  const std::vector<float> g = {1.0f, 1.0f, 1.0f};
  uint64_t seq = 0;
  for (uint64_t c = 0; c < 2; ++c) {
    ++seq;
    PushSeq(kWorkerA, c, 1, g, seq);
    PushSeq(kWorkerB, c, 3, g, seq);
  }
  ASSERT_EQ(shard_->applied_clock(), 1);
  const ShardSnapshot snap = shard_->Snapshot();
  EXPECT_EQ(snap.workers.at(kWorkerA).seq, 2u);
  // After the snapshot: clocks 2 and 3 from both, and A's push of clock 4.
  for (uint64_t c = 2; c < 4; ++c) {
    ++seq;
    ExpectPushReply(PushSeq(kWorkerA, c, 1, g, seq).at(0), c);
    ExpectPushReply(PushSeq(kWorkerB, c, 3, g, seq).at(0), c);
  }
  ExpectPushReply(PushSeq(kWorkerA, 4, 1, g, 5).at(0), 4);
  const uint64_t acked_since_snapshot = shard_->updates_applied() - snap.updates_applied;
  EXPECT_EQ(acked_since_snapshot, 5u);
  // A snapshot with a push in an open clock leaves that push out.
  const ShardSnapshot with_open = shard_->Snapshot();
  EXPECT_EQ(with_open.workers.at(kWorkerA).seq, 4u);
  EXPECT_EQ(with_open.workers.at(kWorkerA).clock, 3);
  EXPECT_EQ(with_open.updates_applied, shard_->updates_applied() - 1);

  // kill -9; a new process restores the older snapshot.
  ShardOptions opts;
  opts.pull_timeout = std::chrono::seconds(5);
  shard_ = std::make_unique<ShardCore>(opts, &clock_);
  ShardJob job;
  job.job_id = kJob;
  job.mode = wire::Mode::Bsp;
  job.optimizer.defaults.lr = kLr;
  job.optimizer.defaults.momentum = kMomentum;
  job.global_batch = kGlobalBatch;
  shard_->Configure(job, kShardId);
  ASSERT_TRUE(shard_->Restore(snap).ok());
  // A checkpoint taken before the monitor names the workers again keeps
  // their marks (a second crash then restores the same dedup state).
  EXPECT_EQ(shard_->Snapshot().workers, snap.workers);
  ExpectAck(Declare(kKeys));
  ExpectAck(Membership(1, {{kWorkerA, 0, 1}, {kWorkerB, 1, 3}}));
  // A waits for clock 5; B pushes clock 4 (its next) and then reads 5.
  EXPECT_TRUE(Pull(kWorkerA, 5).empty());
  auto out = PushSeq(kWorkerB, 4, 3, g, 5);
  ASSERT_FALSE(out.empty());
  ExpectPushReply(out.at(0), 4);
  EXPECT_EQ(shard_->skipped_clocks(), 2u) << "clocks 2 and 3 were lost whole";
  EXPECT_EQ(shard_->applied_clock(), 4) << "clock 4 closes with B's push";
  ASSERT_EQ(out.size(), 2u) << "A's read of clock 5 is answered";
  EXPECT_EQ(shard_->lost_updates(), 2u) << "B's pushes of clocks 2 and 3";
  ExpectPushReply(PushSeq(kWorkerA, 5, 1, g, 6).at(0), 5);
  EXPECT_EQ(shard_->lost_updates(), acked_since_snapshot);
  EXPECT_EQ(shard_->registry().Collect().empty(), false);
  // And training goes on.
  ExpectPushReply(PushSeq(kWorkerB, 5, 3, g, 6).at(0), 5);
  EXPECT_EQ(shard_->applied_clock(), 5);
}

TEST_F(ShardTest, PullParksUntilEveryLiveWorkerPushed) {
  Start(wire::Mode::Bsp);
  // Clock 0 needs no step: the initial values are answered at once.
  auto out = Pull(kWorkerA, 0);
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(PullValues(out[0]), kW0);

  out = Pull(kWorkerA, 1);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);

  out = Push(kWorkerA, 0, 1, {1.0f, 1.0f, 1.0f});
  ASSERT_EQ(out.size(), 1u);  // the push reply, the pull still waits for B
  ExpectPushReply(out[0], 0);
  EXPECT_EQ(shard_->parked_pulls(), 1u);

  out = Push(kWorkerB, 0, 3, {1.0f, 1.0f, 1.0f});
  ASSERT_EQ(out.size(), 2u);
  ExpectPushReply(out[0], 0);
  EXPECT_EQ(PeerId(out[0].peer), kWorkerB);
  EXPECT_EQ(PeerId(out[1].peer), kWorkerA);
  Decoded reply = MustDecode(out[1]);
  ASSERT_EQ(reply.type(), wire::Body::PullReply);
  EXPECT_EQ(reply.As<wire::PullReply>()->clock(), 1u);
  EXPECT_EQ(reply.As<wire::PullReply>()->applied_clock(), 0);
  const std::vector<float> w1 = {kW0[0] - kLr, kW0[1] - kLr, kW0[2] - kLr};
  ExpectNear(PullValues(out[1]), w1);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
}

TEST_F(ShardTest, PullOfSomeKeysAnswersThoseKeysOnly) {
  Start(wire::Mode::Bsp);
  auto out = Pull(kWorkerA, 0, {{2, 1}});
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(PullValues(out[0]), {kW0[2]});
}

TEST_F(ShardTest, DuplicatePushIsAppliedOnce) {
  Start(wire::Mode::Bsp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  ExpectPushReply(Push(kWorkerA, 0, 1, ga).at(0), 0);
  // A retry of the same (worker, clock), even with other values, is
  // acknowledged and not folded in again.
  ExpectPushReply(Push(kWorkerA, 0, 1, {100.0f, 100.0f, 100.0f}).at(0), 0);
  EXPECT_EQ(shard_->applied_clock(), -1);
  ExpectPushReply(Push(kWorkerB, 0, 3, gb).at(0), 0);
  std::vector<float> w1(3);
  for (size_t i = 0; i < 3; ++i) w1[i] = kW0[i] - kLr * (1 * ga[i] + 3 * gb[i]) / 4;
  ExpectNear(Params(), w1);
  EXPECT_EQ(shard_->steps(), 1u);
}

TEST_F(ShardTest, PushForClosedClockIsStale) {
  Start(wire::Mode::Bsp);
  Push(kWorkerA, 0, 1, {1, 1, 1});
  Push(kWorkerB, 0, 3, {1, 1, 1});
  ASSERT_EQ(shard_->applied_clock(), 0);
  const std::vector<float> w1 = Params();
  EXPECT_EQ(ErrorOf(Push(kWorkerA, 0, 1, {5, 5, 5})), wire::ErrorCode::Stale);
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::Stale), 1);
  ExpectNear(Params(), w1);
  // The next clock is still open.
  ExpectPushReply(Push(kWorkerA, 1, 1, {1, 1, 1}).at(0), 1);
}

TEST_F(ShardTest, PushFromNonMemberIsNotMember) {
  Start(wire::Mode::Bsp);
  EXPECT_EQ(ErrorOf(Push(/*sender=*/99, 0, 1, {1, 1, 1})), wire::ErrorCode::NotMember);
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::NotMember), 1);
  // The stranger's push does not count towards the barrier.
  Push(kWorkerA, 0, 1, {1, 1, 1});
  EXPECT_EQ(shard_->applied_clock(), -1);
}

TEST_F(ShardTest, KeyNotOwnedIsNotOwner) {
  Start(wire::Mode::Bsp);
  EXPECT_EQ(ErrorOf(Push(kWorkerA, 0, 1, {1, 1, 1, 1}, {{1, 2}, {2, 1}, {77, 1}})),
            wire::ErrorCode::NotOwner);
  EXPECT_EQ(ErrorOf(Pull(kWorkerA, 0, {{77, 1}})), wire::ErrorCode::NotOwner);
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::NotOwner), 2);
}

TEST_F(ShardTest, WrongKeyLengthOrRepeatedKeyIsBadLength) {
  Start(wire::Mode::Bsp);
  // A known key with the wrong length, and a key listed twice.
  EXPECT_EQ(ErrorOf(Pull(kWorkerA, 0, {{1, 3}})), wire::ErrorCode::BadLength);
  EXPECT_EQ(ErrorOf(Pull(kWorkerA, 0, {{1, 2}, {1, 2}})), wire::ErrorCode::BadLength);
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::BadLength), 2);
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::NotOwner), 0);
}

TEST_F(ShardTest, MembershipChangeReleasesParkedPull) {
  Start(wire::Mode::Bsp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  Push(kWorkerA, 0, 1, ga);
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  ASSERT_EQ(shard_->parked_pulls(), 1u);

  // B is declared dead: the step uses the pushes received, A's alone, and
  // is short of the global batch: 1 of its 4 samples, a quarter step.
  auto out = Membership(2, {{kWorkerA, 0, 1}});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(MustDecode(out[0]).type(), wire::Body::Ack);
  EXPECT_EQ(shard_->membership_version(), 2u);
  EXPECT_EQ(shard_->applied_clock(), 0);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
  std::vector<float> w1(3);
  for (size_t i = 0; i < 3; ++i) w1[i] = kW0[i] - kLr * ga[i] / kGlobalBatch;
  ExpectNear(PullValues(out[1]), w1);
  ExpectNear(Params(), w1);

  // B is no longer a member.
  EXPECT_EQ(ErrorOf(Push(kWorkerB, 1, 3, {1, 1, 1})), wire::ErrorCode::NotMember);
}

TEST_F(ShardTest, StepWithPushFromDepartedWorkerCountsAsIncomplete) {
  Start(wire::Mode::Bsp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  Push(kWorkerB, 0, 3, gb);
  ExpectAck(Membership(2, {{kWorkerA, 0, 1}}));  // B leaves after its push
  EXPECT_EQ(shard_->applied_clock(), -1);
  Push(kWorkerA, 0, 1, ga);
  EXPECT_EQ(shard_->applied_clock(), 0);
  EXPECT_EQ(shard_->steps(), 1u);
  EXPECT_EQ(shard_->incomplete_steps(), 1u);
  std::vector<float> w1(3);
  for (size_t i = 0; i < 3; ++i) w1[i] = kW0[i] - kLr * (1 * ga[i] + 3 * gb[i]) / 4;
  ExpectNear(Params(), w1);
}

TEST_F(ShardTest, OlderMembershipIsIgnored) {
  Start(wire::Mode::Bsp);
  ExpectAck(Membership(3, {{kWorkerA, 0, 1}}));
  ExpectAck(Membership(2, {{kWorkerA, 0, 1}, {kWorkerB, 1, 3}}));
  EXPECT_EQ(shard_->membership_version(), 3u);
  EXPECT_EQ(ErrorOf(Push(kWorkerB, 0, 3, {1, 1, 1})), wire::ErrorCode::NotMember);
}

TEST_F(ShardTest, ParkedPullGetsDeadlineExceededOnlyAfterDeadline) {
  Start(wire::Mode::Bsp);  // pull_timeout 5 s
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  EXPECT_EQ(shard_->NextDeadline(), clock_.Now() + std::chrono::seconds(5));

  std::vector<ShardCore::Outgoing> out;
  clock_.Advance(std::chrono::milliseconds(4999));
  shard_->Tick(&out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);

  clock_.Advance(std::chrono::milliseconds(1));
  shard_->Tick(&out);
  EXPECT_EQ(ErrorOf(out), wire::ErrorCode::DeadlineExceeded);
  EXPECT_EQ(PeerId(out.at(0).peer), kWorkerA);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
  EXPECT_EQ(shard_->NextDeadline(), TimePoint::max());
}

TEST_F(ShardTest, LatestPullAnswersAtOnce) {
  Start(wire::Mode::Bsp);
  auto out = Pull(kWorkerA, 7, kKeys, /*latest=*/true);
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(PullValues(out[0]), kW0);
}

TEST_F(ShardTest, SecondDeclarationOfOtherModelIsMismatch) {
  Start(wire::Mode::Bsp);
  ExpectAck(Declare(kKeys));  // the same model again is fine
  EXPECT_EQ(ErrorOf(Declare({{1, 2}, {2, 2}})), wire::ErrorCode::Mismatch);
}

// The monitor's declaration carries the job's optimizer (its first
// worker's): a shard configured from the monitor's flags takes it while it
// holds no keys; once it holds keys, another kind is a mismatch.
TEST_F(ShardTest, TheDeclaredOptimizerReplacesTheFlagsWhileNoKeyIsHeld) {
  shard_ = std::make_unique<ShardCore>(options_, &clock_);
  ShardJob job;  // sgd, as the monitor's flags said at registration
  job.job_id = kJob;
  shard_->Configure(job, kShardId);
  msg::DeclareModel adamw;
  adamw.keys = kKeys;
  adamw.shard_map_version = 1;
  adamw.optimizer = JobOptimizer{OptimizerKind::kAdamW, DefaultSettings(OptimizerKind::kAdamW)};
  adamw.optimizer->settings.lr = 0.002f;
  flatbuffers::FlatBufferBuilder fbb;
  ExpectAck(Send(kMonitor, fbb, msg::Build(fbb, adamw)));
  EXPECT_EQ(shard_->table().config().kind, OptimizerKind::kAdamW);
  EXPECT_FLOAT_EQ(shard_->table().config().defaults.lr, 0.002f);
  EXPECT_EQ(shard_->table().state_slots(), 2u);  // m and v

  msg::DeclareModel sgd = adamw;
  sgd.optimizer = JobOptimizer{};
  flatbuffers::FlatBufferBuilder again;
  EXPECT_EQ(ErrorOf(Send(kMonitor, again, msg::Build(again, sgd))), wire::ErrorCode::Mismatch);
  EXPECT_EQ(shard_->table().config().kind, OptimizerKind::kAdamW);
}

TEST_F(ShardTest, OnlyTheMonitorDeclaresAndSetsMembership) {
  Start(wire::Mode::Bsp);
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::WorkerInfo>> infos;
  EXPECT_EQ(ErrorOf(Send(kWorkerA, fbb, wire::CreateMembershipDirect(fbb, 5, &infos))),
            wire::ErrorCode::Refused);
  EXPECT_EQ(shard_->membership_version(), 1u);
}

// A core serving a range since a promotion sets its series in its host's
// registry, told apart by its range label: two cores' gauges and counters
// stay their own.
TEST(ShardMetricsTest, APromotedRangesSeriesLiveBesideTheShardsOwn) {
  FakeClock clock;
  ShardOptions own;
  own.registry = std::make_shared<prometheus::Registry>();
  ShardOptions promoted = own;
  promoted.metric_labels = {{"range", "5"}};
  ShardCore a(own, &clock);
  ShardCore b(promoted, &clock);
  std::vector<ShardCore::Outgoing> out;
  a.SetReplicaSet(1, {7, 8}, &out);
  b.SetReplicaSet(1, {9}, &out);
  EXPECT_EQ(ReadMetric(*own.registry, "pacer_shard_replication_backups", {}), 2);
  EXPECT_EQ(ReadMetric(*own.registry, "pacer_shard_replication_backups", {{"range", "5"}}), 1);
}

TEST(ShardNotReadyTest, MessagesBeforeConfigureAreNotReady) {
  FakeClock clock;
  ShardCore shard(ShardOptions{}, &clock);
  flatbuffers::FlatBufferBuilder fbb;
  Envelope env;
  env.job_id = kJob;
  env.request_id = 1;
  std::vector<wire::KeyLen> keys = kKeys;
  Frames frames = EncodeBody(env, fbb, wire::CreateDeclareModelDirect(fbb, &keys, 1));
  frames.insert(frames.begin(), PeerFrame(1));
  std::vector<ShardCore::Outgoing> out;
  shard.Handle(std::move(frames), &out);
  ASSERT_EQ(out.size(), 1u);
  DecodeOptions opts;
  opts.job_id = kJob;
  Decoded d;
  DecodeError err;
  ASSERT_TRUE(Decode(out[0].frames, opts, &d, &err)) << err.reason;
  ASSERT_EQ(d.type(), wire::Body::Error);
  EXPECT_EQ(d.As<wire::Error>()->code(), wire::ErrorCode::NotReady);
}

// Regression test for a shard bug (fixed): OnPull and OnPush (ps/shard_barrier.cc, ps/shard_intake.cc) ran
// CheckKeys before the "model not declared yet" check, so before DeclareModel
// (e.g. a shard that restarted) every non-empty request is NotOwner, which
// clients treat as a permanent InvalidArgument, instead of NotReady
// (Unavailable, retry) as pacer.fbs documents and OnInit already answers.
TEST(ShardNotReadyTest, PushAndPullBeforeModelDeclaredAreNotReady) {
  FakeClock clock;
  ShardCore shard(ShardOptions{}, &clock);
  shard.Configure(ShardJob{kJob, wire::Mode::Bsp, {}}, kShardId);
  auto send = [&](flatbuffers::FlatBufferBuilder& fbb, auto body, Frame payload) {
    Envelope env;
    env.job_id = kJob;
    env.sender = kWorkerA;
    env.request_id = 1;
    Frames frames = EncodeBody(env, fbb, body, std::move(payload));
    frames.insert(frames.begin(), PeerFrame(kWorkerA));
    std::vector<ShardCore::Outgoing> out;
    shard.Handle(std::move(frames), &out);
    DecodeOptions opts;
    opts.job_id = kJob;
    Decoded d;
    DecodeError err;
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1 || !Decode(out[0].frames, opts, &d, &err) ||
        d.type() != wire::Body::Error) {
      return wire::ErrorCode::Unknown;
    }
    return d.As<wire::Error>()->code();
  };
  std::vector<wire::KeyLen> keys = kKeys;
  {
    flatbuffers::FlatBufferBuilder fbb;
    EXPECT_EQ(send(fbb, wire::CreatePullDirect(fbb, 0, &keys), Frame()), wire::ErrorCode::NotReady);
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    EXPECT_EQ(send(fbb, wire::CreatePushDirect(fbb, 0, 1, &keys), Floats({1, 2, 3})),
              wire::ErrorCode::NotReady);
  }
}

TEST_F(ShardTest, RepliesComeFromTheConfiguredShardId) {
  Start(wire::Mode::Bsp);
  auto out = Pull(kWorkerA, 0);
  ASSERT_EQ(out.size(), 1u);
  Decoded d = MustDecode(out[0]);
  EXPECT_EQ(d.env.sender, kShardId);
  EXPECT_EQ(d.env.job_id, kJob);
  EXPECT_EQ(d.env.request_id, next_request_);
}

TEST_F(ShardTest, UnreadableMessageIsDroppedAndCounted) {
  Start(wire::Mode::Bsp);
  std::vector<ShardCore::Outgoing> out;
  shard_->Handle({PeerFrame(kWorkerA), Frame::Copy("junk"), Frame::Copy("junk")}, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(shard_->rejected(wire::ErrorCode::BadEnvelope), 1);
}

// ---------------------------------------------------------------------------
// ASP.

TEST_F(ShardTest, AspAppliesEachPushAtOnceWeightedByItsBatchShare) {
  Start(wire::Mode::Asp);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  ExpectPushReply(Push(kWorkerA, 0, 1, ga).at(0), 0);
  // One optimizer step per push, weighted b_i / B: for SGD its gradient
  // (for Adam-like optimizers its lr: ScaleStep): v1 = ga / 4; w1 = w0 - lr v1.
  std::vector<float> v1(3), w1(3);
  for (size_t i = 0; i < 3; ++i) {
    v1[i] = 0.25f * ga[i];
    w1[i] = kW0[i] - kLr * v1[i];
  }
  ExpectNear(Params(), w1);
  EXPECT_EQ(shard_->applied_clock(), 0);

  ExpectPushReply(Push(kWorkerB, 0, 3, gb).at(0), 0);
  // A push of 3/4 of the global batch is 3/4 of a step: the buffer's part
  // of the update takes c(3/4) = mu (1 - mu^(3/4)) / (1 - mu) (Coast).
  std::vector<float> w2(3);
  for (size_t i = 0; i < 3; ++i) w2[i] = w1[i] - kLr * (Coast(0.75f) * v1[i] + 0.75f * gb[i]);
  ExpectNear(Params(), w2);

  // A retried push (same worker, same clock) is acknowledged, not applied.
  ExpectPushReply(Push(kWorkerB, 0, 3, gb).at(0), 0);
  ExpectNear(Params(), w2);
  EXPECT_EQ(shard_->updates_applied(), 2u);

  // A pull for any clock is answered at once with the current values.
  auto out = Pull(kWorkerA, 5);
  ASSERT_EQ(out.size(), 1u);
  ExpectNear(PullValues(out[0]), w2);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
}

// ---------------------------------------------------------------------------
// SSP, DSSP and backup workers.

// The clock of the single PullReply in `out` addressed to `worker`, if any.
std::optional<uint64_t> AnsweredPull(const std::vector<ShardCore::Outgoing>& out,
                                     uint32_t worker) {
  for (const auto& o : out) {
    if (PeerId(o.peer) != worker) continue;
    DecodeOptions opts;
    opts.job_id = kJob;
    Decoded d;
    DecodeError err;
    if (!Decode(o.frames, opts, &d, &err)) continue;
    if (d.type() == wire::Body::PullReply) return d.As<wire::PullReply>()->clock();
  }
  return std::nullopt;
}

TEST_F(ShardTest, SspReadWaitsUntilEveryWorkerPushedClockMinusBoundMinusOne) {
  // s = 1 for A, s = 0 for B.
  Start(wire::Mode::Ssp, {{kWorkerA, 0, 1, 1}, {kWorkerB, 1, 3, 0}});
  const std::vector<float> g = {1.0f, 1.0f, 1.0f};
  // A runs ahead: clocks 0 and 1 need nothing from B (1 - 1 - 1 < 0).
  EXPECT_TRUE(AnsweredPull(Pull(kWorkerA, 0), kWorkerA));
  ExpectPushReply(Push(kWorkerA, 0, 1, g).at(0), 0);
  EXPECT_TRUE(AnsweredPull(Pull(kWorkerA, 1), kWorkerA));
  ExpectPushReply(Push(kWorkerA, 1, 1, g).at(0), 1);
  // Clock 2 needs B's clock 0: parked.
  EXPECT_TRUE(Pull(kWorkerA, 2).empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);
  // B (s = 0) reads clock 1 only once A and B both pushed clock 0.
  EXPECT_TRUE(AnsweredPull(Pull(kWorkerB, 0), kWorkerB));
  EXPECT_TRUE(Pull(kWorkerB, 1).empty());
  EXPECT_EQ(shard_->parked_pulls(), 2u);
  // B's push of clock 0 releases both: A at 2 (2-1-1 = 0) and B at 1.
  auto out = Push(kWorkerB, 0, 3, g);
  ExpectPushReply(out.at(0), 0);
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(2));
  EXPECT_EQ(AnsweredPull(out, kWorkerB), std::optional<uint64_t>(1));
  EXPECT_EQ(shard_->parked_pulls(), 0u);
  EXPECT_EQ(shard_->slowest_pushed(), 0);
  // Every push was applied at once.
  EXPECT_EQ(shard_->updates_applied(), 3u);
}

TEST_F(ShardTest, SspLateJoinerStartsAtItsStartClock) {
  Start(wire::Mode::Ssp, {{kWorkerA, 0, 1, 0}});
  const std::vector<float> g = {1.0f, 1.0f, 1.0f};
  for (uint64_t c = 0; c < 5; ++c) ExpectPushReply(Push(kWorkerA, c, 1, g).at(0), c);
  // B joins at clock 5: it counts as having pushed clock 4, so A may read 5.
  ExpectAck(Membership(2, {{kWorkerA, 0, 1, 0}, {kWorkerB, 1, 3, 0, 0, 5}}));
  EXPECT_EQ(shard_->slowest_pushed(), 4);
  EXPECT_TRUE(AnsweredPull(Pull(kWorkerA, 5), kWorkerA));
  ExpectPushReply(Push(kWorkerA, 5, 1, g).at(0), 5);
  EXPECT_TRUE(Pull(kWorkerA, 6).empty());  // waits for B's clock 5
  auto out = Push(kWorkerB, 5, 3, g);
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(6));
}

TEST_F(ShardTest, SspReleasesAWaitingReadWhenTheSlowestWorkerLeaves) {
  Start(wire::Mode::Ssp, {{kWorkerA, 0, 1, 0}, {kWorkerB, 1, 3, 0}});
  ExpectPushReply(Push(kWorkerA, 0, 1, {1.0f, 1.0f, 1.0f}).at(0), 0);
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  auto out = Membership(2, {{kWorkerA, 0, 1, 0}});
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(1));
}

// A: 1 push per second, B: 1 push per 4 seconds; s_L = 0.
class DsspTest : public ShardTest {
 protected:
  void Run(uint32_t r_max) {
    Start(wire::Mode::Dssp, {{kWorkerA, 0, 1, 0, r_max}, {kWorkerB, 1, 3, 0, r_max}});
    const std::vector<float> g = {0.0f, 0.0f, 0.0f};
    for (int t = 0; t <= 4; ++t) {
      if (t == 0 || t == 4) ExpectPushReply(Push(kWorkerB, t / 4, 3, g).at(0), t / 4);
      ExpectPushReply(Push(kWorkerA, static_cast<uint64_t>(t), 1, g).at(0), t);
      if (t < 4) clock_.Advance(std::chrono::seconds(1));
    }
    ASSERT_EQ(shard_->slowest_pushed(), 1);
  }
};

TEST_F(DsspTest, GrantsTheExtraIterationsThatMeetTheSlowestWorkersNextPush) {
  Run(/*r_max=*/5);
  // A's pushes at t = 0..4 (every 1 s); B's at 0 and 4 (every 4 s): B's next
  // push is due at 8 and A gets there after r* = 4 more iterations
  // (DsspExtraIterations, tested on its own in staleness_test).
  const std::vector<double> a = {0, 1, 2, 3, 4}, b = {0, 4};
  ASSERT_EQ(DsspExtraIterations(a, b, 5), 4u);
  // s_L alone lets A read clock 2; with r* = 4 it reads up to 1 + 0 + 4 + 1 = 6.
  EXPECT_EQ(AnsweredPull(Pull(kWorkerA, 5), kWorkerA), std::optional<uint64_t>(5));
  EXPECT_EQ(shard_->last_grant(kWorkerA), 4u);
  EXPECT_EQ(AnsweredPull(Pull(kWorkerA, 6), kWorkerA), std::optional<uint64_t>(6));
  EXPECT_TRUE(Pull(kWorkerA, 7).empty());
  // B pushes clock 2 at t = 8: A's read of 7 is within the new grant.
  clock_.Advance(std::chrono::seconds(4));
  auto out = Push(kWorkerB, 2, 3, {0.0f, 0.0f, 0.0f});
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(7));
}

TEST_F(DsspTest, NeverGrantsMoreThanRMax) {
  Run(/*r_max=*/2);
  // r* would be 4; it is capped at 2, so A reads up to 1 + 0 + 2 + 1 = 4.
  EXPECT_EQ(AnsweredPull(Pull(kWorkerA, 4), kWorkerA), std::optional<uint64_t>(4));
  EXPECT_TRUE(Pull(kWorkerA, 5).empty());
  EXPECT_EQ(shard_->last_grant(kWorkerA), 2u);
}

TEST_F(DsspTest, NothingExtraWithoutEnoughPushHistory) {
  Start(wire::Mode::Dssp, {{kWorkerA, 0, 1, 0, 5}, {kWorkerB, 1, 3, 0, 5}});
  const std::vector<float> g = {0.0f, 0.0f, 0.0f};
  ExpectPushReply(Push(kWorkerA, 0, 1, g).at(0), 0);
  clock_.Advance(std::chrono::seconds(1));
  ExpectPushReply(Push(kWorkerA, 1, 1, g).at(0), 1);
  // B has never pushed: nothing to extrapolate, the bound stays s_L = 0.
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
}

// Random schedules of three workers with different bounds: no read is ever
// answered past its bound, and every read its bound allows is answered at
// once (so a blocked worker is released as soon as the slowest advances).
TEST_F(ShardTest, RandomSchedulesNeverReadPastTheBound) {
  for (wire::Mode mode : {wire::Mode::Ssp, wire::Mode::Dssp}) {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE(std::string(wire::EnumNameMode(mode)) + " seed " + std::to_string(seed));
      const std::vector<WorkerSpec> workers = {
          {kWorkerA, 0, 1, 0, 2}, {kWorkerB, 1, 1, 1, 3}, {13, 2, 2, 3, 1}};
      Start(mode, workers);
      std::mt19937 rng(seed);
      std::map<uint32_t, uint64_t> clock;   // next clock each worker reads
      std::map<uint32_t, int64_t> pushed;   // the test's own view
      std::map<uint32_t, bool> waiting;     // a read is parked
      for (const auto& w : workers) clock[w.id] = 0, pushed[w.id] = -1, waiting[w.id] = false;
      auto slowest = [&] {
        int64_t m = INT64_MAX;
        for (auto& [id, p] : pushed) m = std::min(m, p);
        return m;
      };
      auto check = [&](const std::vector<ShardCore::Outgoing>& out) {
        for (const auto& w : workers) {
          auto got = AnsweredPull(out, w.id);
          if (!got) continue;
          const uint32_t bound = w.staleness + (mode == wire::Mode::Dssp ? w.staleness_range : 0);
          EXPECT_TRUE(SspReadAllowed(*got, slowest(), bound))
              << "worker " << w.id << " read clock " << *got << " with slowest " << slowest();
          waiting[w.id] = false;
        }
      };
      for (int step = 0; step < 300; ++step) {
        clock_.Advance(std::chrono::milliseconds(1 + rng() % 50));
        const WorkerSpec& w = workers[rng() % workers.size()];
        if (waiting[w.id]) continue;
        // Read, then (if answered) push that clock.
        auto out = Pull(w.id, clock[w.id]);
        const bool answered = AnsweredPull(out, w.id).has_value();
        check(out);
        if (SspReadAllowed(clock[w.id], slowest(), w.staleness)) {
          EXPECT_TRUE(answered) << "a read within s was not answered";
        }
        if (!answered) {
          waiting[w.id] = true;
          continue;
        }
        out = Push(w.id, clock[w.id], w.batch, {0.1f, 0.1f, 0.1f});
        pushed[w.id] = static_cast<int64_t>(clock[w.id]);
        ++clock[w.id];
        check(out);
        for (const auto& v : workers) {
          if (waiting[v.id] && SspReadAllowed(clock[v.id], slowest(), v.staleness)) {
            ADD_FAILURE() << "worker " << v.id << " still waits for clock " << clock[v.id]
                          << " though the slowest pushed " << slowest();
          }
        }
      }
      EXPECT_GT(slowest(), 20);  // the schedule made progress
    }
  }
}

TEST_F(ShardTest, BackupClosesTheClockWithoutTheLastKAndDropsItsPush) {
  Start(wire::Mode::Backup, {{kWorkerA, 0, 1}, {kWorkerB, 1, 3}, {13, 2, 2}}, /*k=*/1);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  ExpectPushReply(Push(kWorkerA, 0, 1, ga).at(0), 0);
  EXPECT_EQ(shard_->applied_clock(), -1);
  auto out = Push(kWorkerB, 0, 3, gb);  // 2 of 3 pushed: clock 0 closes
  ExpectPushReply(out.at(0), 0);
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(1));
  EXPECT_EQ(shard_->applied_clock(), 0);
  // The step is the batch-weighted mean of the two pushes: (1 ga + 3 gb) / 4.
  std::vector<float> w1(3);
  for (size_t i = 0; i < 3; ++i) w1[i] = kW0[i] - kLr * (ga[i] + 3 * gb[i]) / 4;
  ExpectNear(Params(), w1);
  // The third worker's push comes late: refused as Stale, dropped, counted.
  EXPECT_EQ(ErrorOf(Push(13, 0, 2, {9.0f, 9.0f, 9.0f})), wire::ErrorCode::Stale);
  EXPECT_EQ(shard_->dropped_pushes(), 1u);
  ExpectNear(Params(), w1);
}

// Mode local: a clock is a round; each push is a worker's change over its
// round, with the samples it trained. The clock closes when every live
// worker pushed, with one full outer step on the sample-weighted mean
// (here 3 samples in all, under the global batch of 4: a bsp clock would
// take 3/4 of a step). A worker that dies before its round's push counts
// for nothing: the round closes with the others'.
TEST_F(ShardTest, LocalTakesOneOuterStepOnTheSampleWeightedMeanOfTheRounds) {
  momentum_ = 0.0f;
  Start(wire::Mode::Local);
  const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
  const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());  // round 1 reads round 0's step
  ExpectPushReply(Push(kWorkerA, 0, 1, ga).at(0), 0);
  EXPECT_EQ(shard_->applied_clock(), -1);
  auto out = Push(kWorkerB, 0, 2, gb);
  EXPECT_EQ(AnsweredPull(out, kWorkerA), std::optional<uint64_t>(1));
  std::vector<float> w(3);
  for (size_t i = 0; i < 3; ++i) w[i] = kW0[i] - kLr * (ga[i] + 2 * gb[i]) / 3;
  ExpectNear(Params(), w);
  // Round 1: B dies mid-round; its round never comes, A's alone steps.
  ExpectPushReply(Push(kWorkerA, 1, 5, ga).at(0), 1);
  EXPECT_EQ(shard_->applied_clock(), 0);
  ExpectAck(Membership(2, {{kWorkerA, 0, 1}}));
  EXPECT_EQ(shard_->applied_clock(), 1);
  for (size_t i = 0; i < 3; ++i) w[i] -= kLr * ga[i];
  ExpectNear(Params(), w);
}

TEST_F(ShardTest, ParkedReadReportsHowLongItWaited) {
  Start(wire::Mode::Bsp);
  EXPECT_TRUE(Pull(kWorkerA, 1).empty());
  clock_.Advance(std::chrono::milliseconds(1500));
  Push(kWorkerA, 0, 1, {0.0f, 0.0f, 0.0f});
  auto out = Push(kWorkerB, 0, 3, {0.0f, 0.0f, 0.0f});
  ASSERT_EQ(out.size(), 2u);
  Decoded d = MustDecode(out[1]);
  ASSERT_EQ(d.type(), wire::Body::PullReply);
  EXPECT_NEAR(d.As<wire::PullReply>()->waited_seconds(), 1.5, 1e-3);
}

// The staleness-aware learning rate: a gradient that missed tau steps joins
// the step weighted 1/(1+tau), checked against a hand computation.
TEST_F(ShardTest, StaleGradientIsWeightedOneOverOnePlusTau) {
  for (bool aware : {true, false}) {
    SCOPED_TRACE(aware ? "staleness-aware" : "plain");
    Start(wire::Mode::Ssp, {{kWorkerA, 0, 1, 2}, {kWorkerB, 1, 3, 2}}, 0, aware);
    const std::vector<float> ga = {1.0f, 2.0f, -4.0f};
    const std::vector<float> gb = {3.0f, -2.0f, 4.0f};
    // Clock 0, both fresh (read through -1): v1 = (ga + 3 gb) / 4.
    PushRead(kWorkerA, 0, 1, ga, -1);
    PushRead(kWorkerB, 0, 3, gb, -1);
    ASSERT_EQ(shard_->applied_clock(), 0);
    // Clock 1: A computed on the initial parameters (read through -1: it
    // missed clock 0's step, tau = 1); B read through 0 (fresh).
    PushRead(kWorkerA, 1, 1, ga, -1);
    PushRead(kWorkerB, 1, 3, gb, 0);
    ASSERT_EQ(shard_->applied_clock(), 1);
    // SGD's step takes sum w_i b_i g_i / sum b_i: the stale gradient enters
    // the momentum buffer weighted (ScaleStep; Adam-like optimizers take the
    // weighted mean and scale the lr by the weights' mean instead).
    const float wa = aware ? 0.5f : 1.0f;
    std::vector<float> want(3);
    for (size_t i = 0; i < 3; ++i) {
      const float v1 = (ga[i] + 3 * gb[i]) / 4;
      const float w1 = kW0[i] - kLr * v1;
      const float v2 = kMomentum * v1 + (wa * ga[i] + 3 * gb[i]) / 4;
      want[i] = w1 - kLr * v2;
    }
    ExpectNear(Params(), want);
    EXPECT_EQ(shard_->stale_pushes(), 1u);
  }
}

// A stale gradient stays damped in the steps after the one it joins: SGD's
// momentum buffer takes it weighted. (With the weight on the lr instead,
// the buffer kept it whole and the next K fresh steps applied it at full
// lr: lr (w + m (1 - m^K) / (1 - m)) g in all, 4.6x too much at w = 0.2;
// under momentum 0.9 that made chaos runs diverge.)
TEST_F(ShardTest, StaleGradientStaysDampedThroughTheMomentumBuffer) {
  Start(wire::Mode::Ssp, {{kWorkerA, 0, 1, 2}, {kWorkerB, 1, 3, 2}}, 0, /*aware=*/true);
  const std::vector<float> zero = {0.0f, 0.0f, 0.0f};
  const std::vector<float> g = {1.0f, 2.0f, -4.0f};
  PushRead(kWorkerA, 0, 1, zero, -1);
  PushRead(kWorkerB, 0, 3, zero, -1);
  const std::vector<float> before = Params();
  // Clock 1: A's gradient read through -1 (tau 1, w 1/2); B's fresh zero.
  PushRead(kWorkerA, 1, 1, g, -1);
  PushRead(kWorkerB, 1, 3, zero, 0);
  constexpr int kAfter = 20;
  for (uint64_t c = 2; c < 2 + kAfter; ++c) {
    PushRead(kWorkerA, c, 1, zero, static_cast<int64_t>(c) - 1);
    PushRead(kWorkerB, c, 3, zero, static_cast<int64_t>(c) - 1);
  }
  ASSERT_EQ(shard_->applied_clock(), 1 + kAfter);
  // v = (1/2 * 1 * g) / 4 enters the buffer, then decays: the weights move
  // lr * v * (1 - m^(K+1)) / (1 - m) in all.
  const float decay = (1.0f - std::pow(kMomentum, kAfter + 1)) / (1.0f - kMomentum);
  std::vector<float> want(3);
  for (size_t i = 0; i < 3; ++i) want[i] = before[i] - kLr * (0.5f * g[i] / 4.0f) * decay;
  const std::vector<float> got = Params();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i], 1e-4f) << "index " << i;
}

TEST_F(ShardTest, AspCountsStalenessInRoundsOfPushes) {
  Start(wire::Mode::Asp);
  const std::vector<float> g = {1.0f, 1.0f, 1.0f};
  // B pushes four times (4 steps); A then pushes a gradient read at step 0:
  // 4 steps behind = 2 rounds of the 2 live workers, so tau = 2.
  for (uint64_t c = 0; c < 4; ++c) PushRead(kWorkerB, c, 3, g, {}, c);
  const std::vector<float> before = Params();
  PushRead(kWorkerA, 0, 1, {4.0f, 4.0f, 4.0f}, {}, 0);
  EXPECT_EQ(shard_->stale_pushes(), 1u);
  // B's fresh pushes, 3/4 of a step each: v_k = mu^(3/4) v_{k-1} + (3/4) g
  // (SGD: the weight scales the gradient). A's, on a gradient of 4,
  // weighted 1/(1+2) times b/B = 1/4, a quarter of a step: the weights move
  // by c(1/4) v4 + 4/12 (Coast).
  float v = 0;
  for (int k = 0; k < 4; ++k) v = Decay(0.75f) * v + 0.75f;
  const float u5 = Coast(0.25f) * v + 4.0f / 12.0f;
  std::vector<float> want(3);
  for (size_t i = 0; i < 3; ++i) want[i] = before[i] - kLr * u5;
  ExpectNear(Params(), want);
  // A push in lockstep (read one step ago, one push of the other worker
  // since: less than a round) counts as fresh.
  PushRead(kWorkerA, 1, 1, g, {}, 4);
  EXPECT_EQ(shard_->stale_pushes(), 1u);
}

// ---------------------------------------------------------------------------
// Learning rates: pacerctl set-lr, then the push's, then the group's, then
// the job's.

TEST_F(ShardTest, LearningRatePrecedenceIsSetLrThenPushThenGroupThenJob) {
  momentum_ = 0.0f;  // each step is w -= lr * g: the lr can be read off
  GroupSettings head;
  head.name = "head";
  head.lr = 0.25f;
  groups_ = {kDefaultGroup, 1};  // key 1 in the default group, key 2 in "head"
  param_groups_ = {head};
  Start(wire::Mode::Bsp);
  const std::vector<float> g = {1.0f, 2.0f, 4.0f};
  std::vector<float> w = kW0;
  uint64_t seq = 0;
  // One BSP clock in which both workers push g (so the mean is g).
  auto step = [&](uint64_t clock, std::vector<wire::GroupLr> lrs, float lr_default,
                  float lr_head) {
    ++seq;
    PushLrs(kWorkerA, clock, 1, g, seq, lrs);
    PushLrs(kWorkerB, clock, 3, g, seq, lrs);
    ASSERT_EQ(shard_->applied_clock(), static_cast<int64_t>(clock));
    w[0] -= lr_default * g[0];
    w[1] -= lr_default * g[1];
    w[2] -= lr_head * g[2];
    ExpectNear(Params(), w);
  };
  // Nothing carried, nothing set: the job's lr (--lr) and the group's own.
  step(0, {}, kLr, 0.25f);
  // The push's lrs win over both.
  step(1, {{0, 0.125f}, {1, 0.0625f}}, 0.125f, 0.0625f);
  // set-lr wins over the push, for the group it names only.
  shard_->SetLrOverrides(1, {{1, 0.5f}});
  step(2, {{0, 0.125f}, {1, 0.0625f}}, 0.125f, 0.5f);
  step(3, {}, kLr, 0.5f);
  // An older version is ignored; a newer one without the group clears it.
  shard_->SetLrOverrides(1, {{1, 1.0f}});
  step(4, {}, kLr, 0.5f);
  shard_->SetLrOverrides(2, {});
  step(5, {{1, 0.0625f}}, kLr, 0.0625f);
  step(6, {}, kLr, 0.25f);
}

TEST_F(ShardTest, PushesOfOneClockThatDisagreeStepAtTheHighestSeqsLr) {
  momentum_ = 0.0f;
  Start(wire::Mode::Bsp);
  const std::vector<float> g = {1.0f, 2.0f, 4.0f};
  // A's push has the higher seq: its lr is the step's, whichever comes first.
  PushLrs(kWorkerA, 0, 1, g, 7, {{0, 0.125f}});
  PushLrs(kWorkerB, 0, 3, g, 2, {{0, 0.0625f}});
  ASSERT_EQ(shard_->applied_clock(), 0);
  std::vector<float> w = kW0;
  for (size_t i = 0; i < 3; ++i) w[i] -= 0.125f * g[i];
  ExpectNear(Params(), w);
  PushLrs(kWorkerB, 1, 3, g, 3, {{0, 0.0625f}});
  PushLrs(kWorkerA, 1, 1, g, 8, {{0, 0.125f}});
  for (size_t i = 0; i < 3; ++i) w[i] -= 0.125f * g[i];
  ExpectNear(Params(), w);
}

TEST_F(ShardTest, AspStepsAtThePushsLrTimesItsBatchShare) {
  momentum_ = 0.0f;
  Start(wire::Mode::Asp);
  const std::vector<float> g = {1.0f, 2.0f, 4.0f};
  PushLrs(kWorkerB, 0, 3, g, 1, {{0, 0.125f}});
  std::vector<float> w = kW0;
  for (size_t i = 0; i < 3; ++i) w[i] -= 0.75f * 0.125f * g[i];  // b/B = 3/4
  ExpectNear(Params(), w);
}

TEST_F(ShardTest, OptimizerStateMovesWithTheKeysAndAnIdleShardTakesTheGroups) {
  GroupSettings no_decay;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0f;
  groups_ = {kDefaultGroup, 1};
  param_groups_ = {no_decay};
  kind_ = OptimizerKind::kAdam;
  Start(wire::Mode::Bsp);
  Push(kWorkerA, 0, 1, {1.0f, 2.0f, -4.0f});
  Push(kWorkerB, 0, 3, {3.0f, -2.0f, 4.0f});
  ASSERT_EQ(shard_->applied_clock(), 0);
  flatbuffers::FlatBufferBuilder fbb;
  auto out = Send(kMonitor, fbb, wire::CreateMoveOut(fbb, 2, 3, false));
  ASSERT_EQ(out.size(), 1u);
  Decoded d = MustDecode(out[0]);
  ASSERT_EQ(d.type(), wire::Body::MoveData);
  const msg::MoveData m = msg::Read<msg::MoveData>(d);
  EXPECT_EQ(m.groups, (std::vector<uint32_t>{1}));
  EXPECT_EQ(m.key_steps, (std::vector<uint64_t>{1}));
  EXPECT_EQ(m.param_groups, param_groups_);
  EXPECT_EQ(m.optimizer, OptimizerKind::kAdam);
  EXPECT_EQ(m.state_slots, 2u);
  EXPECT_EQ(d.floats().size(), 3u) << "key 2's parameter, m and v";
  // A second shard, idle (no declaration), takes the key in.
  ShardOptions opts;
  ShardCore idle(opts, &clock_);
  ShardJob job;
  job.job_id = kJob;
  job.optimizer.kind = OptimizerKind::kAdam;
  job.optimizer.defaults = DefaultSettings(OptimizerKind::kAdam);
  idle.Configure(job, kShardId + 1);
  Envelope env = d.env;
  env.sender = kMonitor;
  flatbuffers::FlatBufferBuilder f2;
  auto vals = std::make_shared<std::vector<float>>(d.floats().begin(), d.floats().end());
  Frames in = EncodeBody(env, f2, msg::Build(f2, m),
                         Frame(vals, vals->data(), vals->size() * sizeof(float)));
  in.insert(in.begin(), PeerFrame(kMonitor));
  std::vector<ShardCore::Outgoing> replies;
  idle.Handle(std::move(in), &replies);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(MustDecode(replies[0]).type(), wire::Body::Ack);
  EXPECT_EQ(idle.table().config().groups, param_groups_);
  ASSERT_NE(idle.table().Find(2), nullptr);
  EXPECT_EQ(idle.table().Find(2)->group, 1u);
  EXPECT_EQ(idle.table().Find(2)->steps, 1u);
  EXPECT_EQ(idle.table().State(0, 2)[0], shard_->table().State(0, 2)[0]);
  EXPECT_EQ(idle.table().State(1, 2)[0], shard_->table().State(1, 2)[0]);
  EXPECT_NE(idle.table().State(1, 2)[0], 0.0f) << "v after a step";
  EXPECT_EQ(idle.Param(2)[0], shard_->Param(2)[0]);
}

}  // namespace
}  // namespace pacer

// ---------------------------------------------------------------------------
// Replication (issue 23): a primary (shard_) and one backup, with the
// records and their acknowledgements carried between them by the test.

namespace pacer {
namespace {

constexpr uint32_t kBackupId = 60;

class ReplicationTest : public ShardTest {
 protected:
  // The primary as Start makes it, a backup of the same job, and the set.
  void StartReplicated(wire::Mode mode, uint64_t epoch = 1) {
    Start(mode);
    backup_ = std::make_unique<ShardCore>(ShardOptions{}, &clock_);
    ShardJob job = job_;
    if (backup_momentum_) job.optimizer.defaults.momentum = *backup_momentum_;
    backup_->Configure(job, kBackupId);
    backup_->SetBacking({{kShardId, {epoch, ""}}});
    std::vector<ShardCore::Outgoing> out;
    shard_->SetReplicaSet(epoch, {kBackupId}, &out);
    EXPECT_TRUE(Route(std::move(out)).empty());
    ASSERT_NE(backup_->replica_table(kShardId), nullptr);
  }

  // Carries the primary's records to the backup and the acknowledgements
  // back (unless hold_acks_: then they wait in held_), and returns what is
  // left: the primary's replies to workers. drop_records_ records are lost.
  std::vector<ShardCore::Outgoing> Route(std::vector<ShardCore::Outgoing> out) {
    std::vector<ShardCore::Outgoing> rest;
    while (!out.empty()) {
      std::vector<ShardCore::Outgoing> next;
      for (ShardCore::Outgoing& o : out) {
        if (o.to_shard == 0) {
          rest.push_back(std::move(o));
          continue;
        }
        EXPECT_EQ(o.to_shard, kBackupId);
        ++records_sent_;
        if (keep_records_) records_.push_back(msg::Read<msg::Replicate>(MustDecode(o)));
        if (drop_records_ > 0) {
          --drop_records_;
          continue;
        }
        o.frames.insert(o.frames.begin(), PeerFrame(kShardId));
        std::vector<ShardCore::Outgoing> acks;
        backup_->Handle(std::move(o.frames), &acks);
        for (ShardCore::Outgoing& a : acks) {
          a.frames.insert(a.frames.begin(), Frame());  // the primary's DEALER: no routing id
          if (hold_acks_) {
            held_.push_back(std::move(a.frames));
          } else {
            shard_->Handle(std::move(a.frames), &next);
          }
        }
      }
      out = std::move(next);
    }
    return rest;
  }
  std::vector<ShardCore::Outgoing> Deliver() {
    std::vector<ShardCore::Outgoing> out;
    for (Frames& f : held_) shard_->Handle(std::move(f), &out);
    held_.clear();
    return Route(std::move(out));
  }
  std::vector<ShardCore::Outgoing> Tick() {
    std::vector<ShardCore::Outgoing> out;
    shard_->Tick(&out);
    return Route(std::move(out));
  }
  std::vector<ShardCore::Outgoing> RPush(uint32_t sender, uint64_t clock, uint32_t batch,
                                         const std::vector<float>& grads, uint64_t seq) {
    return Route(PushSeq(sender, clock, batch, grads, seq));
  }
  static uint64_t DurableOf(const ShardCore::Outgoing& o) {
    Decoded d = MustDecode(o);
    if (d.type() == wire::Body::PushReply) return d.As<wire::PushReply>()->durable_seq();
    if (d.type() == wire::Body::PullReply) return d.As<wire::PullReply>()->durable_seq();
    ADD_FAILURE() << "not a push or pull reply: " << wire::EnumNameBody(d.type());
    return 0;
  }
  // The backup's replica against the primary's table: parameters, optimizer
  // state and each key's steps, bit for bit.
  void ExpectSameAsPrimary() {
    const ParamTable* replica = backup_->replica_table(kShardId);
    ASSERT_NE(replica, nullptr);
    EXPECT_TRUE(replica->Snapshot() == shard_->table().Snapshot());
    for (const auto& [key, slot] : shard_->table().slots()) {
      ASSERT_NE(replica->Find(key), nullptr);
      EXPECT_EQ(replica->Find(key)->steps, slot.steps) << "key " << key;
    }
  }
  // Gradients that differ per clock and worker.
  static std::vector<float> Grad(uint64_t clock, uint32_t worker) {
    const float c = static_cast<float>(clock) + 1.0f, w = static_cast<float>(worker);
    return {0.1f * c - 0.01f * w, -0.2f * c + 0.03f * w, 0.05f * c * w};
  }

  std::unique_ptr<ShardCore> backup_;
  std::optional<float> backup_momentum_;  // the backup's, when not the primary's
  bool hold_acks_ = false;
  std::vector<Frames> held_;
  int drop_records_ = 0;
  uint64_t records_sent_ = 0;
  bool keep_records_ = false;  // records_: what went to the backup, decoded
  std::vector<msg::Replicate> records_;
};

TEST_F(ReplicationTest, BackupHoldsTheSameParametersStateAndMarksAfterEveryStep) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    for (wire::Mode mode : {wire::Mode::Bsp, wire::Mode::Ssp}) {
      SCOPED_TRACE(std::string(OptimizerName(kind)) + " " + wire::EnumNameMode(mode));
      kind_ = kind;
      records_sent_ = 0;
      StartReplicated(mode);
      uint64_t seq = 0;
      for (uint64_t c = 0; c < 20; ++c) {
        ++seq;
        RPush(kWorkerA, c, 1, Grad(c, kWorkerA), seq);
        RPush(kWorkerB, c, 3, Grad(c, kWorkerB), seq);
        ASSERT_EQ(shard_->applied_clock(), static_cast<int64_t>(c));
        if (mode == wire::Mode::Ssp) {
          // ssp's steps wait for more (the next test); here each goes alone.
          clock_.Advance(ShardCore::kReplicaBatchDelay);
          Tick();
        }
        ExpectSameAsPrimary();
        // A promoted replica resumes from the primary's clock and step count
        // (regression: records carried those of the step before).
        const auto replica = backup_->ReplicaSnapshot(kShardId);
        ASSERT_TRUE(replica.has_value());
        EXPECT_EQ(replica->applied_clock, shard_->applied_clock());
        EXPECT_EQ(replica->steps, shard_->steps());
      }
      // One record per applied step, after aggregation (and the seed).
      EXPECT_EQ(shard_->replication_record(), 20u);
      EXPECT_EQ(records_sent_, 21u);
      EXPECT_EQ(backup_->replica_record(kShardId), 20u);
      const std::map<uint32_t, uint64_t> marks = {{kWorkerA, 20}, {kWorkerB, 20}};
      EXPECT_EQ(backup_->replica_marks(kShardId), marks);
      EXPECT_GE(backup_->replica_checks(), 1u);
      EXPECT_EQ(backup_->replica_mismatches(), 0u);
    }
  }
}

// In ssp the steps of kReplicaBatchDelay share a record (here as the state
// they left: 5 steps' gradients take more values than the parameters and
// momentum); in bsp each step goes at once in a record of its own.
TEST_F(ReplicationTest, SspStepsWithinTheBatchDelayShareARecordBspStepsDoNot) {
  for (wire::Mode mode : {wire::Mode::Ssp, wire::Mode::Bsp}) {
    SCOPED_TRACE(wire::EnumNameMode(mode));
    StartReplicated(mode);
    keep_records_ = true;
    records_.clear();
    for (uint64_t c = 0; c < 5; ++c) {
      RPush(kWorkerA, c, 1, Grad(c, kWorkerA), c + 1);
      RPush(kWorkerB, c, 3, Grad(c, kWorkerB), c + 1);
    }
    ASSERT_EQ(shard_->applied_clock(), 4);
    if (mode == wire::Mode::Ssp) {
      EXPECT_TRUE(records_.empty());  // held for more
      clock_.Advance(ShardCore::kReplicaBatchDelay);
      Tick();
      ASSERT_EQ(records_.size(), 1u);
      ASSERT_EQ(records_[0].steps.size(), 1u);
      EXPECT_TRUE(records_[0].steps[0].assign);
    } else {
      ASSERT_EQ(records_.size(), 5u);
      for (const msg::Replicate& r : records_) {
        ASSERT_EQ(r.steps.size(), 1u);
        EXPECT_FALSE(r.steps[0].assign);
      }
    }
    ExpectSameAsPrimary();
    const auto replica = backup_->ReplicaSnapshot(kShardId);
    ASSERT_TRUE(replica.has_value());
    EXPECT_EQ(replica->applied_clock, 4);
    EXPECT_EQ(replica->steps, 5u);
    const std::map<uint32_t, uint64_t> marks = {{kWorkerA, 5}, {kWorkerB, 5}};
    EXPECT_EQ(backup_->replica_marks(kShardId), marks);
  }
}

TEST_F(ReplicationTest, AspGroupsPushesIntoBatchedRecords) {
  kind_ = OptimizerKind::kAdam;
  StartReplicated(wire::Mode::Asp);
  records_sent_ = 0;
  for (uint64_t i = 1; i <= 5; ++i) RPush(kWorkerA, i - 1, 1, Grad(i, kWorkerA), i);
  EXPECT_EQ(records_sent_, 0u);  // held for more
  clock_.Advance(ShardCore::kReplicaBatchDelay);
  Tick();
  EXPECT_EQ(records_sent_, 1u);
  ExpectSameAsPrimary();
  for (uint64_t i = 6; i < 6 + ShardCore::kReplicaBatchSteps; ++i) {
    RPush(kWorkerB, i, 3, Grad(i, kWorkerB), i);
  }
  EXPECT_EQ(records_sent_, 2u);  // a full batch goes at once
  ExpectSameAsPrimary();
  EXPECT_EQ(backup_->replica_marks(kShardId).at(kWorkerB), 5 + ShardCore::kReplicaBatchSteps);
}

// A step of a fraction of the global batch goes to the backup with its
// fraction (SGD's momentum takes it): clocks of 1 sample in 4, in bsp and
// asp, leave the replica the primary's, bit for bit.
TEST_F(ReplicationTest, AShortStepsFractionReachesTheBackup) {
  for (wire::Mode mode : {wire::Mode::Bsp, wire::Mode::Asp}) {
    SCOPED_TRACE(wire::EnumNameMode(mode));
    kind_ = OptimizerKind::kSgd;
    StartReplicated(mode);
    keep_records_ = true;
    records_.clear();
    uint64_t seq = 0;
    for (uint64_t c = 0; c < 6; ++c) {
      ++seq;
      RPush(kWorkerA, c, 1, Grad(c, kWorkerA), seq);
      if (mode == wire::Mode::Bsp) RPush(kWorkerB, c, 0, Grad(c, kWorkerB), seq);
      // asp: a record per push, so that it goes as the gradient and its
      // fraction, not as the state it left.
      clock_.Advance(ShardCore::kReplicaBatchDelay);
      Tick();
      ExpectSameAsPrimary();
    }
    size_t steps = 0;
    for (const msg::Replicate& r : records_) {
      for (const msg::ReplicaStep& st : r.steps) {
        EXPECT_FALSE(st.assign);
        EXPECT_FLOAT_EQ(st.fraction, 0.25f);
        ++steps;
      }
    }
    EXPECT_EQ(steps, 6u);
  }
}

// A batch whose gradients would take more values than the state they
// change (the parameters and each state slot: Adam's 3 x 3 floats here)
// goes as that state, which the backup takes as it is; a smaller batch goes
// as its gradients. Either way the replica is the primary's, bit for bit.
TEST_F(ReplicationTest, AspRecordsCarryTheStateOnceTheGradientsWouldTakeMore) {
  kind_ = OptimizerKind::kAdam;
  StartReplicated(wire::Mode::Asp);
  keep_records_ = true;
  uint64_t seq = 0;
  const auto batch = [&](size_t pushes, const std::vector<wire::KeyLen>& keys) {
    for (size_t i = 0; i < pushes; ++i) {
      ++seq;
      std::vector<float> g = Grad(seq, kWorkerA);
      if (keys.size() == 1) g.resize(keys[0].length());
      Route(PushPart(kWorkerA, seq - 1, 1, seq, 0, 1, keys, g));
    }
    clock_.Advance(ShardCore::kReplicaBatchDelay);
    Tick();
    ExpectSameAsPrimary();
  };
  batch(3, kKeys);  // 9 gradient values: not more than the state
  ASSERT_EQ(records_.size(), 1u);
  EXPECT_EQ(records_[0].steps.size(), 3u);
  for (const msg::ReplicaStep& s : records_[0].steps) EXPECT_FALSE(s.assign);
  batch(5, kKeys);  // 15: the state of every key instead
  ASSERT_EQ(records_.size(), 2u);
  ASSERT_EQ(records_[1].steps.size(), 1u);
  const msg::ReplicaStep& all = records_[1].steps[0];
  EXPECT_TRUE(all.assign);
  EXPECT_TRUE(all.keys.empty());
  EXPECT_EQ(all.values, 9u);
  EXPECT_EQ(all.key_steps, (std::vector<uint64_t>{8, 8}));
  const std::vector<wire::KeyLen> second = {{2, 1}};
  batch(10, second);  // 10 values of key 2: the state of key 2 alone
  ASSERT_EQ(records_.size(), 3u);
  ASSERT_EQ(records_[2].steps.size(), 1u);
  const msg::ReplicaStep& some = records_[2].steps[0];
  EXPECT_TRUE(some.assign);
  ASSERT_EQ(some.keys.size(), 1u);
  EXPECT_EQ(some.keys[0].key(), 2u);
  EXPECT_EQ(some.values, 3u);
  EXPECT_EQ(some.key_steps, (std::vector<uint64_t>{18}));
  EXPECT_EQ(backup_->replica_marks(kShardId).at(kWorkerA), seq);
  EXPECT_EQ(backup_->replica_mismatches(), 0u);
}

// A record that sets state with step counts that do not match its keys
// changes nothing: refused with the reason, and the replica is dropped to
// be seeded afresh, as for any record out of step.
TEST_F(ReplicationTest, AStateRecordThatDoesNotAddUpIsRefused) {
  kind_ = OptimizerKind::kAdam;
  StartReplicated(wire::Mode::Asp);
  msg::Replicate rec;
  rec.range = kShardId;
  rec.epoch = 1;
  rec.record = 1;
  msg::ReplicaStep step;
  step.assign = true;
  step.values = 9;
  step.key_steps = {1};  // two keys
  rec.steps = {step};
  Envelope env;
  env.job_id = kJob;
  env.sender = kShardId;
  env.request_id = 77;
  const std::vector<float> state(9, 5.0f);
  Frames frames = EncodeMessage(env, rec, Floats(state));
  frames.insert(frames.begin(), PeerFrame(kShardId));
  std::vector<ShardCore::Outgoing> out;
  backup_->Handle(std::move(frames), &out);
  ASSERT_EQ(out.size(), 1u);
  Decoded d = MustDecode(out[0]);
  ASSERT_EQ(d.type(), wire::Body::Error);
  EXPECT_NE(d.As<wire::Error>()->reason()->str().find("2 keys with 1 step counts"),
            std::string::npos)
      << d.As<wire::Error>()->reason()->str();
  EXPECT_EQ(backup_->replica_table(kShardId), nullptr);  // to be seeded afresh
}

TEST_F(ReplicationTest, AspRecordBuffersAreUsedAgainOnlyOnceLetGo) {
  StartReplicated(wire::Mode::Asp);
  // A record still on its way (its frames held here, as ZeroMQ holds them
  // until sent) while the next batch is built: the next must not write
  // into its buffer.
  std::vector<ShardCore::Outgoing> first, second;
  for (uint64_t i = 1; i <= 3; ++i) {
    auto o = PushSeq(kWorkerA, i - 1, 1, Grad(i, kWorkerA), i);
    first.insert(first.end(), std::make_move_iterator(o.begin()), std::make_move_iterator(o.end()));
  }
  clock_.Advance(ShardCore::kReplicaBatchDelay);
  shard_->Tick(&first);
  for (uint64_t i = 4; i <= 6; ++i) {
    auto o = PushSeq(kWorkerB, i - 1, 3, Grad(i * 7, kWorkerB), i);
    second.insert(second.end(), std::make_move_iterator(o.begin()),
                  std::make_move_iterator(o.end()));
  }
  clock_.Advance(ShardCore::kReplicaBatchDelay);
  shard_->Tick(&second);
  Route(std::move(first));
  Route(std::move(second));
  ExpectSameAsPrimary();
  EXPECT_EQ(backup_->replica_record(kShardId), 2u);
  // Records whose frames were let go: their buffers serve the next ones.
  for (uint64_t i = 7; i <= 30; ++i) {
    RPush(kWorkerA, i - 1, 1, Grad(i * 3, kWorkerA), i);
    if (i % 3 == 0) {
      clock_.Advance(ShardCore::kReplicaBatchDelay);
      Tick();
      ExpectSameAsPrimary();
    }
  }
  EXPECT_EQ(backup_->replica_mismatches(), 0u);
}

// pacer_shard_replication_bytes_total counts the payload each backup is
// sent: the seed (the range's parameters and momentum), then each record's
// gradient (bsp: the step's 3 floats).
TEST_F(ReplicationTest, BytesReplicatedAreCountedBySeedAndRecord) {
  StartReplicated(wire::Mode::Bsp);
  const auto bytes = [&](const char* kind) {
    return ReadMetric(shard_->registry(), "pacer_shard_replication_bytes_total", {{"kind", kind}});
  };
  EXPECT_EQ(bytes("seed"), 3 * 2 * sizeof(float));
  EXPECT_EQ(bytes("record"), 0);
  for (uint64_t c = 0; c < 4; ++c) {
    RPush(kWorkerA, c, 1, Grad(c, kWorkerA), c + 1);
    RPush(kWorkerB, c, 3, Grad(c, kWorkerB), c + 1);
  }
  EXPECT_EQ(shard_->replication_record(), 4u);
  EXPECT_EQ(bytes("record"), 4 * 3 * sizeof(float));
  EXPECT_EQ(bytes("seed"), 3 * 2 * sizeof(float));
}

TEST_F(ReplicationTest, APushIsDurableOnceTheBackupAcknowledgedTheStepThatHoldsIt) {
  StartReplicated(wire::Mode::Bsp);
  hold_acks_ = true;
  auto out = RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  EXPECT_EQ(DurableOf(out.at(0)), 0u);
  out = RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);  // closes clock 0: the record goes out
  EXPECT_EQ(DurableOf(out.at(0)), 0u);
  out = Route(Pull(kWorkerA, 1));
  EXPECT_EQ(DurableOf(out.at(0)), 0u);  // received and applied, not yet durable
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 0u);
  Deliver();  // the backup's acknowledgement
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u);
  EXPECT_EQ(shard_->durable_seq(kWorkerB), 1u);
  out = Route(Pull(kWorkerB, 1));
  EXPECT_EQ(DurableOf(out.at(0)), 1u);
  out = RPush(kWorkerA, 1, 1, Grad(1, kWorkerA), 2);
  EXPECT_EQ(DurableOf(out.at(0)), 1u);  // through seq 1; seq 2 waits for its step
}

TEST_F(ReplicationTest, WithNoBackupEveryAppliedPushCountsAsDurable) {
  Start(wire::Mode::Bsp);
  PushSeq(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 0u);  // received, not applied
  PushSeq(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u);
}

TEST_F(ReplicationTest, ALostRecordIsFollowedByASeedAndTheReplicaCatchesUp) {
  kind_ = OptimizerKind::kAdam;
  StartReplicated(wire::Mode::Bsp);
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  drop_records_ = 1;
  RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);  // record 1 is lost
  EXPECT_EQ(backup_->replica_record(kShardId), 0u);
  RPush(kWorkerA, 1, 1, Grad(1, kWorkerA), 2);
  RPush(kWorkerB, 1, 3, Grad(1, kWorkerB), 2);  // record 2: the backup asks for a seed
  EXPECT_EQ(backup_->replica_record(kShardId), 0u);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 0u);  // nothing durable past the gap
  Tick();                                         // the seed
  EXPECT_EQ(backup_->replica_record(kShardId), 2u);
  ExpectSameAsPrimary();
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 2u);
}

TEST_F(ReplicationTest, RecordsOfALowerEpochOrOfARangeNotBackedUpAreRefused) {
  StartReplicated(wire::Mode::Bsp, /*epoch=*/1);
  backup_->SetBacking({{kShardId, {2, ""}}});  // the monitor moved the range on
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);
  EXPECT_EQ(backup_->replica_record(kShardId), 0u);
  EXPECT_EQ(backup_->rejected(wire::ErrorCode::Stale), 1.0);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 0u);
  backup_->SetBacking({});
  EXPECT_EQ(backup_->replica_table(kShardId), nullptr);  // dropped with the range
  clock_.Advance(std::chrono::seconds(1));
  Tick();  // the primary seeds again: refused, the range is not this shard's to back up
  EXPECT_EQ(backup_->replica_table(kShardId), nullptr);
  EXPECT_EQ(backup_->rejected(wire::ErrorCode::NotReady), 1.0);
}

// A shard restored from a snapshot (a checkpoint, or a promoted replica)
// seeds a new backup with its dedup state, so that a push retried after
// the next failover is not applied twice there.
TEST_F(ReplicationTest, ARestoredShardSeedsItsBackupWithItsDedupMarks) {
  Start(wire::Mode::Bsp);
  for (uint64_t c = 0; c < 2; ++c) {
    PushSeq(kWorkerA, c, 1, Grad(c, kWorkerA), c + 1);
    PushSeq(kWorkerB, c, 3, Grad(c, kWorkerB), c + 1);
  }
  const ShardSnapshot snap = shard_->Snapshot();
  shard_ = std::make_unique<ShardCore>(ShardOptions{}, &clock_);
  shard_->Configure(job_, kShardId);
  ASSERT_TRUE(shard_->Restore(snap).ok());
  backup_ = std::make_unique<ShardCore>(ShardOptions{}, &clock_);
  backup_->Configure(job_, kBackupId);
  backup_->SetBacking({{kShardId, {1, ""}}});
  std::vector<ShardCore::Outgoing> out;
  shard_->SetReplicaSet(1, {kBackupId}, &out);
  Route(std::move(out));
  const std::map<uint32_t, uint64_t> marks = {{kWorkerA, 2}, {kWorkerB, 2}};
  EXPECT_EQ(backup_->replica_marks(kShardId), marks);
  ExpectSameAsPrimary();
}

TEST_F(ReplicationTest, AReplicaThatDivergesIsReportedByTheBlockCheck) {
  // A backup whose job has another momentum (a misconfiguration) applies
  // the same records to other effect: the CRC of the checked block differs.
  backup_momentum_ = 0.5f;
  StartReplicated(wire::Mode::Bsp);
  for (uint64_t c = 0; c < ShardCore::kReplicaCheckEvery; ++c) {
    RPush(kWorkerA, c, 1, Grad(c, kWorkerA), c + 1);
    RPush(kWorkerB, c, 3, Grad(c, kWorkerB), c + 1);
  }
  EXPECT_EQ(backup_->replica_checks(), 1u);
  EXPECT_EQ(backup_->replica_mismatches(), 1u);
}

// The ledger (every (worker, seq) applied) travels in records and seeds,
// and a core restored from the replica (a promotion) starts with it.
TEST_F(ReplicationTest, TheLedgerReachesTheBackupAndAPromotedCore) {
  StartReplicated(wire::Mode::Bsp);
  for (uint64_t c = 0; c < 3; ++c) {
    RPush(kWorkerA, c, 1, Grad(c, kWorkerA), c + 1);
    RPush(kWorkerB, c, 3, Grad(c, kWorkerB), c + 1);
  }
  EXPECT_EQ(shard_->ledger().size(), 6u);
  auto views = backup_->replica_views();
  ASSERT_EQ(views.count(kShardId), 1u);
  EXPECT_EQ(views[kShardId].ledger->Spans(), shard_->ledger().Spans());
  EXPECT_EQ(views[kShardId].crc, shard_->state_crc());
  EXPECT_FALSE(views[kShardId].last);
  // A lost record: the seed that follows carries the whole ledger.
  drop_records_ = 1;
  RPush(kWorkerA, 3, 1, Grad(3, kWorkerA), 4);
  RPush(kWorkerB, 3, 3, Grad(3, kWorkerB), 4);
  RPush(kWorkerA, 4, 1, Grad(4, kWorkerA), 5);
  RPush(kWorkerB, 4, 3, Grad(4, kWorkerB), 5);
  Tick();
  views = backup_->replica_views();
  EXPECT_EQ(views[kShardId].ledger->Spans(), shard_->ledger().Spans());
  EXPECT_EQ(views[kShardId].ledger->size(), 10u);
  // The primary leaves: its last record marks the replica final.
  std::vector<ShardCore::Outgoing> out;
  shard_->Leave(&out);
  Route(std::move(out));
  EXPECT_TRUE(backup_->replicas_final());
  EXPECT_EQ(backup_->replica_views()[kShardId].record, shard_->replication_record());
  // Promoted: a core restored from the replica holds the same ledger.
  auto snap = backup_->ReplicaSnapshot(kShardId);
  ASSERT_TRUE(snap.has_value());
  ShardCore promoted(ShardOptions{}, &clock_);
  promoted.Configure(job_, kShardId);
  ASSERT_TRUE(promoted.Restore(*snap).ok());
  EXPECT_EQ(promoted.ledger().Spans(), shard_->ledger().Spans());
  EXPECT_EQ(promoted.state_crc(), shard_->state_crc());
}

// With dedup off, a retried push is applied again: the ledger counts it,
// on the primary and (through the record) on the backup.
TEST_F(ReplicationTest, APushAppliedTwiceIsCountedInTheLedger) {
  options_.safeguards.SwitchOff(Safeguard::kDedup);
  StartReplicated(wire::Mode::Asp);
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);  // the same (worker, seq) again
  Tick();
  clock_.Advance(ShardCore::kReplicaBatchDelay);
  Tick();
  EXPECT_EQ(shard_->ledger().doubles(), 1u);
  EXPECT_EQ(backup_->replica_views()[kShardId].ledger->doubles(), 1u);
}

TEST_F(ReplicationTest, WithDurableWaitOffAPushIsCalledDurableBeforeTheBackupHoldsIt) {
  options_.safeguards.SwitchOff(Safeguard::kDurableWait);
  StartReplicated(wire::Mode::Bsp);
  hold_acks_ = true;  // the backup's acknowledgements never come
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u);
  EXPECT_EQ(shard_->durable_record(), 0u);
}

// Fencing: a primary with backups past its shard lease (the server calls
// SetFenced) answers pushes and pulls NotReady, so that nothing is
// acknowledged while a backup may be promoted; a leaving one (Leave)
// refuses pushes after its last record.
TEST_F(ReplicationTest, AFencedOrLeavingPrimaryAcknowledgesNoPush) {
  StartReplicated(wire::Mode::Asp);
  shard_->SetFenced(true);
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), wire::ErrorCode::NotReady);
  EXPECT_EQ(ErrorOf(Route(Pull(kWorkerA, 0))), wire::ErrorCode::NotReady);
  EXPECT_EQ(shard_->ledger().size(), 0u);
  shard_->SetFenced(false);
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), std::nullopt);
  EXPECT_EQ(shard_->ledger().size(), 1u);
  std::vector<ShardCore::Outgoing> out;
  shard_->Leave(&out);
  Route(std::move(out));
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 1, 1, Grad(1, kWorkerA), 2)), wire::ErrorCode::NotReady);
  EXPECT_EQ(shard_->ledger().size(), 1u);
  EXPECT_TRUE(backup_->replicas_final());
}

// A core awaiting the monitor's word on its range (ShardServer sets it for
// a shard restored from its checkpoint, until its first heartbeat reply is
// in effect): NotReady meanwhile, with or without backups, since the
// monitor may have promoted a backup because this process restarted.
TEST_F(ReplicationTest, ACoreAwaitingTheMonitorAcknowledgesNothing) {
  StartReplicated(wire::Mode::Asp);
  std::vector<ShardCore::Outgoing> out;
  shard_->SetReplicaSet(0, {}, &out);  // no backups (as before the first reply)
  Route(std::move(out));
  shard_->SetAwaitingMonitor(true);
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), wire::ErrorCode::NotReady);
  EXPECT_EQ(ErrorOf(Route(Pull(kWorkerA, 0))), wire::ErrorCode::NotReady);
  EXPECT_EQ(shard_->ledger().size(), 0u);
  shard_->SetAwaitingMonitor(false);
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), std::nullopt);
  EXPECT_EQ(shard_->ledger().size(), 1u);
}

// Durability held (a dropped backup stands by): records still go out and
// are acknowledged, but no push becomes durable until the hold is let go.
TEST_F(ReplicationTest, ADurableHoldKeepsDurabilityWhereItIs) {
  StartReplicated(wire::Mode::Bsp);
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1);
  ASSERT_EQ(shard_->durable_seq(kWorkerA), 1u);
  shard_->SetDurableHold(true);
  RPush(kWorkerA, 1, 1, Grad(1, kWorkerA), 2);
  auto out = RPush(kWorkerB, 1, 3, Grad(1, kWorkerB), 2);  // closes clock 1: a record, acknowledged
  EXPECT_EQ(backup_->replica_record(kShardId), shard_->replication_record());
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u);
  EXPECT_EQ(shard_->durable_seq(kWorkerB), 1u);
  EXPECT_EQ(DurableOf(Route(Pull(kWorkerA, 2)).at(0)), 1u);
  shard_->SetDurableHold(false);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 2u);
  EXPECT_EQ(shard_->durable_seq(kWorkerB), 2u);
}

// A drain the monitor gave up (CancelLeave): the primary applies pushes
// again, its records go on after the last one, and the backup follows.
TEST_F(ReplicationTest, ALeaveCancelledAppliesAgainAndTheBackupFollows) {
  StartReplicated(wire::Mode::Bsp);
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  std::vector<ShardCore::Outgoing> out;
  shard_->Leave(&out);
  Route(std::move(out));
  ASSERT_TRUE(backup_->replicas_final());
  EXPECT_EQ(ErrorOf(RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1)), wire::ErrorCode::NotReady);
  out.clear();
  shard_->CancelLeave(&out);
  EXPECT_FALSE(shard_->leaving());
  Route(std::move(out));
  EXPECT_EQ(ErrorOf(RPush(kWorkerB, 0, 3, Grad(0, kWorkerB), 1)), std::nullopt);
  EXPECT_EQ(shard_->applied_clock(), 0);  // clock 0 closed with both pushes
  EXPECT_FALSE(backup_->replicas_final());
  EXPECT_EQ(backup_->replica_record(kShardId), shard_->replication_record());
  ExpectSameAsPrimary();
  // A later Leave (the process stops) still sends a last record.
  out.clear();
  shard_->Leave(&out);
  Route(std::move(out));
  EXPECT_TRUE(backup_->replicas_final());
}

// Epochs: a push or pull that names an older epoch of the range than the
// shard's (its worker's map predates a failover or a key move) is refused
// NotOwner and applies nothing; the same epoch, a later one (the shard not
// told of it yet) or none (0) is served, and the replies say the shard's.
TEST_F(ReplicationTest, RefusesAnOlderEpochAndRepliesWithItsOwn) {
  StartReplicated(wire::Mode::Asp, /*epoch=*/5);
  const auto epoch_of = [](const std::vector<ShardCore::Outgoing>& out) -> uint64_t {
    if (out.size() != 1) return 0;
    Decoded d = MustDecode(out[0]);
    if (d.type() == wire::Body::PushReply) return d.As<wire::PushReply>()->epoch();
    if (d.type() == wire::Body::PullReply) return d.As<wire::PullReply>()->epoch();
    return 0;
  };
  epoch_ = 4;
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), wire::ErrorCode::NotOwner);
  EXPECT_EQ(ErrorOf(Route(Pull(kWorkerA, 0, kKeys, /*latest=*/true))), wire::ErrorCode::NotOwner);
  EXPECT_EQ(shard_->ledger().size(), 0u);
  EXPECT_EQ(shard_->updates_applied(), 0u);
  for (uint64_t e : {5, 6, 0}) {
    epoch_ = e;
    const uint64_t seq = shard_->ledger().size() + 1;
    auto out = RPush(kWorkerA, seq - 1, 1, Grad(0, kWorkerA), seq);
    EXPECT_EQ(ErrorOf(out), std::nullopt) << "epoch " << e;
    EXPECT_EQ(epoch_of(out), 5u) << "epoch " << e;
    EXPECT_EQ(epoch_of(Route(Pull(kWorkerA, 0, kKeys, /*latest=*/true))), 5u) << "epoch " << e;
  }
  EXPECT_EQ(shard_->ledger().size(), 3u);
}

// A primary cut off from the monitor while its range failed over hears,
// once it is back, that another shard serves the range (Depose): from then
// on it answers no push or pull of it, whatever epoch they name, so that a
// worker whose map is older than the failover is neither acknowledged nor
// told its pushes are durable here (found by deploy/chaos/replica-partition:
// without it, its set of backups empty, it called them durable at once).
TEST_F(ReplicationTest, ADeposedPrimaryAnswersNothingOfItsRange) {
  StartReplicated(wire::Mode::Asp, /*epoch=*/1);
  epoch_ = 1;
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), std::nullopt);
  shard_->Depose(4);
  std::vector<ShardCore::Outgoing> out;
  shard_->SetReplicaSet(0, {}, &out);  // as the server does
  EXPECT_TRUE(out.empty());
  for (uint64_t e : {1, 4, 0}) {
    epoch_ = e;
    EXPECT_EQ(ErrorOf(RPush(kWorkerA, 1, 1, Grad(1, kWorkerA), 2)), wire::ErrorCode::NotOwner)
        << "epoch " << e;
    EXPECT_EQ(ErrorOf(Route(Pull(kWorkerA, 1))), wire::ErrorCode::NotOwner) << "epoch " << e;
  }
  EXPECT_EQ(shard_->ledger().size(), 1u);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u) << "seq 2 must not be called durable";
}

// The serving state (ServingState) moves as the server says, one state at
// a time: awaiting the monitor and back, leaving and back (a drain given
// up), deposed and back (the range given back); a deposed core answers
// nothing of its range and closes no clock, not even when the live set
// shrinks to the workers that pushed.
TEST_F(ReplicationTest, TheServingStateMovesOneStateAtATime) {
  StartReplicated(wire::Mode::Bsp);
  EXPECT_EQ(shard_->serving(), ServingState::kServing);
  shard_->SetAwaitingMonitor(true);
  EXPECT_EQ(shard_->serving(), ServingState::kAwaitingMonitor);
  shard_->SetAwaitingMonitor(false);
  EXPECT_EQ(shard_->serving(), ServingState::kServing);
  std::vector<ShardCore::Outgoing> out;
  shard_->Leave(&out);
  Route(std::move(out));
  EXPECT_EQ(shard_->serving(), ServingState::kLeaving);
  EXPECT_TRUE(shard_->leaving());
  shard_->SetAwaitingMonitor(true);  // only a serving core awaits the monitor
  EXPECT_EQ(shard_->serving(), ServingState::kLeaving);
  out.clear();
  shard_->CancelLeave(&out);
  Route(std::move(out));
  EXPECT_EQ(shard_->serving(), ServingState::kServing);
  EXPECT_EQ(ErrorOf(RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1)), std::nullopt);
  shard_->Depose(3);
  EXPECT_EQ(shard_->serving(), ServingState::kDeposed);
  EXPECT_EQ(shard_->deposed_epoch(), 3u);
  out.clear();
  shard_->Leave(&out);  // a deposed core has nothing to leave
  EXPECT_EQ(shard_->serving(), ServingState::kDeposed);
  ExpectAck(Membership(2, {{kWorkerA, 0, 1}}));  // B leaves: A's push alone would close clock 0
  EXPECT_EQ(shard_->applied_clock(), -1);
  shard_->Depose(0);  // given back
  EXPECT_EQ(shard_->serving(), ServingState::kServing);
  EXPECT_EQ(shard_->deposed_epoch(), 0u);
}

// A backup that owes an acknowledgement for longer than kBackupLagLimit
// falls behind: the primary names it (lagging_backups, reported to the
// monitor) and the lag in seconds shows; once it acknowledges, it is not.
TEST_F(ReplicationTest, ABackupThatOwesAnAckTooLongIsReportedLagging) {
  StartReplicated(wire::Mode::Asp);
  hold_acks_ = true;
  RPush(kWorkerA, 0, 1, Grad(0, kWorkerA), 1);
  clock_.Advance(ShardCore::kReplicaBatchDelay);
  Tick();  // the batch goes out as a record; its acknowledgement is held
  ASSERT_EQ(shard_->replication_record(), 1u);
  clock_.Advance(ShardCore::kBackupLagLimit - std::chrono::milliseconds(100));
  EXPECT_TRUE(shard_->lagging_backups().empty());
  clock_.Advance(std::chrono::milliseconds(200));
  EXPECT_EQ(shard_->lagging_backups(), (std::vector<uint32_t>{kBackupId}));
  EXPECT_GT(shard_->replication_lag_seconds(), ToSeconds(ShardCore::kBackupLagLimit));
  hold_acks_ = false;
  Deliver();
  EXPECT_TRUE(shard_->lagging_backups().empty());
  EXPECT_EQ(shard_->replication_lag_seconds(), 0.0);
  EXPECT_EQ(shard_->durable_seq(kWorkerA), 1u);
}

TEST(AppliedLedgerTest, KeepsSpansCountsDoublesAndReadsSpansBack) {
  AppliedLedger l;
  for (uint64_t s : {1, 2, 3, 5, 7, 6, 9}) EXPECT_TRUE(l.Add(4, s));
  EXPECT_TRUE(l.Add(2, 1));
  EXPECT_FALSE(l.Add(4, 2));
  EXPECT_FALSE(l.Add(4, 7));
  EXPECT_TRUE(l.Add(4, 0));  // no seq: not recorded
  EXPECT_EQ(l.doubles(), 2u);
  EXPECT_EQ(l.size(), 8u);
  EXPECT_TRUE(l.Contains(4, 6));
  EXPECT_FALSE(l.Contains(4, 4));
  EXPECT_FALSE(l.Contains(4, 8));
  EXPECT_FALSE(l.Contains(3, 1));
  EXPECT_EQ(l.Text(), "worker 2: 1\nworker 4: 1-3 5-7 9\n");
  const std::vector<SeqSpan> want = {{2, 1, 1}, {4, 1, 3}, {4, 5, 7}, {4, 9, 9}};
  EXPECT_EQ(l.Spans(), want);
  EXPECT_TRUE(l.Add(4, 4));  // joins 1-3 and 5-7
  EXPECT_EQ(l.Spans().size(), 3u);
  // Spans from a peer: overlapping, touching, out of order, empty, and one
  // so long that walking it seq by seq would never end.
  AppliedLedger m;
  m.Assign({{1, 5, 9}, {1, 1, 4}, {1, 8, 12}, {1, 0, 3}, {1, 9, 2}, {2, 1, UINT64_MAX}}, 3);
  const std::vector<SeqSpan> merged = {{1, 1, 12}, {2, 1, UINT64_MAX}};
  EXPECT_EQ(m.Spans(), merged);
  EXPECT_EQ(m.doubles(), 3u);
  EXPECT_TRUE(m.Contains(2, uint64_t{1} << 62));
}

}  // namespace
}  // namespace pacer
