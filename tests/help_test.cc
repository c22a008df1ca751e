// Every Options field has a flag in its binary's --help, and a bad flag is a
// usage error (exit code 2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

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
      "--checkpoint-updates", "--advertise", "--metrics-auth-file", "--config", "--faults",
      "--fault-seed"}},
    {PACER_MONITOR_BIN,
     {"--listen", "--metrics-addr", "--log-level", "--job-id", "--mode", "--lr", "--momentum",
      "--global-batch", "--epochs", "--time-cap", "--target-accuracy", "--report-accuracy",
      "--seed", "--min-shards", "--min-workers", "--lease", "--heartbeat-ms", "--eval-interval",
      "--eval-every-clocks",
      "--max-message-bytes", "--shard-resend-ms", "--stop-grace", "--data-dir",
      "--data-partitions", "--metrics-auth-file", "--config", "--faults", "--fault-seed"}},
    {PACER_WORKER_BIN,
     {"--monitor", "--log-level", "--dataset", "--train-limit", "--test-limit", "--layers",
      "--block-floats", "--request-timeout", "--start-timeout", "--progress-interval",
      "--progress", "--max-message-bytes", "--sample-log", "--evaluate-model", "--metrics-addr",
      "--metrics-auth-file", "--config", "--faults", "--fault-seed"}},
    {PACERCTL_BIN, {"--monitor", "--timeout", "--log-level", "status", "remove-worker",
                    "export-model", "add-shard", "drain-shard", "pause", "resume", "fault"}},
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

TEST(UsageTest, AMalformedAddressIsAUsageErrorThatNamesTheForm) {
  TempDir dir;
  for (const char* bin : {PACER_WORKER_BIN, PACER_SERVER_BIN, PACERCTL_BIN}) {
    for (const char* address : {"127.0.0.1:5555", "tcp://127.0.0.1", "tcp://127.0.0.1:99999"}) {
      std::vector<std::string> args = {bin, "--monitor", address};
      if (std::string(bin) == PACERCTL_BIN) args.push_back("status");
      auto p = Process::Start(args, dir.path(), "address");
      EXPECT_EQ(p->Wait(seconds(10)), 2) << bin << " " << address << ": " << p->Stderr();
      EXPECT_NE(p->Stderr().find("tcp://HOST:PORT"), std::string::npos) << p->Stderr();
    }
  }
}

TEST(UsageTest, AProcessWaitingForTheMonitorSaysSo) {
  // Nothing listens on port 1: each says after 2 s what it waits for (the
  // next line would come at 7 s) and gives up after 4 s.
  TempDir dir;
  auto worker = Process::Start({PACER_WORKER_BIN, "--monitor", "tcp://127.0.0.1:1",
                                "--start-timeout", "4", "--metrics-addr", "off"},
                               dir.path(), "worker");
  auto server = Process::Start({PACER_SERVER_BIN, "--monitor", "tcp://127.0.0.1:1",
                                "--register-timeout", "4", "--metrics-addr", "off"},
                               dir.path(), "server");
  EXPECT_EQ(worker->Wait(seconds(30)), 1) << worker->Stderr();
  EXPECT_EQ(server->Wait(seconds(30)), 1) << server->Stderr();
  for (const std::string& err : {worker->Stderr(), server->Stderr()}) {
    EXPECT_NE(err.find("waiting for the monitor at tcp://127.0.0.1:1: no answer for 2 s (giving "
                       "up after 4 s"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("could not register with monitor tcp://127.0.0.1:1"), std::string::npos)
        << err;
  }
}

TEST(UsageTest, BadNumbersAndCommandsSayWhatIsExpected) {
  TempDir dir;
  auto cap = Process::Start({PACER_MONITOR_BIN, "--time-cap", "-5"}, dir.path(), "cap");
  EXPECT_EQ(cap->Wait(seconds(10)), 2);
  EXPECT_NE(cap->Stderr().find("must be 0 or more, got -5"), std::string::npos) << cap->Stderr();
  EXPECT_LT(cap->Stderr().size(), 300u) << cap->Stderr();  // no 300-digit bound
  auto lease = Process::Start({PACER_MONITOR_BIN, "--lease", "0"}, dir.path(), "lease");
  EXPECT_EQ(lease->Wait(seconds(10)), 2);
  EXPECT_NE(lease->Stderr().find("must be more than 0, got 0"), std::string::npos)
      << lease->Stderr();
  auto typo = Process::Start({PACERCTL_BIN, "--monitor", "tcp://127.0.0.1:1", "stats"}, dir.path(),
                             "typo");
  EXPECT_EQ(typo->Wait(seconds(10)), 2);
  EXPECT_NE(typo->Stderr().find("Commands: keygen, status, remove-worker"), std::string::npos)
      << typo->Stderr();
  auto sub = Process::Start({PACERCTL_BIN, "--monitor", "tcp://127.0.0.1:1", "fault", "sett"},
                            dir.path(), "subtypo");
  EXPECT_EQ(sub->Wait(seconds(10)), 2);
  EXPECT_NE(sub->Stderr().find("Commands: set, clear, list"), std::string::npos) << sub->Stderr();
}

// Settings: a flag wins over its PACER_<NAME> variable, which wins over the
// --config file, which wins over the default. Seen through the monitor
// address a shard fails to register with (nothing listens on port 1..3).
TEST(ConfigTest, FlagBeatsEnvironmentBeatsConfigFile) {
  TempDir dir;
  const std::string config = dir.path() + "/server.toml";
  std::ofstream(config) << "# a comment\n"
                        << "monitor = \"tcp://127.0.0.1:1\"  # trailing comment\n"
                        << "register-timeout = 0.5\n"
                        << "metrics-addr = \"off\"\n";
  auto monitor_tried = [&](const std::vector<std::string>& extra, const char* env) {
    if (env != nullptr) setenv("PACER_MONITOR", env, 1);
    std::vector<std::string> argv = {PACER_SERVER_BIN, "--config", config};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Process::Start(argv, dir.path(), "server");
    unsetenv("PACER_MONITOR");
    EXPECT_EQ(p->Wait(seconds(20)), std::optional<int>(1)) << p->Stderr();
    const std::string err = p->Stderr();
    const auto at = err.find("could not register with monitor ");
    return at == std::string::npos ? err : err.substr(at + 32, 18);
  };
  EXPECT_EQ(monitor_tried({}, nullptr), "tcp://127.0.0.1:1:");                      // the file
  EXPECT_EQ(monitor_tried({}, "tcp://127.0.0.1:2"), "tcp://127.0.0.1:2:");          // env > file
  EXPECT_EQ(monitor_tried({"--monitor", "tcp://127.0.0.1:3"}, "tcp://127.0.0.1:2"),
            "tcp://127.0.0.1:3:");                                                  // flag > env

  // An unknown setting is a usage error naming it.
  std::ofstream(dir.path() + "/bad.toml") << "monitr = \"tcp://127.0.0.1:1\"\n";
  auto bad = Process::Start({PACER_SERVER_BIN, "--config", dir.path() + "/bad.toml"}, dir.path(),
                            "bad");
  EXPECT_EQ(bad->Wait(seconds(10)), std::optional<int>(2));
  EXPECT_NE(bad->Stderr().find("no setting 'monitr'"), std::string::npos) << bad->Stderr();
}

}  // namespace
}  // namespace pacer::test
