#include "tests/process_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace pacer::test {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Process> Process::Start(const std::vector<std::string>& argv,
                                        const std::string& dir, const std::string& name) {
  std::unique_ptr<Process> p(new Process());
  p->name_ = name;
  p->out_path_ = dir + "/" + name + ".out";
  p->err_path_ = dir + "/" + name + ".err";
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(p->out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(p->err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  p->pid_ = pid;
  return p;
}

Process::~Process() {
  if (Running()) {
    Signal(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

std::string Process::Stdout() const { return ReadFile(out_path_); }
std::string Process::Stderr() const { return ReadFile(err_path_); }

std::optional<std::string> Process::WaitForLine(const std::string& prefix,
                                                std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    std::istringstream in(Stdout());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

std::optional<int> Process::Wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool Process::Running() { return !Wait(std::chrono::milliseconds(0)).has_value(); }

void Process::Signal(int sig) {
  if (!exit_code_) kill(pid_, sig);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pacer-test.XXXXXX").string();
  path_ = mkdtemp(tmpl.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  if (std::getenv("PACER_KEEP_TEST_LOGS") == nullptr) std::filesystem::remove_all(path_, ec);
}

HttpResponse HttpGet(const std::string& address, const std::string& path,
                     const std::vector<std::string>& headers) {
  HttpResponse r;
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  std::string raw;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + address + "\r\n";
    for (const auto& h : headers) req += h + "\r\n";
    req += "\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  auto sep = raw.find("\r\n\r\n");
  if (sep == std::string::npos || raw.rfind("HTTP/", 0) != 0) return r;
  auto space = raw.find(' ');
  r.status = std::atoi(raw.c_str() + space + 1);
  r.body = raw.substr(sep + 4);
  return r;
}

std::string FetchMetrics(const std::string& address) {
  HttpResponse r = HttpGet(address, "/metrics");
  return r.status == 200 ? r.body : "";
}

std::string UrlEncode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::vector<std::string>& labels) {
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind(name, 0) != 0) continue;
    char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    std::string label_part;
    if (next == '{') label_part = line.substr(name.size(), line.find('}') - name.size() + 1);
    bool all = true;
    for (const auto& l : labels) all &= label_part.find(l) != std::string::npos;
    if (!all) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

}  // namespace pacer::test
