// pacerctl against a real local cluster: status (table and JSON), remove-worker,
// export-model, and pacer-worker --evaluate-model on the exported file.
#include <signal.h>

#include <regex>
#include <thread>

#include "tests/pacerctl_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

TEST(PacerctlClusterTest, StatusRemoveWorkerAndExportModel) {
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 3;
  spec.shard_data_dirs = true;
  spec.shard_flags = {"--checkpoint-interval", "1"};
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "96", "--time-cap", "120",
                        "--eval-interval", "0.5", "--lease", "3", "--data-partitions", "3"};
  spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  // Running, with clocks moving and checkpoints taken.
  nlohmann::json j;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    j = Status(c);
    if (!j.is_discarded() && j["state"] == "running" && j["shards"].size() == 2 &&
        j["shards"][0]["applied_clock"].get<int64_t>() > 30 &&
        !j["shards"][0]["checkpoint_age_seconds"].is_null()) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["state"], "running") << j.dump(2) << c.Logs();
  EXPECT_EQ(j["mode"], "bsp");
  EXPECT_EQ(j["policy"], "fixed");
  ASSERT_EQ(j["shards"].size(), 2u);
  for (const auto& s : j["shards"]) {
    EXPECT_TRUE(s["up"].get<bool>());
    EXPECT_LT(s["checkpoint_age_seconds"].get<double>(), 10.0);
  }
  ASSERT_EQ(j["workers"].size(), 3u);
  uint32_t batch_sum = 0;
  std::set<uint32_t> partitions;
  for (const auto& w : j["workers"]) {
    EXPECT_EQ(w["state"], "live");
    batch_sum += w["batch"].get<uint32_t>();
    for (const auto& p : w["partitions"]) partitions.insert(p.get<uint32_t>());
  }
  EXPECT_EQ(batch_sum, 96u);
  EXPECT_EQ(partitions, (std::set<uint32_t>{0, 1, 2}));
  EXPECT_EQ(j["model"]["parameters"].get<uint64_t>(), 235146u);

  // The table form names every shard and worker.
  CtlRun table = Ctl(c, {"status"}, "status-table");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("SHARD"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("WORKER"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(c.shard_addresses[1]), std::string::npos) << table.out;

  // remove-worker: the worker of rank 2 leaves; its partition goes to the others.
  uint32_t victim = 0;
  for (const auto& w : j["workers"]) {
    if (w["rank"] == 2) victim = w["id"].get<uint32_t>();
  }
  ASSERT_NE(victim, 0u);
  CtlRun removed = Ctl(c, {"remove-worker", std::to_string(victim)}, "remove");
  EXPECT_EQ(removed.code, 0) << removed.err;
  CtlRun again = Ctl(c, {"remove-worker", std::to_string(victim)}, "remove-again");
  EXPECT_EQ(again.code, 1) << "removing a worker twice is an error";
  EXPECT_NE(again.err.find("not a live member"), std::string::npos) << again.err;
  // Errors read as text, without the wire code's payload.
  EXPECT_EQ(again.err.find("pacer.wire.ErrorCode"), std::string::npos) << again.err;
  // Faults for an id nobody has fail, naming the ids there are.
  CtlRun typo = Ctl(c, {"fault", "set", "worker:99", "drop:p=0.1"}, "fault-typo");
  EXPECT_EQ(typo.code, 1) << typo.err;
  EXPECT_NE(typo.err.find("no worker has id 99 (ids: "), std::string::npos) << typo.err;
  j = Status(c);
  batch_sum = 0;
  partitions.clear();
  size_t live = 0;
  for (const auto& w : j["workers"]) {
    if (w["state"] != "live") {
      EXPECT_TRUE(w["partitions"].empty());
      continue;
    }
    ++live;
    batch_sum += w["batch"].get<uint32_t>();
    for (const auto& p : w["partitions"]) partitions.insert(p.get<uint32_t>());
  }
  EXPECT_EQ(live, 2u);
  EXPECT_EQ(batch_sum, 96u);
  EXPECT_EQ(partitions, (std::set<uint32_t>{0, 1, 2}));
  // The removed worker learns it at its next heartbeat and exits with an error.
  bool exited = false;
  for (auto& w : c.workers) {
    auto rc = w->Wait(std::chrono::milliseconds(100));
    if (rc.has_value()) {
      exited = true;
      EXPECT_EQ(*rc, 1) << w->Stderr();
    }
  }
  if (!exited) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    int gone = 0;
    for (auto& w : c.workers) gone += !w->Running();
    EXPECT_EQ(gone, 1) << c.Logs();
  }

  // set-lr: a group's lr by hand reaches every shard (with their next
  // heartbeat reply), and clear takes it back; a group the model lacks is
  // refused, a bad value is a usage error.
  auto shards_log = [&](const std::string& text) {
    const auto until = std::chrono::steady_clock::now() + seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (auto& s : c.shards) all &= s->Stderr().find(text) != std::string::npos;
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  };
  CtlRun set = Ctl(c, {"set-lr", "default", "0.05"}, "set-lr");
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_NE(set.out.find("default          0.05"), std::string::npos) << set.out;
  EXPECT_TRUE(shards_log("learning rates set by hand (v1): group 0 lr 0.050000")) << c.Logs();
  CtlRun unknown = Ctl(c, {"set-lr", "embedding", "0.1"}, "set-lr-unknown");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("no parameter group 'embedding' (the model has: default)"),
            std::string::npos)
      << unknown.err;
  EXPECT_EQ(Ctl(c, {"set-lr", "default", "-1"}, "set-lr-bad").code, 2);
  CtlRun cleared = Ctl(c, {"set-lr", "default", "clear"}, "set-lr-clear");
  ASSERT_EQ(cleared.code, 0) << cleared.err;
  EXPECT_NE(cleared.out.find("no learning rate set by hand"), std::string::npos) << cleared.out;
  EXPECT_TRUE(shards_log("learning rates set by hand (v2): none")) << c.Logs();

  // export-model, then evaluate the file with the worker.
  const std::string model = c.dir.path() + "/model.bin";
  CtlRun exported = Ctl(c, {"export-model", model}, "export");
  ASSERT_EQ(exported.code, 0) << exported.err;
  EXPECT_NE(exported.out.find("exported 235146 parameters"), std::string::npos) << exported.out;
  auto eval = Process::Start({PACER_WORKER_BIN, "--evaluate-model", model, "--test-limit", "2000"},
                             c.dir.path(), "evaluate");
  ASSERT_EQ(eval->Wait(seconds(60)).value_or(-1), 0) << eval->Stderr();
  std::smatch m;
  const std::string out = eval->Stdout();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("test accuracy: ([0-9.]+)"))) << out;
  EXPECT_GT(std::stod(m[1]), 0.6) << "the exported model is the trained one";
  // A model of another shape is refused, clearly.
  auto wrong = Process::Start({PACER_WORKER_BIN, "--evaluate-model", model, "--layers", "784,32,10"},
                              c.dir.path(), "evaluate-wrong");
  EXPECT_EQ(wrong->Wait(seconds(60)).value_or(-1), 1);
  EXPECT_NE(wrong->Stderr().find("parameters"), std::string::npos) << wrong->Stderr();

  // Usage errors exit 2.
  auto usage = Process::Start({PACERCTL_BIN, "status"}, c.dir.path(), "usage");
  EXPECT_EQ(usage->Wait(seconds(10)).value_or(-1), 2);

  c.monitor->Signal(SIGTERM);
  EXPECT_TRUE(c.monitor->Wait(seconds(10)).has_value());
}

// With the data stream, status shows the job's epoch and progress, the
// counters of chunks, and each live worker's chunks and epoch samples.
TEST(PacerctlClusterTest, StatusShowsTheDataStream) {
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 2;
  spec.monitor_flags = {"--data-stream", "--global-batch", "64", "--time-cap", "60",
                        "--chunk-samples", "500"};
  spec.worker_flags = {"--train-limit", "6000", "--test-limit", "500"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  // Once both workers trained into their chunks.
  nlohmann::json j;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  auto trained = [](const nlohmann::json& status) {
    if (status.is_discarded() || status["data_stream"].is_null()) return false;
    int with_progress = 0;
    for (const auto& w : status["workers"]) {
      for (const auto& ch : w["chunks"]) {
        with_progress += ch["position"].get<uint64_t>() > ch["begin"].get<uint64_t>();
      }
    }
    return with_progress >= 2;
  };
  while (std::chrono::steady_clock::now() < deadline) {
    j = Status(c);
    if (trained(j)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(trained(j)) << j.dump(2) << c.Logs();
  const auto& s = j["data_stream"];
  EXPECT_EQ(s["samples"].get<uint64_t>(), 6000u);
  EXPECT_EQ(s["epochs"].get<uint32_t>(), 0u);
  EXPECT_GE(s["handed_out"].get<uint64_t>(), 4u) << "two chunks held by each of two workers";
  const double progress = s["progress"].get<double>();
  EXPECT_GE(progress, 0.0);
  EXPECT_LE(progress, 1.0);
  ASSERT_EQ(j["workers"].size(), 2u);
  for (const auto& w : j["workers"]) {
    EXPECT_TRUE(w["partitions"].empty());
    ASSERT_FALSE(w["chunks"].empty()) << w.dump();
    EXPECT_LE(w["chunks"].size(), 2u);
    for (const auto& ch : w["chunks"]) {
      EXPECT_LE(ch["begin"].get<uint64_t>(), ch["position"].get<uint64_t>());
      EXPECT_LE(ch["position"].get<uint64_t>(), ch["end"].get<uint64_t>());
      EXPECT_LE(ch["end"].get<uint64_t>(), 6000u);
      EXPECT_LE(ch["end"].get<uint64_t>() - ch["begin"].get<uint64_t>(), 500u);
    }
  }

  CtlRun table = Ctl(c, {"status"}, "status-table");
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("data stream: 6000 samples, epoch "), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("CHUNKS"), std::string::npos) << table.out;
}

}  // namespace
}  // namespace pacer::test
