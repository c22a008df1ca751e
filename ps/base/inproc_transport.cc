#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "ps/base/mutex.h"
#include "ps/base/transport.h"

namespace pacer {
namespace {

class InProcTransport;

// All state lives in the transport and is guarded by its one mutex (the
// sockets' inboxes too): tests are small, and one lock makes Poll over
// several sockets trivial.
class InProcSocket final : public Socket {
 public:
  InProcSocket(InProcTransport* t, std::string address, bool router, uint64_t id)
      : transport_(t), address_(std::move(address)), router_(router), id_(id) {}
  ~InProcSocket() override;
  absl::Status Send(Frames frames) override;
  absl::StatusOr<bool> TryRecv(Frames* frames) override;
  std::string address() const override { return address_; }

  InProcTransport* transport_;
  const std::string address_;
  const bool router_;
  const uint64_t id_;
};

class InProcTransport final : public Transport {
 public:
  explicit InProcTransport(const Clock* clock) : clock_(clock) {}

  absl::StatusOr<std::unique_ptr<Socket>> Bind(const std::string& address) override {
    static constexpr std::string_view kScheme = "mem://";
    if (address.rfind(kScheme, 0) != 0) {
      return absl::InvalidArgumentError("in-process address must start with mem://: " + address);
    }
    MutexLock lock(mu_);
    std::string name = address;
    if (name == "mem://*" || name == "mem://0" || name.ends_with(":0")) {
      name = "mem://endpoint-" + std::to_string(++next_name_);
    }
    if (routers_.count(name)) return absl::AlreadyExistsError("address in use: " + name);
    auto s = std::make_unique<InProcSocket>(this, name, true, ++next_id_);
    routers_[name] = s.get();
    return std::unique_ptr<Socket>(std::move(s));
  }

  absl::StatusOr<std::unique_ptr<Socket>> Connect(const std::string& address) override {
    MutexLock lock(mu_);
    auto s = std::make_unique<InProcSocket>(this, address, false, ++next_id_);
    dealers_[s->id_] = s.get();
    return std::unique_ptr<Socket>(std::move(s));
  }

  absl::StatusOr<std::vector<size_t>> Poll(std::span<Socket* const> sockets,
                                           TimePoint deadline) override {
    MutexLock lock(mu_);
    bool expired = false;
    for (;;) {
      std::vector<size_t> ready;
      for (size_t i = 0; i < sockets.size(); ++i) {
        auto in = inboxes_.find(static_cast<InProcSocket*>(sockets[i]));
        if (in != inboxes_.end() && !in->second.empty()) ready.push_back(i);
      }
      if (!ready.empty() || expired) return ready;
      // One more look after the deadline: a message that came with it counts.
      expired = clock_->WaitUntil(cv_, lock.native(), deadline);
    }
  }

  const Clock* clock() const override { return clock_; }

  absl::Status Deliver(InProcSocket* from, Frames frames) {
    MutexLock lock(mu_);
    if (from->router_) {
      if (frames.size() < 2 || frames[0].size() != sizeof(uint64_t)) {
        return absl::InvalidArgumentError("router send needs a routing id frame");
      }
      uint64_t to;
      std::memcpy(&to, frames[0].data(), sizeof(to));
      auto it = dealers_.find(to);
      if (it == dealers_.end()) return absl::UnavailableError("peer gone");
      frames.erase(frames.begin());
      inboxes_[it->second].push_back(std::move(frames));
    } else {
      auto it = routers_.find(from->address_);
      if (it == routers_.end()) return absl::OkStatus();  // nobody bound: lost, like a network
      frames.insert(frames.begin(), Frame::Copy(&from->id_, sizeof(from->id_)));
      inboxes_[it->second].push_back(std::move(frames));
    }
    cv_.notify_all();
    return absl::OkStatus();
  }

  bool Take(InProcSocket* s, Frames* frames) {
    MutexLock lock(mu_);
    auto in = inboxes_.find(s);
    if (in == inboxes_.end() || in->second.empty()) return false;
    *frames = std::move(in->second.front());
    in->second.pop_front();
    return true;
  }

  void Remove(InProcSocket* s) {
    MutexLock lock(mu_);
    inboxes_.erase(s);
    if (s->router_) {
      routers_.erase(s->address_);
    } else {
      dealers_.erase(s->id_);
    }
  }

 private:
  const Clock* clock_;
  Mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, InProcSocket*> routers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, InProcSocket*> dealers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_name_ ABSL_GUARDED_BY(mu_) = 0;
  // Each socket's received messages, oldest first.
  std::map<const InProcSocket*, std::deque<Frames>> inboxes_ ABSL_GUARDED_BY(mu_);
};

InProcSocket::~InProcSocket() { transport_->Remove(this); }
absl::Status InProcSocket::Send(Frames frames) {
  if (frames.empty()) return absl::InvalidArgumentError("empty message");
  return transport_->Deliver(this, std::move(frames));
}
absl::StatusOr<bool> InProcSocket::TryRecv(Frames* frames) { return transport_->Take(this, frames); }

}  // namespace

std::unique_ptr<Transport> MakeInProcTransport(const Clock* clock) {
  return std::make_unique<InProcTransport>(clock);
}

}  // namespace pacer
