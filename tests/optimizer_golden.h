// Reads the torch.optim golden runs (tests/optimizer/golden/*.txt, written
// by tests/optimizer/make_golden.py; the format is described there).
#ifndef PACER_TESTS_OPTIMIZER_GOLDEN_H_
#define PACER_TESTS_OPTIMIZER_GOLDEN_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/optimizer_config.h"
#include "ps/table.h"

namespace pacer {

struct GoldenRun {
  struct Tensor {
    std::string name;
    uint32_t size = 0;
    uint32_t group = 0;
  };
  struct Step {
    std::vector<float> lr;    // per group
    std::vector<float> grad;  // flat
  };
  std::string name;
  OptimizerKind kind = OptimizerKind::kSgd;
  std::vector<Tensor> tensors;
  std::vector<GroupSettings> groups;  // torch's param_groups, group 0 first
  std::vector<float> init;
  std::vector<Step> steps;                   // steps[t - 1]
  std::map<int, std::vector<float>> params;  // after step t

  // The table's config: group 0's settings as the job's defaults, the others
  // as declared groups named "group1", "group2", ...
  TableConfig Config() const {
    TableConfig c;
    c.kind = kind;
    c.defaults = Resolve(DefaultSettings(kind), groups.at(0));
    for (size_t i = 1; i < groups.size(); ++i) {
      GroupSettings g = groups[i];
      g.name = "group" + std::to_string(i);
      c.groups.push_back(g);
    }
    return c;
  }
  size_t floats() const { return init.size(); }
};

// The golden files' directory in the source tree.
inline std::string GoldenDir() { return std::string(PACER_SOURCE_DIR) + "/tests/optimizer/golden"; }

inline std::vector<std::string> GoldenCases() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(GoldenDir())) {
    if (e.path().extension() == ".txt") out.push_back(e.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline absl::StatusOr<GoldenRun> ReadGolden(const std::string& name) {
  const std::string path = GoldenDir() + "/" + name + ".txt";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot open " + path);
  GoldenRun run;
  std::string line;
  auto floats = [](std::istringstream& s) {
    std::vector<float> v;
    std::string tok;
    while (s >> tok && tok != "grad") v.push_back(std::strtof(tok.c_str(), nullptr));
    return v;
  };
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string what;
    s >> what;
    if (what == "case") {
      s >> run.name;
    } else if (what == "optimizer") {
      std::string kind;
      s >> kind;
      auto k = ParseOptimizerKind(kind);
      if (!k.ok()) return k.status();
      run.kind = *k;
    } else if (what == "tensor") {
      GoldenRun::Tensor t;
      s >> t.name >> t.size >> t.group;
      run.tensors.push_back(t);
    } else if (what == "group") {
      size_t index = 0;
      std::string settings;
      s >> index >> settings;
      auto g = ParseGroupSettings(settings);
      if (!g.ok()) return g.status();
      if (index != run.groups.size()) return absl::DataLossError(path + ": groups out of order");
      run.groups.push_back(*g);
    } else if (what == "init") {
      run.init = floats(s);
    } else if (what == "step") {
      int t = 0;
      s >> t;
      GoldenRun::Step step;
      step.lr = floats(s);  // stops at "grad"
      step.grad = floats(s);
      if (t != static_cast<int>(run.steps.size()) + 1) {
        return absl::DataLossError(path + ": steps out of order");
      }
      run.steps.push_back(std::move(step));
    } else if (what == "param") {
      int t = 0;
      s >> t;
      run.params[t] = floats(s);
    }
  }
  size_t total = 0;
  for (const auto& t : run.tensors) total += t.size;
  if (run.groups.empty() || run.steps.empty() || run.params.empty() || total != run.init.size()) {
    return absl::DataLossError(path + " is incomplete");
  }
  for (const auto& st : run.steps) {
    if (st.grad.size() != total || st.lr.size() != run.groups.size()) {
      return absl::DataLossError(path + ": a step does not add up");
    }
  }
  return run;
}

// Whether `got` is within 1e-5 relative (or 1e-7 absolute) of `want`.
inline bool GoldenClose(float got, float want) {
  const float diff = std::fabs(got - want);
  return diff <= 1e-7f || diff <= 1e-5f * std::fabs(want);
}

}  // namespace pacer

#endif  // PACER_TESTS_OPTIMIZER_GOLDEN_H_
