// The binaries' flags, read from their own --help: each is documented in
// the manuals (README.md and the module READMEs it links to), every flag
// documented there exists, and every Options field has a flag or is named
// as exempt. A bad flag is a usage error (exit code 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/process_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// The manuals where any binary's flag may be documented: the front door and
// the manuals it links to (the operating manual, each plane's, pacer.torch's
// and the chaos runner's).
const char* const kSharedDocs[] = {
    "README.md",        "deploy/README.md",        "ps/README.md",         "monitor/README.md",
    "worker/README.md", "worker/python/README.md", "tests/chaos/README.md"};

// The product's binaries, with the README beside the plane each belongs to.
struct Binary {
  const char* path;
  const char* readme;  // relative to the source tree
};

const Binary kBinaries[] = {
    {PACER_SERVER_BIN, "ps/README.md"},
    {PACER_MONITOR_BIN, "monitor/README.md"},
    {PACER_WORKER_BIN, "worker/README.md"},
    {PACERCTL_BIN, "monitor/README.md"},
    {PACER_RUN_BIN, "worker/README.md"},
    {PACER_CHAOS_BIN, PACER_CHAOS_README},
};

std::string Source(const std::string& relative) {
  return ReadFile(std::string(PACER_SOURCE_DIR) + "/" + relative);
}

// `argv` --help's standard output (the test fails when it does not exit 0).
std::string Help(std::vector<std::string> argv) {
  TempDir dir;
  argv.push_back("--help");
  auto p = Process::Start(argv, dir.path(), "help");
  const auto rc = p->Wait(seconds(20));
  EXPECT_EQ(rc, 0) << argv[0] << " --help: " << p->Stderr();
  return p->Stdout();
}

// The long flags a CLI11 --help lists: an option line starts with two
// spaces, then the flag (or "-h,--help"); descriptions are indented deeper.
std::set<std::string> FlagsIn(const std::string& help) {
  static const std::regex option(R"(^  (?:-[A-Za-z],)?(--[a-z][a-z0-9-]*))");
  std::set<std::string> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, option)) flags.insert(m[1]);
  }
  flags.erase("--help");
  return flags;
}

// The subcommands a CLI11 --help lists under "Subcommands:".
std::vector<std::string> SubcommandsIn(const std::string& help) {
  static const std::regex command(R"(^  ([a-z][a-z-]*)( |$))");
  std::vector<std::string> out;
  std::istringstream in(help);
  bool in_list = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "Subcommands:") {
      in_list = true;
      continue;
    }
    std::smatch m;
    if (in_list && std::regex_search(line, m, command)) {
      out.push_back(m[1]);
    } else if (in_list && line.empty()) {
      in_list = false;
    }
  }
  return out;
}

// A binary's flags and commands, from its own --help and, recursively, each
// subcommand's ("pacerctl fault set").
struct Cli {
  std::set<std::string> flags;
  std::vector<std::string> commands;  // "status", "fault set", ...
};
void Collect(const std::vector<std::string>& argv, const std::string& prefix, Cli* cli) {
  const std::string help = Help(argv);
  for (const auto& f : FlagsIn(help)) cli->flags.insert(f);
  for (const auto& sub : SubcommandsIn(help)) {
    const std::string name = prefix.empty() ? sub : prefix + " " + sub;
    cli->commands.push_back(name);
    std::vector<std::string> next = argv;
    next.push_back(sub);
    Collect(next, name, cli);
  }
}
Cli CliOf(const std::string& path) {
  Cli cli;
  Collect({path}, "", &cli);
  return cli;
}

// Whether `text` names `word` whole: not inside a longer flag or word
// (--progress is not found in --progress-interval).
bool Names(const std::string& text, const std::string& word) {
  auto part = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !part(text[at - 1])) && (end == text.size() || !part(text[end]))) return true;
  }
  return false;
}

TEST(HelpTest, EveryFlagOfEveryBinaryIsDocumented) {
  std::string readme;
  for (const char* doc : kSharedDocs) {
    const std::string text = Source(doc);
    ASSERT_FALSE(text.empty()) << doc;
    readme += text + "\n";
  }
  for (const Binary& b : kBinaries) {
    EXPECT_NE(Help({b.path}).find("Exit codes"), std::string::npos) << b.path << " --help";
    const Cli cli = CliOf(b.path);
    EXPECT_GT(cli.flags.size(), 3u) << b.path << ": no flags read from --help";
    const std::string module = Source(b.readme);
    ASSERT_FALSE(module.empty()) << b.readme;
    for (const auto& f : cli.flags) {
      EXPECT_TRUE(Names(readme, f) || Names(module, f))
          << b.path << " " << f << " is documented in none of the manuals nor " << b.readme;
    }
    const std::string name = std::filesystem::path(b.path).filename().string();
    for (const auto& c : cli.commands) {
      EXPECT_TRUE(Names(readme, name + " " + c) || Names(module, name + " " + c))
          << "'" << name << " " << c << "' is documented in none of the manuals nor " << b.readme;
    }
  }
}

// Flags the READMEs name that belong to other programs, each with whose.
const std::map<std::string, std::string> kOtherProgramsFlags = {
    {"--now", "systemctl enable --now"},
    {"--config.file", "prometheus"},
    {"--storage.tsdb.path", "prometheus"},
    {"--web.listen-address", "prometheus"},
    {"--build", "cmake --build (the packaged example)"},
};

TEST(HelpTest, EveryDocumentedFlagExists) {
  // Every flag of the binaries, the benchmarks' binaries and the scripts
  // (whose --help is their header).
  std::set<std::string> known;
  for (const Binary& b : kBinaries) {
    const Cli cli = CliOf(b.path);
    known.insert(cli.flags.begin(), cli.flags.end());
  }
  for (const char* bench : {PACER_SIM_BIN}) {
    const auto flags = FlagsIn(Help({bench}));
    known.insert(flags.begin(), flags.end());
  }
  static const std::regex token(R"(--[a-zA-Z][a-zA-Z0-9.-]*[a-zA-Z0-9])");
  size_t scripts = 0;
  for (const char* folder : {"deploy", "tests", "tests/fuzz", "bench/checkpoint", "bench/overlap",
                             "bench/stragglers", "bench/replication"}) {
    for (const auto& e : std::filesystem::directory_iterator(std::string(PACER_SOURCE_DIR) + "/" + folder)) {
      if (e.path().extension() != ".sh") continue;
      ++scripts;
      const std::string help = Help({"/bin/bash", e.path().string()});
      for (std::sregex_iterator it(help.begin(), help.end(), token), end; it != end; ++it) {
        known.insert(it->str());
      }
    }
  }
  EXPECT_GE(scripts, 5u);
  // The Python examples' flags (argparse: their add_argument calls).
  static const std::regex argument(R"re(add_argument\(\s*"(--[a-z][a-z0-9-]*)")re");
  size_t examples = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(PACER_SOURCE_DIR) +
                                                          "/worker/python/examples")) {
    if (e.path().extension() != ".py") continue;
    const std::string text = Source("worker/python/examples/" + e.path().filename().string());
    for (std::sregex_iterator it(text.begin(), text.end(), argument), end; it != end; ++it) {
      known.insert((*it)[1].str());
      ++examples;
    }
  }
  EXPECT_GE(examples, 5u);
  for (const auto& [flag, whose] : kOtherProgramsFlags) {
    EXPECT_EQ(known.count(flag), 0u) << flag << " is a Pacer flag: drop it from the exemptions";
  }
  std::set<std::string> readmes(std::begin(kSharedDocs), std::end(kSharedDocs));
  for (const Binary& b : kBinaries) readmes.insert(b.readme);
  std::set<std::string> documented;
  for (const auto& path : readmes) {
    const std::string text = Source(path);
    for (std::sregex_iterator it(text.begin(), text.end(), token), end; it != end; ++it) {
      // --worker-args-2: local-cluster.sh's --worker-args-I.
      const std::string flag = std::regex_replace(it->str(), std::regex("-[0-9]+$"), "-I");
      documented.insert(flag);
      EXPECT_TRUE(known.count(flag) > 0 || kOtherProgramsFlags.count(flag) > 0)
          << path << " documents " << it->str() << ", which no Pacer binary or script has";
    }
  }
  for (const auto& [flag, whose] : kOtherProgramsFlags) {
    EXPECT_EQ(documented.count(flag), 1u) << flag << " (" << whose << ") is no longer documented";
  }
}

// The fields of `struct NAME {...}` in a header: the last identifier of
// each member declaration (comments dropped, declarations may span lines).
std::vector<std::string> FieldsOf(const std::string& header, const std::string& name) {
  const std::string text = Source(header);
  // "struct NAME {", or "struct NAME : BASE {" (the base is checked as its own).
  size_t start = text.find("\nstruct " + name + " {");
  if (start == std::string::npos) start = text.find("\nstruct " + name + " : ");
  EXPECT_NE(start, std::string::npos) << name << " not in " << header;
  if (start == std::string::npos) return {};
  const size_t end = text.find("\n};", start);
  std::string body;
  std::istringstream in(text.substr(start, end - start));
  std::getline(in, body);  // "struct NAME {"
  body.clear();
  for (std::string line; std::getline(in, line);) {
    if (const auto c = line.find("//"); c != std::string::npos) line.resize(c);
    body += line + " ";
  }
  std::vector<std::string> fields;
  static const std::regex last(R"(([A-Za-z_][A-Za-z0-9_]*)\s*$)");
  std::istringstream decls(body);
  for (std::string d; std::getline(decls, d, ';');) {
    // Drop the initializer: "= value" or "{value}" after the name.
    if (const auto eq = d.find(" = "); eq != std::string::npos) d.resize(eq);
    if (!d.empty() && d.find_last_of('}') != std::string::npos && d.rfind('{') != std::string::npos &&
        d.find('(') == std::string::npos) {
      d.resize(d.rfind('{'));
    }
    std::smatch m;
    if (std::regex_search(d, m, last) && d.find_first_not_of(' ') != std::string::npos) {
      fields.push_back(m[1]);
    }
  }
  return fields;
}

// Each options struct a binary exposes. A field's flag is its name with '-'
// for '_' unless kFieldFlag says otherwise; kNoFlag names, with why, the
// fields that no flag sets.
struct OptionsStruct {
  const char* header;
  const char* name;
  const char* binary;
};
const OptionsStruct kOptions[] = {
    {"ps/shard_server.h", "ShardServerOptions", PACER_SERVER_BIN},
    {"ps/shard.h", "ShardOptions", PACER_SERVER_BIN},
    {"monitor/monitor.h", "MonitorOptions", PACER_MONITOR_BIN},
    {"monitor/policy.h", "PolicyOptions", PACER_MONITOR_BIN},
    {"monitor/policy.h", "BatchOptions", PACER_MONITOR_BIN},
    {"worker/trainer.h", "TrainerOptions", PACER_WORKER_BIN},
    {"worker/worker.h", "WorkerOptions", PACER_WORKER_BIN},
    {"worker/run/launcher.h", "LaunchOptions", PACER_RUN_BIN},
};

const std::map<std::string, std::string> kFieldFlag = {
    {"ShardServerOptions.heartbeat_interval", "--heartbeat-ms"},
    {"ShardServerOptions.faults", "--faults"},
    {"ShardOptions.check_crc", "--no-crc"},
    {"ShardOptions.safeguards", "--unsafe-disable"},
    {"ShardOptions.apply_updates", "--no-apply"},
    {"ShardOptions.monitor_key", "--allowed-keys"},  // the key named 'monitor'
    {"MonitorOptions.optimizer_settings", "--lr"},  // and the other optimizer flags
    {"MonitorOptions.time_cap_seconds", "--time-cap"},
    {"MonitorOptions.safeguards", "--unsafe-disable"},
    {"MonitorOptions.heartbeat_interval_ms", "--heartbeat-ms"},
    {"MonitorOptions.eval_interval_seconds", "--eval-interval"},
    {"MonitorOptions.eval_interval_clocks", "--eval-every-clocks"},
    {"MonitorOptions.shard_resend", "--shard-resend-ms"},
    {"MonitorOptions.operator_keys", "--allowed-keys"},  // the keys named 'operator...'
    {"MonitorOptions.faults", "--faults"},
    {"MonitorOptions.base_faults", "--faults"},
    {"PolicyOptions.kind", "--policy"},
    {"PolicyOptions.interval", "--policy-interval"},
    {"PolicyOptions.catch_up_iterations", "--catch-up"},
    {"BatchOptions.b_min", "--min-batch"},
    {"BatchOptions.b_max", "--max-batch"},
    {"WorkerOptions.dataset_dir", "--dataset"},
    {"WorkerOptions.model", "--model"},  // and --layers, --cnn-channels
    {"TrainerOptions.live_progress", "--progress"},
    {"TrainerOptions.safeguards", "--unsafe-disable"},
    {"TrainerOptions.param_groups", "--param-group"},  // repeatable, one group each
    {"TrainerOptions.rank_hint", "--rank"},
    {"WorkerOptions.local_optimizer", "--local-optimizer"},  // and --local-settings
    {"LaunchOptions.role", "--serve"},  // and --join
    {"LaunchOptions.job_flags", "--mode"},  // and the job's other flags
    {"LaunchOptions.worker_args", "--worker-args-of"},
    {"LaunchOptions.out_dir", "--out"},
    {"LaunchOptions.show_output", "--quiet"},
};

const std::map<std::string, std::string> kNoFlag = {
    // Nested options: checked as their own struct above.
    {"ShardServerOptions.shard", "ShardOptions"},
    {"MonitorOptions.policy", "PolicyOptions"},
    {"PolicyOptions.batch", "BatchOptions"},
    // Set by the binary from other settings.
    {"ShardServerOptions.cancel", "SIGTERM while registering"},
    {"PolicyOptions.mode", "MonitorOptions.mode (--mode)"},
    {"TrainerOptions.outer", "pacer.torch's distribute(outer=); pacer-worker's is the job's"},
    {"BatchOptions.global_batch", "MonitorOptions.global_batch (--global-batch)"},
    {"ShardOptions.registry", "made by the process; served by --metrics-addr"},
    {"ShardOptions.metric_labels", "set by the shard for a range served since a promotion"},
    {"MonitorOptions.registry", "made by the process; served by --metrics-addr"},
    {"TrainerOptions.registry", "made by the process; served by --metrics-addr"},
    {"TrainerOptions.faults", "made by the process from --faults"},
    {"TrainerOptions.optimizer",
     "set by the program (pacer.torch: its torch optimizer); pacer-worker declares none"},
    // Timing the tests and the in-process cluster shorten; fixed in a real run.
    {"MonitorOptions.save_interval", "the monitor saves its state every 0.5 s"},
    // The policy's inner constants, tuned in bench/stragglers (pacer-sim);
    // not a user's knob.
    {"PolicyOptions.imbalance_open", "tuned constant"},
    {"PolicyOptions.imbalance_close", "tuned constant"},
    {"PolicyOptions.min_iterations", "tuned constant"},
    {"PolicyOptions.level_shift_at_once", "tuned constant"},
    {"PolicyOptions.warmup_reports", "tuned constant"},
    {"PolicyOptions.shift_min_iterations", "tuned constant"},
    {"PolicyOptions.fixed_cost_samples", "fitted by the policy; a test's starting point"},
    {"PolicyOptions.probe", "tuned constant"},
    {"PolicyOptions.probe_rounds", "tuned constant"},
    {"PolicyOptions.catch_up_floor", "tuned constant"},
    {"PolicyOptions.catch_up_blocking_floor", "tuned constant"},
    {"LaunchOptions.command", "the workers' command, after --"},
    // Hooks for programs that embed a worker (tests).
    {"TrainerOptions.on_registered", "hook"},
    {"WorkerOptions.before_iteration", "hook"},
    {"TrainerOptions.on_push_acked", "hook"},
    {"TrainerOptions.evaluate", "set by the program (pacer-worker: the test set, --test-limit)"},
};

TEST(HelpTest, EveryOptionsFieldHasAFlagOrIsExempt) {
  std::map<std::string, std::set<std::string>> flags;  // by binary
  std::set<std::string> fields;
  for (const OptionsStruct& o : kOptions) {
    if (!flags.count(o.binary)) flags[o.binary] = CliOf(o.binary).flags;
    const auto names = FieldsOf(o.header, o.name);
    EXPECT_GT(names.size(), 3u) << o.name << ": no fields read from " << o.header;
    for (const std::string& field : names) {
      const std::string key = std::string(o.name) + "." + field;
      fields.insert(key);
      if (kNoFlag.count(key)) continue;
      std::string flag = "--" + field;
      std::replace(flag.begin(), flag.end(), '_', '-');
      if (auto it = kFieldFlag.find(key); it != kFieldFlag.end()) flag = it->second;
      EXPECT_EQ(flags[o.binary].count(flag), 1u)
          << key << ": " << o.binary << " has no " << flag
          << " (give it a flag, or name it in kFieldFlag or kNoFlag with why)";
    }
  }
  for (const auto* table : {&kFieldFlag, &kNoFlag}) {
    for (const auto& [key, why] : *table) {
      EXPECT_EQ(fields.count(key), 1u) << key << " is no options field: drop it from the list";
    }
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

// Bad optimizer settings are refused at start, with torch's reason, exit 2.
TEST(UsageTest, BadOptimizerSettingsAreAUsageErrorThatSaysWhy) {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--optimizer", "rmsprop"}, "unknown optimizer 'rmsprop'"},
      {{"--lr", "-0.1"}, "invalid learning rate"},
      {{"--optimizer", "adam", "--beta1", "1"}, "beta parameter at index 0"},
      {{"--optimizer", "adamw", "--beta2", "-0.5"}, "beta parameter at index 1"},
      {{"--optimizer", "adam", "--eps", "-1e-8"}, "invalid epsilon"},
      {{"--weight-decay", "-1"}, "invalid weight_decay"},
      {{"--nesterov", "--momentum", "0"}, "Nesterov momentum requires"},
      {{"--optimizer", "adagrad", "--lr-decay", "-1"}, "invalid lr_decay"},
  };
  for (const auto& [flags, why] : cases) {
    std::vector<std::string> args = {PACER_MONITOR_BIN};
    args.insert(args.end(), flags.begin(), flags.end());
    auto p = Process::Start(args, dir.path(), "optimizer");
    EXPECT_EQ(p->Wait(seconds(10)), 2) << flags[0] << ": " << p->Stderr();
    EXPECT_NE(p->Stderr().find(why), std::string::npos) << p->Stderr();
  }
  // A bad --param-group of the worker too.
  auto w = Process::Start({PACER_WORKER_BIN, "--monitor", "tcp://127.0.0.1:1", "--param-group",
                           "no_decay:*.bias:weight_decay=zero"},
                          dir.path(), "param-group");
  EXPECT_EQ(w->Wait(seconds(10)), 2) << w->Stderr();
  EXPECT_NE(w->Stderr().find("weight_decay=zero: not a number"), std::string::npos) << w->Stderr();
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
