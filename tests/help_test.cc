// Every Options field has a flag in its binary's --help, and a bad flag is a
// usage error (exit code 2).
#include <gtest/gtest.h>

#include "tests/process_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

struct Binary {
  const char* path;
  // One flag per Options field the binary exposes (ShardServerOptions +
  // ShardOptions, MonitorOptions, WorkerOptions), plus the shared ones.
  std::vector<std::string> flags;
};

const Binary kBinaries[] = {
    {PACER_SERVER_BIN,
     {"--listen", "--monitor", "--metrics-addr", "--log-level", "--max-message-bytes",
      "--pull-timeout", "--register-timeout", "--heartbeat-ms", "--no-apply", "--no-crc",
      "--request-timeout", "--stall-report", "--data-dir", "--checkpoint-interval",
      "--checkpoint-updates"}},
    {PACER_MONITOR_BIN,
     {"--listen", "--metrics-addr", "--log-level", "--job-id", "--mode", "--lr", "--momentum",
      "--global-batch", "--epochs", "--time-cap", "--target-accuracy", "--report-accuracy",
      "--seed", "--min-shards", "--min-workers", "--lease", "--heartbeat-ms", "--eval-interval",
      "--max-message-bytes", "--shard-resend-ms", "--stop-grace", "--data-dir",
      "--data-partitions"}},
    {PACER_WORKER_BIN,
     {"--monitor", "--log-level", "--dataset", "--train-limit", "--test-limit", "--layers",
      "--block-floats", "--request-timeout", "--start-timeout", "--progress-interval",
      "--progress", "--max-message-bytes", "--sample-log", "--evaluate-model"}},
    {PACERCTL_BIN, {"--monitor", "--timeout", "--log-level", "status", "remove-worker",
                    "export-model", "add-shard", "drain-shard", "pause", "resume"}},
};

TEST(HelpTest, EveryOptionAppearsInHelp) {
  TempDir dir;
  for (const Binary& b : kBinaries) {
    auto p = Process::Start({b.path, "--help"}, dir.path(), "help");
    ASSERT_EQ(p->Wait(seconds(10)), 0) << b.path;
    std::string help = p->Stdout();
    for (const auto& f : b.flags) {
      EXPECT_NE(help.find(f), std::string::npos) << b.path << " --help lacks " << f << "\n" << help;
    }
    EXPECT_NE(help.find("Exit codes"), std::string::npos) << help;
  }
}

TEST(HelpTest, BadFlagIsUsageErrorWithExitCodeTwo) {
  TempDir dir;
  for (const Binary& b : kBinaries) {
    std::vector<std::string> args = {b.path};
    if (std::string(b.path) != PACER_MONITOR_BIN) {
      args.insert(args.end(), {"--monitor", "tcp://127.0.0.1:1"});  // required there
    }
    args.push_back("--no-such-flag");
    auto p = Process::Start(args, dir.path(), "bad");
    EXPECT_EQ(p->Wait(seconds(10)), 2) << b.path;
    EXPECT_NE(p->Stderr().find("--no-such-flag"), std::string::npos) << p->Stderr();
  }
  // A bad value is a usage error too.
  auto p = Process::Start({PACER_MONITOR_BIN, "--mode", "sideways"}, dir.path(), "badvalue");
  EXPECT_EQ(p->Wait(seconds(10)), 2);
  auto q = Process::Start({PACER_SERVER_BIN}, dir.path(), "missing");  // --monitor is required
  EXPECT_EQ(q->Wait(seconds(10)), 2);
}

}  // namespace
}  // namespace pacer::test
