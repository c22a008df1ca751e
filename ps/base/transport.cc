#include "ps/base/transport.h"

namespace pacer {

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
