// pacer-run: runs a training script (or pacer-worker, or any worker program)
// as the workers of a Pacer job, with the job's monitor and shards, from one
// command. Flags in worker/run/launcher.h's LaunchOptions.
#include <cstdio>
#include <sstream>

#include "ps/base/cli.h"
#include "worker/run/launcher.h"

namespace {

std::vector<std::string> Words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  pacer::run::LaunchOptions o;
  CLI::App app{
      "pacer-run: runs a command as the workers of a Pacer job. By default it starts the job on "
      "this machine (a monitor, --shards shards, then --workers copies of the command), shows "
      "every process's lines with its role in front, prints a table of the workers at the end, "
      "and stops everything it started when the job ends, when a worker fails or on Ctrl-C. "
      "Each worker finds the monitor in PACER_MONITOR (pacer.torch's init() and pacer-worker "
      "read it) and its launch index in PACER_LOCAL_WORKER. Across machines: one "
      "'pacer-run --serve --host ADDRESS' starts the monitor and shards and prints the address; "
      "each machine of workers runs 'pacer-run --join tcp://ADDRESS:PORT --workers N -- "
      "COMMAND'.\n\n  pacer-run --workers 3 --shards 2 --time-cap 60 -- /usr/bin/python3 "
      "train.py\n  pacer-run --workers 3 -- pacer-worker",
      "pacer-run"};
  bool serve = false, quiet = false;
  double grace_s = 10, start_timeout_s = 30;
  std::string monitor_args, shard_args;
  std::vector<std::string> worker_args_of;
  app.add_option("--workers", o.workers,
                 "Workers to start; with --serve, the workers the job waits for in all (those "
                 "of every --join together)")
      ->capture_default_str()
      ->check(pacer::Positive());
  app.add_option("--shards", o.shards, "Shards to start (not with --join)")
      ->capture_default_str()
      ->check(pacer::Positive());
  auto* join = app.add_option("--join", o.join,
                              "Start only workers, of the job whose monitor is at this address "
                              "(tcp://HOST:PORT, as pacer-run --serve printed it)")
                   ->check(pacer::PeerAddress());
  app.add_flag("--serve", serve,
               "Start only the monitor and the shards, print 'monitor ADDRESS' on stdout, and "
               "serve until the job ends")
      ->excludes(join);
  app.add_option("--host", o.host,
                 "The address the monitor and the shards listen on; with --serve one that the "
                 "workers' machines reach")
      ->capture_default_str();
  // The job's settings, with the monitor's names (pacer-monitor --help),
  // passed to the monitor as given.
  struct JobFlag {
    const char* flag;
    const char* help;
    std::string value;
  };
  JobFlag job[] = {
      {"--mode",
       "The job's consistency mode: bsp, ssp, dssp, asp, backup, or local (rounds of local "
       "steps; their length: --monitor-args '--round-seconds S')",
       ""},
      {"--policy", "The straggler policy: fixed, adaptive-batch or pacer", ""},
      {"--global-batch", "B: the sum of the workers' batches", ""},
      {"--time-cap", "Stop after this many seconds of training", ""},
      {"--target-accuracy", "Stop at this test accuracy", ""},
      {"--replicas", "Backups of each shard's range", ""},
      {"--epochs", "Stop after this many epochs of the training set", ""},
  };
  for (JobFlag& j : job) {
    app.add_option(j.flag, j.value, j.help)->group("Job (pacer-monitor's flags)");
  }
  app.add_option("--monitor-args", monitor_args,
                 "More pacer-monitor flags, one string (a flag given twice takes the last value)");
  app.add_option("--shard-args", shard_args, "More pacer-server flags for every shard, one string");
  app.add_option("--worker-args-of", worker_args_of,
                 "I:ARGS: more arguments for the I-th worker started (from 0), e.g. "
                 "'2:--slowdown 4' (repeatable)")
      ->allow_extra_args(false);  // one value per --worker-args-of, so that -- ends the flags
  app.add_option("--out", o.out_dir,
                 "Keep every process's output (NAME.out) and log (NAME.log) in this folder "
                 "(default: a temporary one, removed after a clean run)");
  app.add_option("--data-dir", o.data_dir, "Shard I checkpoints to DIR/shardI (default: none)");
  app.add_option("--bin-dir", o.bin_dir,
                 "Where pacer-monitor, pacer-server and pacer-worker are (default: beside "
                 "pacer-run, or the build tree's)");
  app.add_flag("--quiet", quiet, "Show only pacer-run's own lines and the end of the run");
  app.add_option("--grace", grace_s,
                 "Seconds the processes may take to leave once the job ended, and to stop after "
                 "SIGTERM, before SIGKILL")
      ->capture_default_str()
      ->check(pacer::NonNegative());
  app.add_option("--start-timeout", start_timeout_s,
                 "Seconds the monitor and each shard may take to listen")
      ->capture_default_str()
      ->check(pacer::Positive());
  app.add_option("command", o.command, "The workers' command, after --");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;

  auto usage = [](const std::string& why) {
    std::fprintf(stderr, "pacer-run: %s\nRun with --help for usage.\n", why.c_str());
    return pacer::kExitUsage;
  };
  o.role = serve ? pacer::run::Role::kServe
           : o.join.empty() ? pacer::run::Role::kLocal
                            : pacer::run::Role::kJoin;
  if (serve && !o.command.empty()) return usage("--serve starts no workers: give no command");
  if (!serve && o.command.empty()) {
    return usage("no command: give the workers' command after --, e.g. "
                 "pacer-run -- /usr/bin/python3 train.py");
  }
  for (const JobFlag& j : job) {
    if (j.value.empty()) continue;
    if (o.role == pacer::run::Role::kJoin) {
      return usage(std::string(j.flag) + " is the job's, set where it is served, not with --join");
    }
    o.job_flags.push_back(j.flag);
    o.job_flags.push_back(j.value);
  }
  o.monitor_args = Words(monitor_args);
  o.shard_args = Words(shard_args);
  for (const std::string& spec : worker_args_of) {
    const auto colon = spec.find(':');
    uint32_t index = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      index = static_cast<uint32_t>(std::stoul(spec.substr(0, colon)));
    } catch (const std::exception&) {
      return usage("--worker-args-of '" + spec + "': expected I:ARGS, e.g. '2:--slowdown 4'");
    }
    if (index >= o.workers) {
      return usage("--worker-args-of '" + spec + "': there are only " +
                   std::to_string(o.workers) + " workers (from 0)");
    }
    auto words = Words(spec.substr(colon + 1));
    o.worker_args[index].insert(o.worker_args[index].end(), words.begin(), words.end());
  }
  o.show_output = !quiet;
  o.grace = pacer::FromSeconds(grace_s);
  o.start_timeout = pacer::FromSeconds(start_timeout_s);
  return pacer::run::Launch(o, pacer::StopOnSignals());
}
