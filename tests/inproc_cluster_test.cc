// A whole cluster inside one process over the in-process transport: the
// monitor, two shards and three workers on threads, configured only through
// their Options structs.
#include <gtest/gtest.h>

#include <thread>

#include "monitor/monitor.h"
#include "ps/shard_server.h"
#include "worker/worker.h"

namespace pacer {
namespace {

TEST(InProcClusterTest, TrainsToTargetWithBspAcrossTwoShards) {
  auto transport = MakeInProcTransport();
  MonitorOptions mopts;
  mopts.listen = "mem://monitor";
  mopts.job_id = 99;
  mopts.min_shards = 2;
  mopts.min_workers = 3;
  mopts.global_batch = 96;
  mopts.target_accuracy = 0.7f;
  mopts.time_cap_seconds = 120;
  mopts.eval_interval_seconds = 0.3;
  mopts.stop_grace = std::chrono::milliseconds(500);
  auto monitor = MonitorServer::Start(transport.get(), mopts);
  ASSERT_TRUE(monitor.ok()) << monitor.status();

  std::vector<std::unique_ptr<ShardServer>> shards;
  for (int i = 0; i < 2; ++i) {
    ShardServerOptions sopts;
    sopts.listen = "mem://shard" + std::to_string(i);
    sopts.monitor = "mem://monitor";
    auto s = ShardServer::Start(transport.get(), sopts);
    ASSERT_TRUE(s.ok()) << s.status();
    shards.push_back(std::move(*s));
  }

  std::vector<absl::StatusOr<worker::WorkerResult>> results(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      worker::WorkerOptions wopts;
      wopts.monitor = "mem://monitor";
      wopts.train_limit = 9000;
      wopts.test_limit = 1000;
      wopts.block_floats = 16384;
      wopts.request_timeout = std::chrono::seconds(30);
      worker::Worker w(transport.get(), wopts);
      results[static_cast<size_t>(i)] = w.Run();
    });
  }
  for (auto& t : threads) t.join();
  (*monitor)->Wait();
  for (auto& s : shards) s->Wait();

  ASSERT_TRUE((*monitor)->last_accuracy().has_value());
  EXPECT_GE(*(*monitor)->last_accuracy(), 0.7);
  EXPECT_NE((*monitor)->stop_reason().find("target accuracy"), std::string::npos)
      << (*monitor)->stop_reason();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->clocks, 0u);
  }
  for (auto& s : shards) {
    const double steps = ReadMetric(s->registry(), "pacer_shard_steps_total");
    const double applied = ReadMetric(s->registry(), "pacer_shard_applied_clock");
    EXPECT_GT(steps, 0);
    EXPECT_EQ(steps, applied + 1);
    EXPECT_EQ(ReadMetric(s->registry(), "pacer_shard_incomplete_steps_total"), 0);
  }
}

// One shard, one worker, 2 epochs of 3200 samples at batch 32 (200 clocks);
// the time schedule is out of reach, so only the clock schedule (if set)
// evaluates. The worker computes 8x slower (a few ms per clock), so that 20
// clocks outlast an evaluation of 200 samples even on a loaded machine (at
// full speed the 200 clocks took 0.3 s and a CI run under load evaluated 3
// times). Returns the evaluations the monitor counted.
double EvaluationsOfAJob(uint32_t eval_every_clocks) {
  auto transport = MakeInProcTransport();
  MonitorOptions mopts;
  mopts.listen = "mem://monitor";
  mopts.job_id = 98;
  mopts.global_batch = 32;
  mopts.epochs = 2;
  mopts.data_stream = false;  // whole batches: 200 clocks, so the schedule's count is exact
  mopts.time_cap_seconds = 120;
  mopts.eval_interval_seconds = 1000;
  mopts.eval_interval_clocks = eval_every_clocks;
  mopts.stop_grace = std::chrono::milliseconds(300);
  auto monitor = MonitorServer::Start(transport.get(), mopts);
  EXPECT_TRUE(monitor.ok()) << monitor.status();
  if (!monitor.ok()) return -1;
  ShardServerOptions sopts;
  sopts.listen = "mem://shard0";
  sopts.monitor = "mem://monitor";
  auto shard = ShardServer::Start(transport.get(), sopts);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return -1;
  worker::WorkerOptions wopts;
  wopts.monitor = "mem://monitor";
  wopts.train_limit = 3200;
  wopts.test_limit = 200;
  wopts.slowdown = 8.0;
  wopts.request_timeout = std::chrono::seconds(30);
  worker::Worker w(transport.get(), wopts);
  auto result = w.Run();
  (*monitor)->Wait();
  (*shard)->Wait();
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) {
    EXPECT_EQ(result->clocks, 200u);
  }
  return ReadMetric((*monitor)->registry(), "pacer_training_evaluations_total");
}

TEST(InProcClusterTest, EvaluatesEveryNClocksWhenAsked) {
  // Every 20 of 200 clocks: 10 chances; an evaluation that outlasts 20
  // clocks skips the ones it missed, so not all 10 need happen.
  const double every_20 = EvaluationsOfAJob(20);
  EXPECT_GE(every_20, 4);
  EXPECT_LE(every_20, 10);
  EXPECT_EQ(EvaluationsOfAJob(0), 0);
}

}  // namespace
}  // namespace pacer
