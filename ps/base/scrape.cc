#include "ps/base/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <sstream>

namespace pacer {

HttpResponse HttpGet(const std::string& address, const std::string& path,
                     const std::vector<std::string>& headers) {
  HttpResponse r;
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return r;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect() too
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
  std::optional<double> best;
  size_t best_labels = 0;
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
    const double value = std::stod(line.substr(line.rfind(' ') + 1));
    // Of the matches, the series with the fewest labels (a shard's own, not
    // a promoted range's, which also has range="...").
    size_t n = 0;
    for (size_t at = label_part.find("=\""); at != std::string::npos;
         at = label_part.find("=\"", at + 2)) {
      ++n;
    }
    if (!best || n < best_labels) {
      best = value;
      best_labels = n;
    }
  }
  return best;
}

}  // namespace pacer
