// pacer-chaos's scenario files: every shipped one parses, and mistakes are
// reported with where they are.
#include "monitor/chaos_scenario.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pacer::chaos {
namespace {

TEST(ChaosScenarioTest, EveryShippedScenarioParses) {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(PACER_SOURCE_DIR "/deploy/chaos")) {
    if (f.path().extension() != ".yaml") continue;
    std::ifstream in(f.path());
    std::stringstream text;
    text << in.rdbuf();
    auto s = ParseScenario(text.str());
    ASSERT_TRUE(s.ok()) << f.path() << ": " << s.status();
    EXPECT_EQ(s->name, f.path().stem().string()) << "name and file name differ";
    EXPECT_LE(s->seconds, 60) << "scenarios are bounded to about a minute";
    EXPECT_FALSE(s->timeline.empty()) << f.path();
    ++n;
  }
  EXPECT_GE(n, 9);
}

TEST(ChaosScenarioTest, ReadsClusterTimelineAndInvariants) {
  auto s = ParseScenario(R"(
name: t
seconds: 30
cluster: {shards: 3, workers: 2, mode: bsp, checkpoint_interval: 2, worker_args: [--slowdown, "2"]}
timeline:
  - {at: 9, do: restart, target: "shard:2"}
  - {at: 4, do: kill, target: "shard:2"}
  - {at: 5, do: faults, target: worker, spec: "drop:p=0.1,for=5"}
  - {at: 6, do: partition, target: "worker:1", seconds: 4}
invariants: {progress_within: 10, final_accuracy: 0.5, no_crash: false}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shards, 3);
  EXPECT_EQ(s->mode, "bsp");
  EXPECT_EQ(s->worker_args, (std::vector<std::string>{"--slowdown", "2"}));
  ASSERT_EQ(s->timeline.size(), 4u);
  EXPECT_EQ(s->timeline[0].what, "kill");  // sorted by time
  EXPECT_TRUE(s->timeline.back().Heals());
  EXPECT_DOUBLE_EQ(s->invariants.final_accuracy, 0.5);
  EXPECT_FALSE(s->invariants.no_crash);
  EXPECT_TRUE(s->invariants.no_hang);
}

TEST(ChaosScenarioTest, MistakesAreNamed) {
  for (const auto& [yaml, why] : std::vector<std::pair<std::string, std::string>>{
           {"seconds: 5", "'name' is required"},
           {"name: x\nsecnds: 5", "unknown key 'secnds'"},
           {"name: x\nseconds: 900", "seconds"},
           {"name: x\ntimeline: [{at: 1, do: explode}]", "unknown action 'explode'"},
           {"name: x\ntimeline: [{at: 1, do: kill, target: \"shard:5\"}]", "timeline[0].target"},
           {"name: x\ntimeline: [{at: 99, do: kill, target: monitor}]", "timeline[0].at"},
           {"name: x\ntimeline: [{at: 1, do: faults, target: all, spec: \"drop:p=7\"}]",
            "p must be"},
           {"name: x\ncluster: {shards: 0}", "cluster.shards"},
           {"name: [unclosed", "not YAML"}}) {
    auto s = ParseScenario(yaml);
    ASSERT_FALSE(s.ok()) << yaml;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  }
}

}  // namespace
}  // namespace pacer::chaos
