#include "tests/process/process.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pacer::test {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}


std::optional<int> RunLogged(const std::vector<std::string>& argv, const std::string& log,
                             std::chrono::milliseconds timeout) {
  ProcessOptions o;
  o.log = log;
  o.search_path = true;
  auto p = Process::Start(argv, "", argv.empty() ? "" : argv[0], o);
  const auto rc = p->Wait(timeout);
  if (!rc || *rc < 0) return std::nullopt;
  return rc;  // a process still running is killed as p goes
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pacer-test.XXXXXX").string();
  path_ = mkdtemp(tmpl.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  if (std::getenv("PACER_KEEP_TEST_LOGS") == nullptr) std::filesystem::remove_all(path_, ec);
}

}  // namespace pacer::test
