// pacer-run's launcher: one Pacer job on this machine from one command, in
// the spirit of torchrun. It starts a monitor and shards (unless it joins a
// job that runs elsewhere), then the workers, each running the user's
// command with the monitor's address in its environment; shows every
// process's lines with its role in front; and stops everything it started,
// and only that, when the job ends, when a worker fails, or when it is
// interrupted. Every process it starts is in a process group of its own
// (stopping one signals its group: what it started there stops with it)
// and is killed when the launcher dies (PR_SET_PDEATHSIG), so that a Ctrl-C
// reaches the launcher alone, which stops them in order.
#ifndef PACER_WORKER_RUN_LAUNCHER_H_
#define PACER_WORKER_RUN_LAUNCHER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ps/base/clock.h"

namespace pacer::run {

// What a launcher starts: kLocal a whole job (monitor, shards, workers);
// kServe the monitor and shards only, for workers that join from other
// machines; kJoin workers only, of the job at LaunchOptions::join.
enum class Role { kLocal, kServe, kJoin };

struct LaunchOptions {
  Role role = Role::kLocal;
  // The monitor of the job to join (kJoin): tcp://HOST:PORT.
  std::string join;
  // Workers this launcher starts (kLocal, kJoin); with kServe, the workers
  // the job waits for before it starts (all the joins' together).
  uint32_t workers = 3;
  uint32_t shards = 2;
  // The address the monitor and the shards listen on: 127.0.0.1 for a job on
  // one machine; with kServe, one the other machines reach.
  std::string host = "127.0.0.1";
  // The job's settings as pacer-monitor flags (--mode bsp, ...), then the
  // extra flags for the monitor, every shard and every worker; a flag given
  // twice takes its last value, so these override the launcher's defaults.
  std::vector<std::string> job_flags;
  std::vector<std::string> monitor_args;
  std::vector<std::string> shard_args;
  // Extra arguments for the I-th worker this launcher starts (from 0).
  std::map<uint32_t, std::vector<std::string>> worker_args;
  // The workers' command (after --); a bare name that is one of Pacer's
  // programs (pacer-worker) is found as pacer-monitor is (bin_dir), any
  // other bare name in PATH.
  std::vector<std::string> command;
  // Where every process's output and log go (NAME.out, NAME.log); "": a
  // temporary folder, removed at the end unless something failed.
  std::string out_dir;
  // Shard I checkpoints to DATA_DIR/shardI ("": no checkpoints).
  std::string data_dir;
  // Where pacer-monitor, pacer-server and pacer-worker are looked for
  // first; then beside this program (installed), then in the build tree's
  // monitor/, ps/ and worker/.
  std::string bin_dir;
  // Show the processes' lines (false: only the launcher's own and the end).
  bool show_output = true;
  // How long the others may take to leave by themselves once the job has
  // ended, and to stop after SIGTERM, before SIGKILL.
  Duration grace = std::chrono::seconds(10);
  // How long the monitor and each shard may take to print where they listen.
  Duration start_timeout = std::chrono::seconds(30);
};

// Runs the job to its end. Returns the launcher's exit code: 0 when the job
// ended and every worker left without an error; 1 when a process failed
// (its last lines shown first) or the monitor ended the job with an error;
// 130 after `interrupt` was set (SIGINT or SIGTERM).
int Launch(const LaunchOptions& options, const std::atomic<bool>& interrupt);

}  // namespace pacer::run

#endif  // PACER_WORKER_RUN_LAUNCHER_H_
