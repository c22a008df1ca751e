#include "monitor/membership.h"

#include <algorithm>
#include <set>

#include "spdlog/spdlog.h"

namespace pacer {

WorkerState* Membership::Find(uint32_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerState* Membership::Find(uint32_t id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<uint32_t> Membership::LiveWorkers() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, w] : workers_) {
    if (w.alive && !w.done) ids.push_back(id);
  }
  return ids;
}

std::vector<uint32_t> Membership::KnownIds() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

uint32_t Membership::Evaluator() const {
  uint32_t best = 0, rank = UINT32_MAX;
  for (uint32_t id : LiveWorkers()) {
    if (workers_.at(id).rank < rank) {
      rank = workers_.at(id).rank;
      best = id;
    }
  }
  return best;
}

bool Membership::AnyDone() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.second.done; });
}

const WorkerState* Membership::ByToken(const std::string& token) const {
  if (token.empty()) return nullptr;
  auto it = tokens_.find(token);
  return it == tokens_.end() ? nullptr : &workers_.at(it->second);
}

const WorkerState& Membership::Join(uint32_t id, const std::string& token,
                                    const std::string& public_key, TimePoint now,
                                    uint64_t start_clock, std::optional<uint32_t> rank_hint) {
  std::set<uint32_t> taken;
  for (uint32_t live : LiveWorkers()) taken.insert(workers_.at(live).rank);
  WorkerState w;
  w.id = id;
  w.public_key = public_key;
  if (!token.empty()) tokens_[token] = id;
  if (rank_hint && !taken.count(*rank_hint)) {
    w.rank = *rank_hint;
  } else {
    while (taken.count(w.rank)) ++w.rank;
  }
  next_rank_ = std::max(next_rank_, w.rank + 1);
  w.last_seen = now;
  w.clock = start_clock;
  w.start_clock = start_clock;
  workers_[id] = w;
  awaiting_workers_ = false;
  spdlog::info("worker {} registered as rank {}", w.id, w.rank);
  for (const auto& listener : on_live_set_) listener();
  Change("joined", "worker " + std::to_string(id) + " joined");
  workers_[id].joined_version = version_;
  return workers_[id];
}

void Membership::Finish(uint32_t id, uint64_t at_clock) {
  WorkerState& w = workers_.at(id);
  w.done = true;
  spdlog::info("worker {} (rank {}) finished at clock {}", w.id, w.rank, at_clock);
  Change("finished", "worker " + std::to_string(id) + " finished");
  for (const auto& listener : on_live_set_) listener();
}

bool Membership::Remove(uint32_t id, const std::string& why) {
  WorkerState* w = Find(id);
  if (w == nullptr || !w->alive || w->done) return false;
  w->alive = false;
  spdlog::warn("worker {} (rank {}) {}", id, w->rank, why);
  Change("removed", "worker " + std::to_string(id) + " removed");
  for (const auto& listener : on_live_set_) listener();
  return true;
}

std::optional<uint64_t> Membership::MinLiveClock() const {
  std::optional<uint64_t> c;
  for (uint32_t id : LiveWorkers()) c = std::min(c.value_or(UINT64_MAX), workers_.at(id).clock);
  return c;
}

void Membership::ExpireLeases(TimePoint now, Duration lease) {
  for (auto& [id, w] : workers_) {
    if (w.alive && !w.done && now - w.last_seen > lease) {
      w.alive = false;
      metrics_->dead->Increment();
      spdlog::warn("worker {} (rank {}) missed its lease ({:.1f} s without a heartbeat); declared dead",
                   id, w.rank, ToSeconds(now - w.last_seen));
      Change("lost", "worker " + std::to_string(id) + " lost");
      for (const auto& listener : on_live_set_) listener();
    }
  }
}

void Membership::Change(const char* reason, const std::string& why) {
  journal_->Mark();
  if (auto it = metrics_->membership_changes.find(reason); it != metrics_->membership_changes.end()) {
    it->second->Increment();
  }
  for (const auto& listener : on_change_) listener();
  ++version_;
  metrics_->ShowMembership(*this);
  SPDLOG_DEBUG("membership v{}: {}", version_, why);
  (void)why;
}

void Membership::Hold() {
  if (pause_at_ != 0) return;
  uint64_t c = 0;
  for (uint32_t id : LiveWorkers()) c = std::max(c, workers_.at(id).clock);
  pause_at_ = c + 2;  // past every worker, heartbeats being a little behind
}

void Membership::RaiseHold(const WorkerState& w) {
  if (pause_at_ == 0 || w.clock <= pause_at_) return;
  spdlog::info("worker {} is at clock {}; the hold clock moves up from {}", w.id, w.clock,
               pause_at_);
  pause_at_ = w.clock;
}

void Membership::Save(MonitorRecord* r) const {
  std::map<uint32_t, std::string> tokens;
  for (const auto& [token, id] : tokens_) tokens[id] = token;
  r->next_rank = next_rank_;
  r->membership_version = version_;
  for (const auto& [id, w] : workers_) {
    auto t = tokens.find(id);
    r->workers.push_back({w.id, w.rank, w.batch, w.staleness, w.staleness_range, w.start_clock,
                          w.clock, w.joined_version, w.alive, w.done,
                          t == tokens.end() ? std::string() : t->second, w.public_key});
  }
}

void Membership::Restore(const MonitorRecord& r, TimePoint now) {
  next_rank_ = r.next_rank;
  version_ = r.membership_version;
  workers_.clear();
  tokens_.clear();
  for (const auto& mw : r.workers) {
    WorkerState w;
    w.id = mw.id;
    w.rank = mw.rank;
    w.batch = mw.batch;
    w.staleness = mw.staleness;
    w.staleness_range = mw.staleness_range;
    w.start_clock = mw.start_clock;
    w.clock = mw.clock;
    w.joined_version = mw.joined_version;
    w.alive = mw.alive;
    w.done = mw.done;
    w.public_key = mw.public_key;
    w.last_seen = now;  // a fresh lease: it may still be training
    workers_[w.id] = w;
    if (!mw.token.empty()) tokens_[mw.token] = w.id;
  }
  // Workers that were here are gone or will say so; the job waits for a
  // live one before "all workers finished" can end it again.
  awaiting_workers_ = LiveWorkers().empty();
}

}  // namespace pacer
