// The flag parsing every binary shares (ps/base/cli.h).
#include "ps/base/cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pacer {
namespace {

std::optional<int> Parse(CLI::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseFlags(app, static_cast<int>(argv.size()), argv.data());
}

// A launcher passes its defaults first and the user's flags after them
// (deploy/local-cluster.sh --monitor-args "--lr 0.001"): the last one wins.
TEST(ParseFlagsTest, AFlagGivenTwiceTakesItsLastValue) {
  CLI::App app{"test", "prog"};
  double lr = 0;
  std::string mode;
  app.add_option("--lr", lr);
  app.add_option("--mode", mode);
  EXPECT_EQ(Parse(app, {"--lr", "0.1", "--mode", "bsp", "--lr", "0.001", "--mode=asp"}),
            std::nullopt);
  EXPECT_DOUBLE_EQ(lr, 0.001);
  EXPECT_EQ(mode, "asp");
}

TEST(ParseFlagsTest, RepeatableFlagsKeepEveryValue) {
  CLI::App app{"test", "prog"};
  std::vector<std::string> groups;
  app.add_option("--param-group", groups);
  EXPECT_EQ(Parse(app, {"--param-group", "a", "--param-group", "b"}), std::nullopt);
  EXPECT_EQ(groups, (std::vector<std::string>{"a", "b"}));
}

TEST(ParseFlagsTest, ABadValueIsStillAUsageError) {
  CLI::App app{"test", "prog"};
  double lr = 0;
  app.add_option("--lr", lr);
  EXPECT_EQ(Parse(app, {"--lr", "0.1", "--lr", "fast"}), kExitUsage);
}

}  // namespace
}  // namespace pacer
