// The transport moves multipart messages between processes and nothing else:
// it knows no message types. Two implementations: ZeroMQ (DEALER/ROUTER over
// TCP or ipc) and an in-process one for tests that run a whole cluster in one
// process.
#ifndef PACER_PS_BASE_TRANSPORT_H_
#define PACER_PS_BASE_TRANSPORT_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/base/clock.h"
#include "ps/base/frame.h"
#include "ps/base/security.h"

namespace pacer {

// One endpoint. A bound socket (ROUTER) receives messages whose frame 0 is
// the sending peer's routing id, and sends by putting that id in frame 0. A
// connected socket (DEALER) sends and receives bare messages.
// A socket is used by one thread at a time.
class Socket {
 public:
  virtual ~Socket() = default;
  // Queues `frames` for sending without blocking. Unavailable when the peer
  // is unknown or the send queue is full; the message is then dropped.
  virtual absl::Status Send(Frames frames) = 0;
  // Receives one message if one is ready. Returns false when none is.
  virtual absl::StatusOr<bool> TryRecv(Frames* frames) = 0;
  // The address this socket is bound or connected to, with an ephemeral port
  // resolved (e.g. "tcp://127.0.0.1:41327").
  virtual std::string address() const = 0;
};

// ZeroMQ CURVE on every socket (ps/base/security.h). Without a keypair: plain.
struct CurveOptions {
  CurveKeyPair keys;
  // Public keys (Z85) that may connect to this process's bound sockets; a
  // ZAP handler refuses every other one.
  std::vector<std::string> allowed;
  // Told of each refused peer (after the handshake, on ZeroMQ's thread
  // for ZAP): its public key (empty when it offered none, e.g. plain
  // ZeroMQ) and address, and why.
  std::function<void(const std::string& public_key, const std::string& address,
                     const std::string& why)>
      on_refused;
  bool enabled() const { return !keys.public_key.empty(); }
};

struct TransportOptions {
  // Messages above this many bytes (all frames) may be refused by the
  // transport itself; the wire layer checks its own, lower limit.
  size_t max_message_bytes = size_t{1} << 30;
  // Queue limit per socket, in messages.
  int high_water_mark = 1000;
  // ZeroMQ I/O threads (ZMQ_IO_THREADS); 0: one per two cores, at most 4. Each
  // connection lives on one of them, so a worker's connections to several
  // shards send, receive and (under CURVE) encrypt in parallel.
  int io_threads = 0;
  CurveOptions curve;
};

// The I/O threads `options` asks for, 0 resolved against this machine.
int IoThreads(const TransportOptions& options);

class Transport {
 public:
  virtual ~Transport() = default;
  // Binds a ROUTER socket. An address ending in ":0" gets an ephemeral port.
  virtual absl::StatusOr<std::unique_ptr<Socket>> Bind(const std::string& address) = 0;
  // Connects a DEALER socket. Connecting never waits for the peer: messages
  // queue until it is there (or are dropped, for the in-process transport).
  virtual absl::StatusOr<std::unique_ptr<Socket>> Connect(const std::string& address) = 0;
  // Waits until at least one of `sockets` (all from this transport) has a
  // message, or until `deadline` on the transport's clock. Returns the
  // indices of the ready sockets, empty on timeout.
  virtual absl::StatusOr<std::vector<size_t>> Poll(std::span<Socket* const> sockets,
                                                   TimePoint deadline) = 0;
  virtual const Clock* clock() const = 0;

  // CURVE: the public key of the server bound at `address`, which Connect
  // needs (it fails without one). Ignored without CURVE.
  virtual void SetServerKey(const std::string& address, const std::string& public_key) {
    (void)address;
    (void)public_key;
  }

  // Receives one message from `socket`, waiting until `deadline`. Returns
  // false on timeout. Cheaper than Poll for one socket (ZeroMQ: a blocking
  // receive with a timeout instead of zmq_poll).
  virtual absl::StatusOr<bool> Recv(Socket* socket, Frames* frames, TimePoint deadline);
};

// ZeroMQ transport. `clock` must be a real clock in practice: ZeroMQ's own
// waits run in real time, with timeouts computed from the clock's deadlines.
std::unique_ptr<Transport> MakeZmqTransport(const TransportOptions& options,
                                            const Clock* clock = Clock::Real());

// What is wrong with a peer's address ("" when nothing is): the ZeroMQ
// forms a process connects to, tcp://HOST:PORT (port 1-65535) or
// ipc://PATH. The command-line tools' --monitor check and pacer.torch's
// init() say the same.
std::string PeerAddressError(const std::string& address);

// In-process transport: all sockets made from one instance reach each other
// through addresses "mem://NAME" ("mem://*" or "mem://0" picks a fresh name).
// Thread-safe; waits go through `clock`, so a FakeClock drives them.
std::unique_ptr<Transport> MakeInProcTransport(const Clock* clock = Clock::Real());

}  // namespace pacer

#endif  // PACER_PS_BASE_TRANSPORT_H_
