// The optimizer menu through the whole stack: a 2-shard BSP job of real
// processes (pacer-monitor --optimizer ..., two pacer-server) and a test
// client registered as the one worker. The client declares the golden
// runs' model (tests/optimizer/golden: a weight and a bias, each one key,
// so each shard holds one), pushes the recorded gradients, pulls after
// every step, and compares every 10 steps with the parameters torch 1.13
// produced for the same gradients (to 1e-5). Nothing in Pacer computes the
// expected values.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <thread>

#include "ps/base/messages.h"
#include "ps/base/rpc.h"
#include "ps/client.h"
#include "tests/cluster_harness.h"
#include "tests/optimizer_golden.h"
#include "tests/process_util.h"

namespace pacer {
namespace {

std::string Exact(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// pacer-monitor's flags for the run's default group (group 0).
std::vector<std::string> OptimizerFlags(const GoldenRun& run) {
  const OptimizerSettings s = run.Config().defaults;
  std::vector<std::string> f = {"--optimizer",    std::string(OptimizerName(run.kind)),
                                "--lr",           Exact(s.lr),
                                "--weight-decay", Exact(s.weight_decay)};
  switch (run.kind) {
    case OptimizerKind::kSgd:
      f.insert(f.end(), {"--momentum", Exact(s.momentum), "--dampening", Exact(s.dampening)});
      if (s.nesterov) f.push_back("--nesterov");
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      f.insert(f.end(),
               {"--beta1", Exact(s.beta1), "--beta2", Exact(s.beta2), "--eps", Exact(s.eps)});
      if (s.amsgrad) f.push_back("--amsgrad");
      break;
    case OptimizerKind::kAdagrad:
      f.insert(f.end(), {"--lr-decay", Exact(s.lr_decay), "--initial-accumulator-value",
                         Exact(s.initial_accumulator_value), "--eps", Exact(s.eps)});
      break;
  }
  return f;
}

// The one worker of the job, driven by the test.
struct GoldenWorker {
  std::unique_ptr<Transport> transport = MakeZmqTransport(TransportOptions{});
  std::unique_ptr<RpcChannel> monitor;
  std::unique_ptr<PsClient> client;

  TimePoint Deadline(double s) const { return transport->clock()->Now() + FromSeconds(s); }

  // Registers, declares the run's model (a key per tensor, with its name
  // and group; the run's groups 1.. named as GoldenRun::Config names them),
  // waits for the shard map, and initialises the shards with run.init.
  absl::Status Start(const std::string& address, const GoldenRun& run) {
    RpcOptions boot;
    boot.check_job = false;
    auto ch = RpcChannel::Connect(transport.get(), address, boot);
    if (!ch.ok()) return ch.status();
    monitor = std::move(*ch);
    msg::Register hello;
    hello.role = wire::Role::Worker;
    hello.address = "golden-worker";
    auto reg = monitor->Call(hello, Deadline(10));
    if (!reg.ok()) return reg.status();
    const msg::RegisterReply r = msg::Read<msg::RegisterReply>(*reg);
    monitor->options().job_id = reg->env.job_id;
    monitor->options().sender = r.id;
    monitor->options().check_job = true;
    msg::DeclareModel declare;
    const TableConfig config = run.Config();
    declare.param_groups = config.groups;
    for (size_t i = 0; i < run.tensors.size(); ++i) {
      declare.keys.emplace_back(i, run.tensors[i].size);
      declare.names.push_back(run.tensors[i].name);
      declare.groups.push_back(run.tensors[i].group);
    }
    auto declared = monitor->Call(declare, Deadline(10));
    if (!declared.ok()) return declared.status();
    ShardMapInfo map;
    for (int i = 0; i < 500 && map.shards.empty(); ++i) {
      msg::Heartbeat hb;
      auto reply = monitor->Call(hb, Deadline(2));
      if (reply.ok() && reply->type() == wire::Body::HeartbeatReply) {
        const msg::HeartbeatReply h = msg::Read<msg::HeartbeatReply>(*reply);
        if (h.shard_map) map = ShardMapFromWire(*h.shard_map);
      }
      if (map.shards.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (map.shards.size() != 2) return absl::UnavailableError("no shard map with 2 shards");
    ClientOptions copts;
    copts.rpc.job_id = reg->env.job_id;
    copts.rpc.sender = r.id;
    copts.request_timeout = std::chrono::seconds(30);
    copts.resend_after = std::chrono::milliseconds(500);
    auto c = PsClient::Create(transport.get(), copts, map, declare.keys);
    if (!c.ok()) return c.status();
    client = std::move(*c);
    std::copy(run.init.begin(), run.init.end(), client->params().begin());
    return client->Init();
  }
};

// Runs `name` through a 2-shard BSP job; `carry_lrs`: every push carries the
// step's lr per group (the worker's scheduler) instead of the shards using
// the groups' declared lrs.
void RunThroughTheStack(const std::string& name, bool carry_lrs) {
  auto run = ReadGolden(name);
  ASSERT_TRUE(run.ok()) << run.status();
  test::ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 0;
  spec.embedded_workers = 1;
  // The golden worker is a raw client with no training set: partitions.
  spec.monitor_flags = {"--mode",  "bsp", "--policy",    "fixed", "--global-batch",
                        "8",       "--lease", "600",     "--log-level", "warn",
                        "--data-partitions", "1"};
  for (const std::string& f : OptimizerFlags(*run)) spec.monitor_flags.push_back(f);
  spec.shard_flags = {"--log-level", "warn"};
  test::Cluster cluster(spec);
  ASSERT_TRUE(cluster.Start());
  GoldenWorker w;
  absl::Status started = w.Start(cluster.monitor_address, *run);
  ASSERT_TRUE(started.ok()) << started << "\n" << cluster.Logs();
  size_t shards_with_keys = 0;
  for (const Slice& s : w.client->slices()) shards_with_keys += s.num_keys > 0;
  EXPECT_EQ(shards_with_keys, 2u) << "each shard holds one tensor";
  int compared = 0, bad = 0;
  for (size_t t = 0; t < run->steps.size(); ++t) {
    const GoldenRun::Step& step = run->steps[t];
    std::copy(step.grad.begin(), step.grad.end(), w.client->grads().begin());
    if (carry_lrs) {
      std::vector<wire::GroupLr> lrs;
      for (size_t g = 0; g < step.lr.size(); ++g) lrs.emplace_back(g, step.lr[g]);
      w.client->SetLearningRates(lrs);
    }
    // Batch 8: the shard's mean (8 g / 8) is g exactly.
    absl::Status pushed = w.client->Push(t, 8);
    ASSERT_TRUE(pushed.ok()) << "step " << t + 1 << ": " << pushed << "\n" << cluster.Logs();
    auto pulled = w.client->Pull(t + 1);
    ASSERT_TRUE(pulled.ok()) << "step " << t + 1 << ": " << pulled.status();
    auto want = run->params.find(static_cast<int>(t + 1));
    if (want == run->params.end()) continue;
    ++compared;
    const std::span<const float> got = w.client->params();
    for (size_t i = 0; i < got.size(); ++i) {
      if (!GoldenClose(got[i], want->second[i]) && ++bad <= 5) {
        ADD_FAILURE() << name << " step " << t + 1 << " value " << i << ": pulled " << got[i]
                      << ", torch " << want->second[i];
      }
    }
  }
  EXPECT_EQ(compared, 20);
  EXPECT_EQ(bad, 0);
}

TEST(OptimizerClusterTest, AdamThroughTwoShardsMatchesTorch) {
  RunThroughTheStack("adam", /*carry_lrs=*/false);
}

TEST(OptimizerClusterTest, AdamWWithANoDecayGroupForBiasesMatchesTorch) {
  RunThroughTheStack("adamw_no_decay_bias", /*carry_lrs=*/false);
}

TEST(OptimizerClusterTest, AWorkersLrScheduleCarriedByItsPushesMatchesTorch) {
  // torch halves every group's lr at steps 50, 100 and 150; the shards only
  // know the declared lrs, so the pushes must carry the schedule.
  RunThroughTheStack("adamw_lr_schedule", /*carry_lrs=*/true);
}

// Fashion-MNIST with the built-in MLP, AdamW (lr 1e-3, weight decay 0.01
// except biases: a no-decay group), 3 workers, 2 shards and the pacer
// policy (dssp) reaches 0.88 test accuracy.
TEST(OptimizerClusterTest, AdamWTrainsTheMlpToEightyEightPercent) {
  test::ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 3;
  spec.monitor_flags = {"--policy",
                        "pacer",
                        "--optimizer",
                        "adamw",
                        "--lr",
                        "1e-3",
                        "--weight-decay",
                        "0.01",
                        "--target-accuracy",
                        "0.88",
                        "--time-cap",
                        "240",
                        "--eval-interval",
                        "0.5",
                        "--seed",
                        "7"};
  spec.worker_flags = {"--param-group", "no_decay:*.bias:weight_decay=0", "--test-limit", "2000"};
  test::Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(c.monitor->Wait(std::chrono::seconds(300)).has_value()) << c.Logs();
  const std::string out = c.monitor->Stdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  EXPECT_GE(std::stod(m[1]), 0.88) << c.Logs();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << out;
  // The shards stepped the biases in their own group.
  const std::string err = c.monitor->Stderr();
  EXPECT_NE(err.find("group 'no_decay': weight_decay=0"), std::string::npos) << err;
  for (auto& s : c.shards) {
    ASSERT_TRUE(s->Wait(std::chrono::seconds(20)).has_value()) << s->name() << "\n" << c.Logs();
    EXPECT_NE(s->Stderr().find("adamw with 2 parameter group(s)"), std::string::npos)
        << s->Stderr();
  }
  for (auto& w : c.workers) {
    auto rc = w->Wait(std::chrono::seconds(20));
    ASSERT_TRUE(rc.has_value()) << w->name() << " did not exit";
    EXPECT_EQ(*rc, 0) << w->Stderr();
  }
}

}  // namespace
}  // namespace pacer
