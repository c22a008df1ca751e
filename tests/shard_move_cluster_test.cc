// Elastic shards against a real local cluster training with Adam: with the
// workers held (pacerctl pause), add a shard and drain one; every parameter
// and every value of the optimizer's state (m, v) and each key's step
// count, read by the test through pacerctl export-model --with-state, is
// the same before and after each move; then training goes on.
#include <signal.h>

#include <cstring>
#include <regex>
#include <thread>

#include "tests/pacerctl_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// The exported model file's keys, optimizer, step counts, values and
// optimizer state: the bytes between the header (which holds the shard-map
// version, changed by a move) and the CRC.
std::string ModelBody(Cluster& c, const std::string& name) {
  const std::string path = c.dir.path() + "/" + name + ".bin";
  CtlRun r = Ctl(c, {"export-model", "--with-state", path}, "export-" + name);
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string bytes = ReadFile(path);
  return bytes.size() > 32 ? bytes.substr(28, bytes.size() - 32) : "";
}

// Byte-equal model bodies; on a mismatch, where the first float differs.
void ExpectSame(const std::string& after, const std::string& before, const std::string& what) {
  ASSERT_EQ(after.size(), before.size()) << what;
  size_t differ = 0, first = std::string::npos;
  for (size_t i = 0; i + 4 <= before.size(); i += 4) {
    if (std::memcmp(after.data() + i, before.data() + i, 4) != 0) {
      ++differ;
      if (first == std::string::npos) first = i;
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << before.size() / 4
                        << " words differ, the first at byte " << first << " of the body";
}

TEST(ShardMoveClusterTest, AddAndDrainShardsKeepEveryParameter) {
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 2;
  spec.shard_data_dirs = true;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "96", "--time-cap", "120",
                        "--eval-interval", "1", "--lease", "3", "--optimizer", "adam"};
  spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  auto applied = [&](size_t i) {
    return MetricValue(FetchMetrics(c.shard_metrics[i]), "pacer_shard_applied_clock").value_or(-1);
  };
  auto wait_clock = [&](size_t i, double target) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (applied(i) >= target) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_clock(0, 20)) << c.Logs();

  // A second shard registers: idle, outside the map.
  ASSERT_TRUE(c.AddShard()) << c.Logs();
  nlohmann::json j;
  uint32_t first = 0, second = 0;
  for (int i = 0; i < 100 && second == 0; ++i) {
    j = Status(c);
    if (j.is_discarded()) continue;
    for (const auto& s : j["shards"]) {
      if (s["key_begin"] == s["key_end"]) second = s["id"].get<uint32_t>();
      else first = s["id"].get<uint32_t>();
    }
    if (second == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(second, 0u) << j.dump(2) << c.Logs();
  ASSERT_NE(first, 0u);

  // Hold the workers; every parameter, before any move.
  ASSERT_EQ(Ctl(c, {"pause"}, "pause").code, 0);
  bool held = false;
  for (int i = 0; i < 100 && !held; ++i) {
    j = Status(c);
    held = !j.is_discarded();
    // Held: every live worker paused at the hold clock (one that was further
    // along than the monitor knew moves the hold clock up, and the others
    // run up to it).
    for (const auto& w : j["workers"]) {
      held &= w["state"] != "live" ||
              (w["paused"].get<bool>() && w["clock"].get<uint64_t>() == j["pause_at"].get<uint64_t>());
    }
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(held) << j.dump(2) << c.Logs();
  const std::string before = ModelBody(c, "before");
  // The MLP's 235146 parameters, Adam's m and v for each.
  ASSERT_GT(before.size(), 3 * 235146u * 4);
  const uint64_t v1 = j["shard_map_version"].get<uint64_t>();

  // Add: the idle shard takes half the keys.
  CtlRun added = Ctl(c, {"add-shard", std::to_string(second)}, "add");
  ASSERT_EQ(added.code, 0) << added.err << c.Logs();
  j = Status(c);
  EXPECT_EQ(j["shard_map_version"].get<uint64_t>(), v1 + 1);
  for (const auto& s : j["shards"]) EXPECT_NE(s["key_begin"], s["key_end"]) << j.dump(2);
  ExpectSame(ModelBody(c, "after-add"), before, "add");
  EXPECT_NE(c.shards[0]->Stderr().find("dropped"), std::string::npos) << c.shards[0]->Stderr();
  EXPECT_NE(c.shards[1]->Stderr().find("moved in"), std::string::npos) << c.shards[1]->Stderr();

  // Drain the first shard: its keys go to the second, and it stops.
  CtlRun drained = Ctl(c, {"drain-shard", std::to_string(first)}, "drain");
  ASSERT_EQ(drained.code, 0) << drained.err << c.Logs();
  j = Status(c);
  EXPECT_EQ(j["shard_map_version"].get<uint64_t>(), v1 + 2);
  ExpectSame(ModelBody(c, "after-drain"), before, "drain");
  auto rc = c.shards[0]->Wait(seconds(10));
  EXPECT_TRUE(rc.has_value()) << "the drained shard should stop\n" << c.Logs();

  // The shard holding everything now is killed and restarted: its
  // checkpoint, taken right after the keys moved, has them all, in order.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  c.shards[1]->Signal(SIGKILL);
  ASSERT_TRUE(c.shards[1]->Wait(seconds(5)).has_value());
  ASSERT_TRUE(c.StartShard(1)) << c.Logs();
  std::string restored;
  for (int i = 0; i < 50; ++i) {
    const std::string path = c.dir.path() + "/restored.bin";
    CtlRun r = Ctl(c, {"export-model", "--with-state", path}, "export-restored");
    if (r.code == 0) {
      const std::string bytes = ReadFile(path);
      restored = bytes.substr(28, bytes.size() - 32);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ExpectSame(restored, before, "restart after the moves");

  // Bad requests are refused, clearly.
  CtlRun bad = Ctl(c, {"drain-shard", std::to_string(second)}, "drain-last");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("no other shard"), std::string::npos) << bad.err;

  // Training goes on, on the remaining shard.
  const double at = applied(1);
  ASSERT_EQ(Ctl(c, {"resume"}, "resume").code, 0);
  ASSERT_TRUE(wait_clock(1, at + 30)) << c.Logs();
  c.monitor->Signal(SIGTERM);
  EXPECT_TRUE(c.monitor->Wait(seconds(10)).has_value());
}

}  // namespace
}  // namespace pacer::test
