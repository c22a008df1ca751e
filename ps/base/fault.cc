#include "ps/base/fault.h"

#include <algorithm>
#include <deque>
#include <sstream>

#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace pacer {

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kDrop: return "drop";
    case FaultKind::kDelay: return "delay";
    case FaultKind::kDuplicate: return "duplicate";
    case FaultKind::kReorder: return "reorder";
    case FaultKind::kCorrupt: return "corrupt";
    case FaultKind::kPartition: return "partition";
    case FaultKind::kSlowDisk: return "slow_disk";
  }
  return "?";
}

namespace {

constexpr FaultKind kKinds[] = {FaultKind::kDrop,    FaultKind::kDelay,   FaultKind::kDuplicate,
                                FaultKind::kReorder, FaultKind::kCorrupt, FaultKind::kPartition,
                                FaultKind::kSlowDisk};

bool ParseNumber(const std::string& s, double* out) {
  try {
    size_t used = 0;
    *out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

absl::StatusOr<std::vector<FaultRule>> ParseFaults(const std::string& spec) {
  std::vector<FaultRule> rules;
  const std::vector<std::string> parts = absl::StrSplit(spec, ';', absl::SkipWhitespace());
  for (const std::string& part : parts) {
    std::string text(part);
    text.erase(0, text.find_first_not_of(' '));
    text.erase(text.find_last_not_of(' ') + 1);
    const auto colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    FaultRule r;
    bool known = false;
    for (FaultKind k : kKinds) {
      if (kind == FaultKindName(k)) {
        r.kind = k;
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError("fault '" + text + "': unknown kind '" + kind +
                                        "' (drop, delay, duplicate, reorder, corrupt, partition, slow_disk)");
    }
    if (colon != std::string::npos) {
      const std::vector<std::string> items = absl::StrSplit(text.substr(colon + 1), ',', absl::SkipEmpty());
      for (const std::string& item : items) {
        const auto eq = item.find('=');
        if (eq == std::string::npos) {
          return absl::InvalidArgumentError("fault '" + text + "': '" + item + "' is not KEY=VALUE");
        }
        const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
        double v = 0;
        if (key == "p") {
          if (!ParseNumber(value, &v) || v < 0 || v > 1) {
            return absl::InvalidArgumentError("fault '" + text + "': p must be in [0, 1]");
          }
          r.probability = v;
        } else if (key == "ms" || key == "jitter") {
          if (r.kind != FaultKind::kDelay && r.kind != FaultKind::kSlowDisk) {
            return absl::InvalidArgumentError("fault '" + text + "': " + key + " is for delay and slow_disk only");
          }
          if (!ParseNumber(value, &v) || v < 0 || v > 600000) {
            return absl::InvalidArgumentError("fault '" + text + "': " + key +
                                              " must be 0..600000 milliseconds");
          }
          (key == "ms" ? r.delay : r.jitter) = FromSeconds(v / 1000.0);
        } else if (key == "for") {
          if (!ParseNumber(value, &v) || v <= 0 || v > 86400) {
            return absl::InvalidArgumentError("fault '" + text + "': for must be 0..86400 seconds");
          }
          r.lasts = FromSeconds(v);
        } else if (key == "type") {
          const std::vector<std::string> names = absl::StrSplit(value, '|', absl::SkipEmpty());
          for (const std::string& t : names) {
            bool found = false;
            for (wire::Body b : wire::EnumValuesBody()) {
              if (b != wire::Body::NONE && t == wire::EnumNameBody(b)) {
                r.types.insert(b);
                found = true;
              }
            }
            if (!found) {
              return absl::InvalidArgumentError("fault '" + text + "': unknown message type '" +
                                                t + "'");
            }
          }
        } else if (key == "peers") {
          const std::vector<std::string> ids = absl::StrSplit(value, '|', absl::SkipEmpty());
          for (const std::string& id : ids) {
            if (!ParseNumber(id, &v) || v < 0 || v > UINT32_MAX || v != static_cast<uint32_t>(v)) {
              return absl::InvalidArgumentError("fault '" + text + "': peer '" + id +
                                                "' is not an id");
            }
            r.peers.insert(static_cast<uint32_t>(v));
          }
        } else {
          return absl::InvalidArgumentError("fault '" + text + "': unknown key '" + key +
                                            "' (p, type, peers, ms, jitter, for)");
        }
      }
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

std::string FaultsToString(const std::vector<FaultRule>& rules) {
  std::ostringstream out;
  for (size_t i = 0; i < rules.size(); ++i) {
    const FaultRule& r = rules[i];
    if (i > 0) out << ';';
    out << FaultKindName(r.kind) << ":p=" << r.probability;
    if (r.kind == FaultKind::kDelay || r.kind == FaultKind::kSlowDisk) {
      out << ",ms=" << ToSeconds(r.delay) * 1000 << ",jitter=" << ToSeconds(r.jitter) * 1000;
    }
    if (!r.types.empty()) {
      out << ",type=";
      bool first = true;
      for (wire::Body b : r.types) {
        out << (first ? "" : "|") << wire::EnumNameBody(b);
        first = false;
      }
    }
    if (r.lasts > Duration::zero()) out << ",for=" << ToSeconds(r.lasts);
    if (!r.peers.empty()) {
      out << ",peers=";
      bool first = true;
      for (uint32_t p : r.peers) {
        out << (first ? "" : "|") << p;
        first = false;
      }
    }
  }
  return out.str();
}

FaultInjector::FaultInjector(uint64_t seed, prometheus::Registry* registry, const Clock* clock)
    : seed_(seed), clock_(clock), rng_(seed) {
  if (registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("pacer_faults_injected_total")
                       .Help("Received messages hit by an injected fault, by kind (drop, delay, "
                             "duplicate, reorder, corrupt, partition)")
                       .Register(*registry);
    for (FaultKind k : kKinds) counters_[k] = &family.Add({{"kind", FaultKindName(k)}});
  }
}

void FaultInjector::SetRules(std::vector<FaultRule> rules) {
  MutexLock lock(mu_);
  rules_ = std::move(rules);
  set_at_ = clock_->Now();
  any_ = !rules_.empty();
}

std::vector<FaultRule> FaultInjector::rules() const {
  MutexLock lock(mu_);
  return rules_;
}

double FaultInjector::injected(FaultKind kind) const {
  MutexLock lock(mu_);
  auto it = counts_.find(kind);
  return it == counts_.end() ? 0 : it->second;
}

bool FaultInjector::Hit(const FaultRule& r) {
  if (r.probability < 1.0 && std::uniform_real_distribution<double>(0, 1)(rng_) >= r.probability) {
    return false;
  }
  ++counts_[r.kind];
  if (auto it = counters_.find(r.kind); it != counters_.end()) it->second->Increment();
  return true;
}

Duration FaultInjector::DelayOf(const FaultRule& r) {
  if (r.jitter <= Duration::zero()) return r.delay;
  return r.delay + Duration(std::uniform_int_distribution<int64_t>(0, r.jitter.count() - 1)(rng_));
}

FaultInjector::Decision FaultInjector::Decide(const Envelope* env) {
  Decision d;
  MutexLock lock(mu_);
  const auto age = clock_->Now() - set_at_;
  for (const FaultRule& r : rules_) {
    if (r.lasts > Duration::zero() && age >= r.lasts) continue;  // over
    if (r.kind == FaultKind::kSlowDisk) continue;                 // not a message fault
    if (env == nullptr) {
      // Only a partition from everyone covers a message we cannot read.
      if (r.kind != FaultKind::kPartition || !r.peers.empty() || !r.types.empty()) continue;
    } else {
      if (!r.types.empty() && !r.types.count(env->type)) continue;
      if (!r.peers.empty() && !r.peers.count(env->sender)) continue;
    }
    if (!Hit(r)) continue;
    switch (r.kind) {
      case FaultKind::kDrop:
      case FaultKind::kPartition: d.drop = true; break;
      case FaultKind::kDelay: d.delay += DelayOf(r); break;
      case FaultKind::kDuplicate: d.duplicate = true; break;
      case FaultKind::kReorder: d.reorder = true; break;
      case FaultKind::kCorrupt: d.corrupt = true; break;
      case FaultKind::kSlowDisk: break;
    }
    if (d.drop) break;  // nothing else matters for a dropped message
  }
  return d;
}

Duration FaultInjector::DiskDelay() {
  MutexLock lock(mu_);
  const auto age = clock_->Now() - set_at_;
  Duration total{};
  for (const FaultRule& r : rules_) {
    if (r.kind != FaultKind::kSlowDisk) continue;
    if (r.lasts > Duration::zero() && age >= r.lasts) continue;
    if (Hit(r)) total += DelayOf(r);
  }
  return total;
}

void FaultInjector::Corrupt(Frames& frames, size_t first) {
  size_t total = 0;
  for (size_t i = first; i < frames.size(); ++i) total += frames[i].size();
  if (total == 0) return;
  size_t at;
  uint8_t mask;
  {
    MutexLock lock(mu_);
    at = std::uniform_int_distribution<size_t>(0, total - 1)(rng_);
    mask = static_cast<uint8_t>(1u << std::uniform_int_distribution<int>(0, 7)(rng_));
  }
  for (size_t i = first; i < frames.size(); ++i) {
    if (at < frames[i].size()) {
      std::vector<uint8_t> bytes(frames[i].data(), frames[i].data() + frames[i].size());
      bytes[at] ^= mask;
      frames[i] = Frame::FromVector(std::move(bytes));
      return;
    }
    at -= frames[i].size();
  }
}

void RuntimeFaults::Apply(uint64_t version, const std::string& spec) {
  if (faults_ == nullptr || version == version_) return;
  version_ = version;
  auto extra = ParseFaults(spec);
  if (!extra.ok()) {
    spdlog::error("run-time faults from the monitor do not parse: {}",
                  std::string(extra.status().message()));
    return;
  }
  std::vector<FaultRule> rules = base_;
  rules.insert(rules.end(), extra->begin(), extra->end());
  spdlog::warn("run-time faults (version {}): {}", version,
               extra->empty() ? std::string("none") : FaultsToString(*extra));
  faults_->SetRules(std::move(rules));
}

namespace {

// How long a reordered message is held back.
constexpr Duration kReorderHold = std::chrono::milliseconds(20);

// A socket whose received messages go through the injector first. Delayed,
// duplicated and reordered messages wait in `ready_` with the time they are
// due; the transport's Poll and Recv wake for them.
class FaultySocket final : public Socket {
 public:
  FaultySocket(std::unique_ptr<Socket> inner, bool routed, FaultInjector* faults, const Clock* clock)
      : inner_(std::move(inner)), routed_(routed), faults_(faults), clock_(clock) {}

  absl::Status Send(Frames frames) override { return inner_->Send(std::move(frames)); }
  std::string address() const override { return inner_->address(); }

  absl::StatusOr<bool> TryRecv(Frames* frames) override {
    if (ready_.empty() && !faults_->any()) return inner_->TryRecv(frames);  // fast path
    absl::Status st = Drain();
    if (!st.ok()) return st;
    return TakeDue(frames);
  }

  Socket* inner() { return inner_.get(); }

  // Moves every message the inner socket has into `ready_`, faults applied.
  absl::Status Drain() {
    for (;;) {
      Frames f;
      auto got = inner_->TryRecv(&f);
      if (!got.ok()) return got.status();
      if (!*got) return absl::OkStatus();
      Ingest(std::move(f));
    }
  }

  void Ingest(Frames f) {
    const size_t env_at = routed_ ? 1 : 0;  // a ROUTER puts the peer's id first
    Envelope env;
    const bool readable = f.size() > env_at && PeekEnvelope(f[env_at], &env);
    FaultInjector::Decision d = faults_->Decide(readable ? &env : nullptr);
    if (d.drop) return;
    if (d.corrupt) faults_->Corrupt(f, env_at + 1);
    TimePoint due = clock_->Now() + d.delay;
    if (d.duplicate) Push(f, due);
    // Reordered: held back a little, so that what comes next overtakes it.
    if (d.reorder) due += kReorderHold;
    Push(std::move(f), due);
  }

  // The earliest time a queued message is due (max() when none).
  TimePoint NextDue() const {
    TimePoint t = TimePoint::max();
    for (const auto& m : ready_) t = std::min(t, m.due);
    return t;
  }
  bool HasDue() const { return NextDue() <= clock_->Now(); }
  bool idle() const { return ready_.empty(); }

 private:
  struct Queued {
    TimePoint due;
    Frames frames;
  };
  void Push(Frames f, TimePoint due) { ready_.push_back({due, std::move(f)}); }
  bool TakeDue(Frames* frames) {
    const TimePoint now = clock_->Now();
    // The earliest due message first; among equals, the order they came in.
    auto best = ready_.end();
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if (it->due <= now && (best == ready_.end() || it->due < best->due)) best = it;
    }
    if (best == ready_.end()) return false;
    *frames = std::move(best->frames);
    ready_.erase(best);
    return true;
  }

  std::unique_ptr<Socket> inner_;
  const bool routed_;
  FaultInjector* faults_;
  const Clock* clock_;
  std::deque<Queued> ready_;
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  absl::StatusOr<std::unique_ptr<Socket>> Bind(const std::string& address) override {
    auto s = inner_->Bind(address);
    if (!s.ok()) return s.status();
    return std::unique_ptr<Socket>(new FaultySocket(std::move(*s), true, faults_.get(), clock()));
  }
  absl::StatusOr<std::unique_ptr<Socket>> Connect(const std::string& address) override {
    auto s = inner_->Connect(address);
    if (!s.ok()) return s.status();
    return std::unique_ptr<Socket>(new FaultySocket(std::move(*s), false, faults_.get(), clock()));
  }
  const Clock* clock() const override { return inner_->clock(); }
  void SetServerKey(const std::string& address, const std::string& public_key) override {
    inner_->SetServerKey(address, public_key);
  }

  absl::StatusOr<std::vector<size_t>> Poll(std::span<Socket* const> sockets,
                                           TimePoint deadline) override {
    std::vector<Socket*> inner;
    bool idle = true;
    for (Socket* s : sockets) {
      inner.push_back(static_cast<FaultySocket*>(s)->inner());
      idle &= static_cast<FaultySocket*>(s)->idle();
    }
    if (idle && !faults_->any()) return inner_->Poll(inner, deadline);  // fast path
    for (;;) {
      std::vector<size_t> ready;
      TimePoint next = deadline;
      for (size_t i = 0; i < sockets.size(); ++i) {
        auto* fs = static_cast<FaultySocket*>(sockets[i]);
        if (absl::Status st = fs->Drain(); !st.ok()) return st;
        if (fs->HasDue()) ready.push_back(i);
        next = std::min(next, fs->NextDue());
      }
      if (!ready.empty() || clock()->Now() >= deadline) return ready;
      auto got = inner_->Poll(inner, next);
      if (!got.ok()) return got.status();
    }
  }

  absl::StatusOr<bool> Recv(Socket* socket, Frames* frames, TimePoint deadline) override {
    auto* fs = static_cast<FaultySocket*>(socket);
    if (fs->idle() && !faults_->any()) return inner_->Recv(fs->inner(), frames, deadline);
    for (;;) {
      auto got = fs->TryRecv(frames);
      if (!got.ok() || *got) return got;
      const TimePoint now = clock()->Now();
      if (now >= deadline) return false;
      Frames f;
      auto in = inner_->Recv(fs->inner(), &f, std::min(deadline, fs->NextDue()));
      if (!in.ok()) return in.status();
      if (*in) fs->Ingest(std::move(f));
    }
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<FaultInjector> faults_;
};

}  // namespace

std::unique_ptr<Transport> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                               std::shared_ptr<FaultInjector> faults) {
  return std::make_unique<FaultyTransport>(std::move(inner), std::move(faults));
}

}  // namespace pacer
