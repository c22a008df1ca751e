#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "ps/base/mutex.h"
#include "ps/base/transport.h"

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
  // curve_server: a bound socket under CURVE, whose messages carry the
  // sender's public key (ZAP's user id) on their first frame.
  ZmqSocket(zmq::socket_t socket, std::string address, bool curve_server = false)
      : socket_(std::move(socket)), address_(std::move(address)), curve_server_(curve_server) {}

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
    std::string key;
    try {
      for (;;) {
        auto msg = std::make_shared<zmq::message_t>();
        auto got = socket_.recv(*msg, frames->empty() ? first : zmq::recv_flags::none);
        if (!got) return false;
        bool more = msg->more();
        const void* data = msg->data();
        size_t size = msg->size();
        if (curve_server_ && key.empty()) {
          // The ZAP handler set the user id to the peer's public key. (A
          // ROUTER's routing-id part carries no metadata: the next does.)
          if (const char* id = zmq_msg_gets(msg->handle(), "User-Id")) key = id;
        }
        frames->emplace_back(std::move(msg), data, size);
        if (!more) {
          if (!key.empty()) frames->front().set_peer_key(std::move(key));
          return true;
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return false;
      return absl::UnavailableError(std::string("zmq recv: ") + e.what());
    }
  }

 private:
  zmq::socket_t socket_;
  std::string address_;
  bool curve_server_ = false;
  int rcvtimeo_ = -1;  // ZMQ_RCVTIMEO last set, in ms
};

// The ZAP handler (ZeroMQ RFC 27) of a transport under CURVE: ZeroMQ asks it
// about every peer that completes a CURVE handshake with a bound socket; it
// answers 200 with the peer's public key as user id when the key is
// allowed, else 400.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, const CurveOptions& curve)
      : allowed_(curve.allowed.begin(), curve.allowed.end()), on_refused_(curve.on_refused),
        context_(&context), socket_(context, zmq::socket_type::rep) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
    thread_ = std::thread([this] { Run(); });
  }
  ~ZapHandler() {
    stop_ = true;
    thread_.join();
  }

  // Reports the failed handshakes of `bound` (a peer without CURVE, or with
  // a mismatched mechanism, never reaches ZAP) through on_refused. Called
  // by the thread that owns `bound`, before anything connects. The event
  // socket is connected here, before `bound` can see a peer (a monitor drops
  // the events that come before it is connected), then handed to the ZAP
  // thread under the mutex (a full memory barrier, as ZeroMQ requires).
  void Watch(zmq::socket_t& bound) {
    const std::string name = "inproc://pacer-handshakes-" + std::to_string(++watched_);
    if (zmq_socket_monitor(bound.handle(), name.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0) {
      return;  // not watched: ZAP refusals are still reported
    }
    zmq::socket_t events(*context_, zmq::socket_type::pair);
    events.set(zmq::sockopt::linger, 0);
    events.connect(name);
    MutexLock lock(mu_);
    pending_.push_back(std::move(events));
  }

 private:
  void Run() {
    std::vector<zmq::socket_t> monitors;
    while (!stop_) {
      try {
        {
          MutexLock lock(mu_);
          for (zmq::socket_t& events : pending_) monitors.push_back(std::move(events));
          pending_.clear();
        }
        std::vector<zmq::pollitem_t> items{{socket_.handle(), 0, ZMQ_POLLIN, 0}};
        for (auto& m : monitors) items.push_back({m.handle(), 0, ZMQ_POLLIN, 0});
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
        if (items[0].revents & ZMQ_POLLIN) {
          std::vector<zmq::message_t> request;
          if (zmq::recv_multipart(socket_, std::back_inserter(request))) Answer(request);
        }
        for (size_t i = 1; i < items.size(); ++i) {
          if (!(items[i].revents & ZMQ_POLLIN)) continue;
          std::vector<zmq::message_t> event;
          if (!zmq::recv_multipart(monitors[i - 1], std::back_inserter(event)) ||
              event.size() < 2 || event[0].size() < 6) {
            continue;
          }
          uint16_t id = 0;
          std::memcpy(&id, event[0].data(), sizeof(id));
          // ZeroMQ names the endpoint that was bound, not the peer's address.
          if (on_refused_) {
            on_refused_("", "",
                        (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                             ? std::string("handshake failed (no CURVE, or another mechanism)")
                             : std::string("handshake failed"))
                            .append(" on ")
                            .append(event[1].to_string()));
          }
        }
      } catch (const zmq::error_t&) {
        // EINTR or the context going away: look at stop_ again.
      }
    }
  }

  void Answer(const std::vector<zmq::message_t>& r) {
    // version, request id, domain, address, routing id, mechanism, credentials...
    auto text = [&](size_t i) { return i < r.size() ? r[i].to_string() : std::string(); };
    std::string key, status = "400", why;
    if (r.size() < 6 || text(0) != "1.0") {
      why = "malformed ZAP request";
    } else if (text(5) != "CURVE" || r.size() < 7 || r[6].size() != 32) {
      why = "no CURVE key offered (mechanism " + text(5) + ")";
    } else {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(r[6].data()), 32);
      key = z85;
      if (allowed_.count(key) > 0) {
        status = "200";
      } else {
        why = "public key not in the allowed keys";
      }
    }
    // The buffers point into these strings: they live until the send.
    const std::string text_out = status == "200" ? "OK" : why;
    const std::string user_id = status == "200" ? key : "";
    std::array<zmq::const_buffer, 6> reply = {
        zmq::str_buffer("1.0"),
        zmq::buffer(r.size() > 1 ? r[1].data() : nullptr, r.size() > 1 ? r[1].size() : 0),
        zmq::buffer(status), zmq::buffer(text_out), zmq::buffer(user_id), zmq::const_buffer()};
    zmq::send_multipart(socket_, reply);
    if (status != "200" && on_refused_) on_refused_(key, text(3), why);
  }

  const std::set<std::string> allowed_;
  const std::function<void(const std::string&, const std::string&, const std::string&)> on_refused_;
  zmq::context_t* context_;
  zmq::socket_t socket_;
  std::atomic<bool> stop_{false};
  std::atomic<int> watched_{0};
  Mutex mu_;                        // guards pending_
  std::vector<zmq::socket_t> pending_ ABSL_GUARDED_BY(mu_);  // event sockets for Run to take over
  std::thread thread_;
};

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(const TransportOptions& options, const Clock* clock)
      : options_(options), clock_(clock), context_(IoThreads(options)) {
    if (options_.curve.enabled()) zap_ = std::make_unique<ZapHandler>(context_, options_.curve);
  }
  ~ZmqTransport() override { zap_.reset(); }

  void SetServerKey(const std::string& address, const std::string& public_key) override {
    MutexLock lock(mu_);
    server_keys_[address] = public_key;
  }

  absl::StatusOr<std::unique_ptr<Socket>> Bind(const std::string& address) override {
    std::string zaddr = address;
    if (zaddr.size() > 2 && zaddr.compare(zaddr.size() - 2, 2, ":0") == 0) {
      zaddr = zaddr.substr(0, zaddr.size() - 1) + "*";
    }
    try {
      zmq::socket_t s(context_, zmq::socket_type::router);
      Configure(s);
      s.set(zmq::sockopt::router_mandatory, 1);
      if (options_.curve.enabled()) {
        s.set(zmq::sockopt::curve_server, 1);
        s.set(zmq::sockopt::curve_secretkey, options_.curve.keys.secret_key);
        s.set(zmq::sockopt::zap_domain, "pacer");
        zap_->Watch(s);
      }
      s.bind(zaddr);
      std::string bound = s.get(zmq::sockopt::last_endpoint);
      return std::unique_ptr<Socket>(
          new ZmqSocket(std::move(s), bound, options_.curve.enabled()));
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError("cannot bind " + address + ": " + e.what());
    }
  }

  absl::StatusOr<std::unique_ptr<Socket>> Connect(const std::string& address) override {
    try {
      zmq::socket_t s(context_, zmq::socket_type::dealer);
      Configure(s);
      if (options_.curve.enabled()) {
        std::string server_key;
        {
          MutexLock lock(mu_);
          auto it = server_keys_.find(address);
          if (it != server_keys_.end()) server_key = it->second;
        }
        if (server_key.empty()) {
          return absl::FailedPreconditionError("no CURVE public key known for " + address +
                                               " (security is on)");
        }
        s.set(zmq::sockopt::curve_serverkey, server_key);
        s.set(zmq::sockopt::curve_publickey, options_.curve.keys.public_key);
        s.set(zmq::sockopt::curve_secretkey, options_.curve.keys.secret_key);
      }
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
  std::unique_ptr<ZapHandler> zap_;  // before any socket binds
  Mutex mu_;                                   // guards server_keys_
  std::map<std::string, std::string> server_keys_ ABSL_GUARDED_BY(mu_);  // address -> public key
};

}  // namespace

int IoThreads(const TransportOptions& options) {
  if (options.io_threads > 0) return options.io_threads;
  const unsigned cores = std::thread::hardware_concurrency();
  // One per two cores: the other core runs the process's own threads. On 2
  // cores, one I/O thread made a small round trip faster than two in every
  // one of 6 alternating runs (bench/RESULTS.md, "I/O threads").
  return static_cast<int>(std::clamp(cores / 2, 1u, 4u));
}

std::unique_ptr<Transport> MakeZmqTransport(const TransportOptions& options, const Clock* clock) {
  return std::make_unique<ZmqTransport>(options, clock);
}

}  // namespace pacer
