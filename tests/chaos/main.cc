// pacer-chaos: runs a chaos scenario (scenario.h) against a local cluster
// of the real binaries on 127.0.0.1 and reports pass or fail for each
// invariant (runner.h).
//
//   pacer-chaos SCENARIO.yaml [--out DIR] [--seed N] [--bin-dir DIR] [--netns]
//
// --netns runs every process in its own network namespace (netns.h) and
// partitions with iptables; without root or iptables it exits 77.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ps/base/cli.h"
#include "tests/chaos/runner.h"
#include "tests/chaos/scenario.h"

int main(int argc, char** argv) {
  std::string scenario_path, out, bin_dir;
  uint64_t seed = 1;
  CLI::App app{
      "pacer-chaos: runs a chaos scenario (YAML: the cluster, a timeline of faults, the "
      "invariants) against a local cluster on 127.0.0.1 and reports PASS or FAIL for "
      "each invariant. Scenarios ship in deploy/chaos/.",
      "pacer-chaos"};
  app.add_option("SCENARIO", scenario_path, "The scenario file (YAML)")->required();
  app.add_option("--out", out,
                 "Directory for every process's logs and the journals (default: "
                 "a new one under /tmp)");
  app.add_option("--seed", seed, "Seed of every process's fault decisions")
      ->capture_default_str()
      // Not PACER_SEED: the monitor's --seed seeds the model and the data.
      ->envname("PACER_CHAOS_SEED");
  bool netns = false;
  app.add_flag("--netns", netns,
               "Real-network mode: every process in its own network namespace, joined to the "
               "others only (veth pairs to a bridge in a hub namespace, no link to the host's, "
               "no default route), partitions made with iptables. Needs root and iptables; "
               "without them the run is skipped with exit code 77");
  app.add_option("--bin-dir", bin_dir,
                 "Where pacer-monitor, pacer-server, pacer-worker and "
                 "pacerctl are (default: next to pacer-chaos, or the build "
                 "tree's folders)");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  pacer::SetupLogging("chaos", "info");
  std::ifstream in(scenario_path);
  if (!in) {
    std::fprintf(stderr, "pacer-chaos: cannot read %s\n", scenario_path.c_str());
    return pacer::kExitUsage;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto s = pacer::chaos::ParseScenario(text.str());
  if (!s.ok()) {
    std::fprintf(stderr, "pacer-chaos: %s: %s\n", scenario_path.c_str(),
                 std::string(s.status().message()).c_str());
    return pacer::kExitUsage;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return pacer::kExitFailure;
  self[n] = '\0';
  if (bin_dir.empty()) bin_dir = std::filesystem::path(self).parent_path().string();
  if (out.empty()) {
    char tmpl[] = "/tmp/pacer-chaos.XXXXXX";
    out = mkdtemp(tmpl);
  }
  std::signal(SIGINT, [](int) { pacer::chaos::g_interrupted = true; });
  std::signal(SIGTERM, [](int) { pacer::chaos::g_interrupted = true; });
  try {
    pacer::chaos::Runner runner(*s, out, bin_dir, seed, netns);
    return runner.Run();  // its destructor kills what it started, then the namespaces go
  } catch (const pacer::chaos::Interrupted&) {
    std::fprintf(stderr, "pacer-chaos: interrupted; processes stopped (logs in %s)\n", out.c_str());
    return pacer::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pacer-chaos: %s; processes stopped (logs in %s)\n", e.what(),
                 out.c_str());
    return pacer::kExitFailure;
  }
}
