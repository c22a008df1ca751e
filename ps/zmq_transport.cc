#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <cerrno>

#include "ps/transport.h"

namespace pacer {
namespace {

// Frames at least this big go to ZeroMQ zero-copy; smaller ones are copied,
// which is cheaper than the bookkeeping.
constexpr size_t kZeroCopyBytes = 16 * 1024;

void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ToZmq(const Frame& f) {
  if (f.size() >= kZeroCopyBytes && f.owner()) {
    auto* hint = new std::shared_ptr<const void>(f.owner());
    return zmq::message_t(const_cast<uint8_t*>(f.data()), f.size(), &ReleaseOwner, hint);
  }
  return zmq::message_t(f.data(), f.size());
}

class ZmqSocket final : public Socket {
 public:
  ZmqSocket(zmq::socket_t socket, std::string address)
      : socket_(std::move(socket)), address_(std::move(address)) {}

  absl::Status Send(Frames frames) override {
    if (frames.empty()) return absl::InvalidArgumentError("empty message");
    try {
      for (size_t i = 0; i < frames.size(); ++i) {
        auto flags = zmq::send_flags::dontwait;
        if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
        zmq::message_t m = ToZmq(frames[i]);
        auto sent = socket_.send(m, flags);
        if (!sent) {
          if (i == 0) return absl::UnavailableError("send queue full for " + address_);
          // A partial multipart send cannot be taken back; ZeroMQ discards
          // it when the last part never comes only on close, so finish it.
          for (size_t j = i; j < frames.size(); ++j) {
            zmq::message_t r = ToZmq(frames[j]);
            (void)socket_.send(r, j + 1 < frames.size() ? zmq::send_flags::sndmore
                                                        : zmq::send_flags::none);
          }
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return absl::UnavailableError("peer gone on " + address_);
      return absl::UnavailableError(std::string("zmq send: ") + e.what());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> TryRecv(Frames* frames) override {
    return ReadMessage(frames, zmq::recv_flags::dontwait);
  }

  // Blocking receive of one message for at most `timeout` (>= 0).
  absl::StatusOr<bool> RecvFor(Frames* frames, std::chrono::milliseconds timeout) {
    const int ms = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
    try {
      if (ms != rcvtimeo_) {
        socket_.set(zmq::sockopt::rcvtimeo, ms);
        rcvtimeo_ = ms;
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(std::string("zmq setsockopt: ") + e.what());
    }
    return ReadMessage(frames, zmq::recv_flags::none);
  }

  std::string address() const override { return address_; }
  zmq::socket_t& raw() { return socket_; }

 private:
  // Reads all parts of one message; `first` applies to the first part (the
  // rest of a message is already there once its first part is). False when
  // no message came (would block, timeout, or a signal).
  absl::StatusOr<bool> ReadMessage(Frames* frames, zmq::recv_flags first) {
    frames->clear();
    try {
      for (;;) {
        auto msg = std::make_shared<zmq::message_t>();
        auto got = socket_.recv(*msg, frames->empty() ? first : zmq::recv_flags::none);
        if (!got) return false;
        bool more = msg->more();
        const void* data = msg->data();
        size_t size = msg->size();
        frames->emplace_back(std::move(msg), data, size);
        if (!more) return true;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return false;
      return absl::UnavailableError(std::string("zmq recv: ") + e.what());
    }
  }

 private:
  zmq::socket_t socket_;
  std::string address_;
  int rcvtimeo_ = -1;  // ZMQ_RCVTIMEO last set, in ms
};

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(const TransportOptions& options, const Clock* clock)
      : options_(options), clock_(clock), context_(1) {}

  absl::StatusOr<std::unique_ptr<Socket>> Bind(const std::string& address) override {
    std::string zaddr = address;
    if (zaddr.size() > 2 && zaddr.compare(zaddr.size() - 2, 2, ":0") == 0) {
      zaddr = zaddr.substr(0, zaddr.size() - 1) + "*";
    }
    try {
      zmq::socket_t s(context_, zmq::socket_type::router);
      Configure(s);
      s.set(zmq::sockopt::router_mandatory, 1);
      s.bind(zaddr);
      std::string bound = s.get(zmq::sockopt::last_endpoint);
      return std::unique_ptr<Socket>(new ZmqSocket(std::move(s), bound));
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("cannot bind " + address + ": " + e.what());
    }
  }

  absl::StatusOr<std::unique_ptr<Socket>> Connect(const std::string& address) override {
    try {
      zmq::socket_t s(context_, zmq::socket_type::dealer);
      Configure(s);
      s.connect(address);
      return std::unique_ptr<Socket>(new ZmqSocket(std::move(s), address));
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError("cannot connect to " + address + ": " + e.what());
    }
  }

  absl::StatusOr<std::vector<size_t>> Poll(std::span<Socket* const> sockets,
                                           TimePoint deadline) override {
    std::vector<zmq::pollitem_t> items;
    items.reserve(sockets.size());
    for (Socket* s : sockets) {
      items.push_back({static_cast<ZmqSocket*>(s)->raw().handle(), 0, ZMQ_POLLIN, 0});
    }
    std::vector<size_t> ready;
    for (;;) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(clock_->Remaining(deadline));
      try {
        zmq::poll(items.data(), items.size(), left);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        return absl::UnavailableError(std::string("zmq poll: ") + e.what());
      }
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].revents & ZMQ_POLLIN) ready.push_back(i);
      }
      if (!ready.empty() || clock_->Now() >= deadline) return ready;
    }
  }

  absl::StatusOr<bool> Recv(Socket* socket, Frames* frames, TimePoint deadline) override {
    auto* s = static_cast<ZmqSocket*>(socket);
    for (;;) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(clock_->Remaining(deadline));
      absl::StatusOr<bool> got = s->RecvFor(frames, left);
      if (!got.ok() || *got || clock_->Now() >= deadline) return got;
    }
  }

  const Clock* clock() const override { return clock_; }

 private:
  void Configure(zmq::socket_t& s) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, options_.high_water_mark);
    s.set(zmq::sockopt::rcvhwm, options_.high_water_mark);
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.max_message_bytes));
  }

  TransportOptions options_;
  const Clock* clock_;
  zmq::context_t context_;
};

}  // namespace

std::unique_ptr<Transport> MakeZmqTransport(const TransportOptions& options, const Clock* clock) {
  return std::make_unique<ZmqTransport>(options, clock);
}

}  // namespace pacer
