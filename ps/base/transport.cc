#include "ps/base/transport.h"

namespace pacer {

std::string PeerAddressError(const std::string& value) {
  const std::string form = "expected tcp://HOST:PORT (or ipc://PATH), got '" + value + "'";
  if (value.rfind("ipc://", 0) == 0) return value.size() > 6 ? "" : form;
  if (value.rfind("tcp://", 0) != 0) return form;
  const size_t colon = value.rfind(':');
  if (colon <= 6 || colon + 1 >= value.size()) return form;
  const std::string port = value.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return form;
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535 ? "" : form + ": the port must be 1-65535";
}

absl::StatusOr<bool> Transport::Recv(Socket* socket, Frames* frames, TimePoint deadline) {
  for (;;) {
    absl::StatusOr<bool> got = socket->TryRecv(frames);
    if (!got.ok() || *got) return got;
    Socket* one[] = {socket};
    absl::StatusOr<std::vector<size_t>> ready = Poll(one, deadline);
    if (!ready.ok()) return ready.status();
    if (ready->empty()) return false;
  }
}

}  // namespace pacer
