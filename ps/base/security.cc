#include "ps/base/security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace pacer {
namespace {

constexpr size_t kZ85KeyChars = 40;
// Z85's alphabet (ZeroMQ RFC 32).
constexpr char kZ85Alphabet[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

absl::Status LineError(const std::string& path, int line, const std::string& what) {
  return absl::InvalidArgumentError(path + ":" + std::to_string(line) + ": " + what);
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

absl::StatusOr<CurveKeyPair> GenerateKeyPair() {
  if (!CurveAvailable()) {
    return absl::FailedPreconditionError("this libzmq has no CURVE (built without libsodium)");
  }
  char pub[kZ85KeyChars + 1] = {}, sec[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{pub, sec};
}

bool IsZ85Key(const std::string& key) {
  if (key.size() != kZ85KeyChars) return false;
  for (char c : key) {
    if (c == '\0' || std::strchr(kZ85Alphabet, c) == nullptr) return false;
  }
  return true;
}

absl::Status WriteKeyFiles(const CurveKeyPair& keys, const std::string& prefix,
                           const std::string& name) {
  const std::string key_path = prefix + ".key", pub_path = prefix + ".pub";
  const int fd = ::open(key_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError("cannot create " + key_path + ": " +
                                         std::strerror(errno) +
                                         (errno == EEXIST ? " (not overwriting a key)" : ""));
  }
  const std::string body = "# Pacer CURVE keypair (pacerctl keygen). Keep this file secret.\n"
                           "public-key = \"" + keys.public_key + "\"\n"
                           "secret-key = \"" + keys.secret_key + "\"\n";
  const bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return absl::InternalError("cannot write " + key_path + ": " + std::strerror(errno));
  std::ofstream pub(pub_path, std::ios::trunc);
  pub << "# Pacer public key: add this line to every process's allowed-keys file.\n"
      << (name.empty() ? "" : name + " ") << keys.public_key << "\n";
  pub.close();
  if (!pub) return absl::InternalError("cannot write " + pub_path);
  return absl::OkStatus();
}

absl::StatusOr<CurveKeyPair> ReadKeyFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError("cannot read key file " + path + ": " + std::strerror(errno));
  }
  // Its owner, and at most its group reading (a Kubernetes Secret mounted
  // for a non-root pod is root's, readable by the pod's fsGroup).
  if ((st.st_mode & 037) != 0) {
    return absl::PermissionDeniedError("key file " + path +
                                       " may be read by others; chmod 600 it");
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read key file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseKeyFile(text.str(), path);
}

absl::StatusOr<CurveKeyPair> ParseKeyFile(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  CurveKeyPair keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = Trim(line);
    if (line.empty() || line == "#" || line.rfind("# ", 0) == 0) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return LineError(path, n, "expected NAME = \"KEY\"");
    const std::string name = Trim(line.substr(0, eq));
    std::string value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (!IsZ85Key(value)) return LineError(path, n, "not a 40-character Z85 key");
    if (name == "public-key") {
      keys.public_key = value;
    } else if (name == "secret-key") {
      keys.secret_key = value;
    } else {
      return LineError(path, n, "unknown setting '" + name + "'");
    }
  }
  if (keys.public_key.empty() || keys.secret_key.empty()) {
    return absl::InvalidArgumentError("key file " + path +
                                      " needs both public-key and secret-key");
  }
  // A public key that is not the secret key's would be allowed in by peers
  // whose handshakes then fail: refuse the file instead.
  char derived[kZ85KeyChars + 1] = {};
  if (CurveAvailable() && zmq_curve_public(derived, keys.secret_key.c_str()) == 0 &&
      keys.public_key != derived) {
    return absl::InvalidArgumentError("key file " + path +
                                      ": public-key is not the secret key's public key");
  }
  return keys;
}

absl::StatusOr<std::vector<AllowedKey>> ReadAllowedKeys(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError("cannot read allowed-keys file " + path);
  std::stringstream text;
  text << file.rdbuf();
  return ParseAllowedKeys(text.str(), path);
}

absl::StatusOr<std::vector<AllowedKey>> ParseAllowedKeys(const std::string& text,
                                                         const std::string& path) {
  std::istringstream in(text);
  std::vector<AllowedKey> keys;
  std::set<std::string> names;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    // '#' is also a Z85 character: a comment line starts with "# " (or is
    // "#" alone); a key may start with '#'.
    const std::string trimmed = Trim(line);
    if (trimmed == "#" || trimmed.rfind("# ", 0) == 0) continue;
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string w; fields >> w;) words.push_back(w);
    if (words.empty()) continue;
    if (words.size() > 2) return LineError(path, n, "expected [NAME] KEY");
    AllowedKey k;
    k.public_key = words.back();
    if (words.size() == 2) k.name = words[0];
    if (!IsZ85Key(k.public_key)) return LineError(path, n, "not a 40-character Z85 key");
    if (!k.name.empty() && !names.insert(k.name).second) {
      return LineError(path, n, "name '" + k.name + "' given twice");
    }
    keys.push_back(std::move(k));
  }
  return keys;
}

std::string FindKey(const std::vector<AllowedKey>& keys, const std::string& name) {
  for (const AllowedKey& k : keys) {
    if (k.name == name) return k.public_key;
  }
  return "";
}

bool IsOperatorName(const std::string& name) {
  return name == "operator" || name.rfind("operator-", 0) == 0;
}

}  // namespace pacer
