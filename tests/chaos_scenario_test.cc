// pacer-chaos's scenario files: every shipped one parses, and mistakes are
// reported with where they are.
#include "tests/chaos/scenario.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace pacer::chaos {
namespace {

std::vector<Scenario> ReadAll(const std::string& dir) {
  std::vector<Scenario> all;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".yaml") continue;
    std::ifstream in(f.path());
    std::stringstream text;
    text << in.rdbuf();
    auto s = ParseScenario(text.str());
    EXPECT_TRUE(s.ok()) << f.path() << ": " << s.status();
    if (!s.ok()) continue;
    EXPECT_EQ(s->name, f.path().stem().string()) << "name and file name differ";
    EXPECT_LE(s->seconds, 60) << "scenarios are bounded to about a minute";
    EXPECT_FALSE(s->timeline.empty()) << f.path();
    all.push_back(*s);
  }
  return all;
}

TEST(ChaosScenarioTest, EveryShippedScenarioParses) {
  const auto shipped = ReadAll(PACER_SOURCE_DIR "/deploy/chaos");
  EXPECT_GE(shipped.size(), 11u);
  for (const auto& s : shipped) EXPECT_TRUE(s.expect_fail.empty()) << s.name << " ships to pass";
}

// Each invariant has a negative scenario (tests/chaos) that switches a
// handling off and expects that invariant to fail.
TEST(ChaosScenarioTest, EveryInvariantHasANegativeScenario) {
  std::set<std::string> shown;
  for (const auto& s : ReadAll(PACER_SOURCE_DIR "/tests/chaos")) {
    EXPECT_FALSE(s.expect_fail.empty()) << s.name;
    bool unsafe = false;
    for (const auto* args : {&s.monitor_args, &s.shard_args, &s.worker_args}) {
      unsafe |= std::find(args->begin(), args->end(), "--unsafe-disable") != args->end();
    }
    EXPECT_TRUE(unsafe) << s.name << " switches no handling off";
    shown.insert(s.expect_fail.begin(), s.expect_fail.end());
  }
  EXPECT_EQ(shown, (std::set<std::string>{"progress_within", "final_accuracy", "no_crash",
                                          "no_hang", "lost_bound", "no_double_apply",
                                          "faults_in_metrics", "durable_kept",
                                          "acked_kept", "replicas_identical",
                                          "no_split_brain", "once_per_epoch"}));
}

TEST(ChaosScenarioTest, ExpectFailNamesCheckedInvariants) {
  auto s = ParseScenario("name: x\ntimeline: [{at: 1, do: kill, target: \"shard:0\"}]\n"
                         "expect_fail: [lost_bound, no_hang]");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->expect_fail, (std::vector<std::string>{"lost_bound", "no_hang"}));
  s = ParseScenario("name: x\nexpect_fail: [fast]");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'fast' is not an invariant"), std::string::npos);
  // final_accuracy is only checked with a threshold.
  s = ParseScenario("name: x\nexpect_fail: [final_accuracy]");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not checked"), std::string::npos);
}

// Found by tests/fuzz/scenario_fuzz: a key that is not a plain name threw
// out of yaml-cpp and ended pacer-chaos; a huge process index threw from
// std::stoi.
TEST(ChaosScenarioTest, HostileYamlIsAnErrorNotACrash) {
  for (const std::string yaml : {"? : laml", "name: x\n? [a, b]\n: 1\n",
                                 "name: x\ntimeline: [{at: 1, do: kill, target: \"shard:99999999999999\"}]\n"}) {
    SCOPED_TRACE(yaml);
    auto s = ParseScenario(yaml);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  }
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

TEST(ChaosScenarioTest, ElasticActions) {
  auto s = ParseScenario(R"(
name: t
seconds: 30
timeline:
  - {at: 2, do: add-shard}
  - {at: 3, do: drain-shard, target: "shard:2"}
  - {at: 4, do: slow, target: "worker:1", factor: 4, seconds: 5}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->timeline.size(), 3u);
  EXPECT_TRUE(s->timeline[0].Heals());
  EXPECT_TRUE(s->timeline[1].Heals());  // shard:2 exists once added
  EXPECT_DOUBLE_EQ(s->timeline[2].factor, 4);
  EXPECT_FALSE(s->timeline[2].Heals());  // it heals when its seconds end
  // Checked in the order they run, not the file's: shard:2 exists by t=3.
  s = ParseScenario(R"(
name: t
timeline:
  - {at: 3, do: drain-shard, target: "shard:2"}
  - {at: 2, do: add-shard}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->timeline[0].what, "add-shard");
}

// "{shard:I}" in a fault spec stands for that shard's id (the runner puts
// it in): accepted for a shard of the cluster.
TEST(ChaosScenarioTest, AFaultSpecMayNameAShardsId) {
  auto s = ParseScenario(
      "name: x\ntimeline: [{at: 1, do: faults, target: server, spec: "
      "\"delay:ms=5,type=Replicate,peers={shard:1}\"}]");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->timeline[0].spec, "delay:ms=5,type=Replicate,peers={shard:1}");
}

// The runner and the parser expand "{shard:I}" alike: each reference
// replaced by what the resolver says, an unknown or unclosed one named.
TEST(ChaosScenarioTest, ShardReferencesAreExpandedOrNamed) {
  const auto ids = [](const std::string& ref) -> std::optional<std::string> {
    if (ref == "shard:0") return "1000";
    if (ref == "shard:1") return "7";
    return std::nullopt;
  };
  auto two = ExpandShardRefs("drop:p=1,peers={shard:0}+{shard:1};delay:peers={shard:1}", ids);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, "drop:p=1,peers=1000+7;delay:peers=7");
  EXPECT_EQ(*ExpandShardRefs("drop:p=1", ids), "drop:p=1");
  for (const auto& [spec, named] : std::vector<std::pair<std::string, std::string>>{
           {"peers={shard:2}", "'{shard:2}'"},
           {"peers={shard:0", "'{shard:0'"},
           {"peers={shard:}", "'{shard:}'"}}) {
    auto bad = ExpandShardRefs(spec, ids);
    ASSERT_FALSE(bad.ok()) << spec;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status();
  }
  auto s = ParseScenario(
      "name: x\ntimeline: [{at: 1, do: faults, target: server, spec: \"drop:p=1,peers={shard:5}\"}]");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'{shard:5}' is not {shard:I} of this cluster"),
            std::string::npos)
      << s.status();
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
           {"name: x\ntimeline: [{at: 1, do: slow, target: \"worker:0\", seconds: 3}]",
            "factor in (1, 100]"},
           {"name: x\nseconds: 10\ntimeline: [{at: 5, do: slow, target: monitor, factor: 2, "
            "seconds: 6}]",
            "must end within"},
           {"name: x\ntimeline: [{at: 1, do: drain-shard, target: \"shard:2\"}]",
            "timeline[0].target"},
           {"name: x\ntimeline: [{at: 1, do: drain-shard, target: \"worker:0\"}]",
            "not shard:I"},
           {"name: x\ntimeline: [{at: 1, do: faults, target: server, spec: "
            "\"delay:ms=5,peers={shard:9}\"}]",
            "is not {shard:I}"},
           {"name: [unclosed", "not YAML"}}) {
    auto s = ParseScenario(yaml);
    ASSERT_FALSE(s.ok()) << yaml;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  }
}

}  // namespace
}  // namespace pacer::chaos
