#include "worker/partition_reader.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "spdlog/spdlog.h"

namespace pacer::worker {

void PartitionReader::Sync(const std::vector<wire::PartitionPosition>& owned) {
  MonitorSession& s = *session_;
  const size_t n = samples_;
  std::set<uint32_t> keep;
  for (const auto& pp : owned) {
    if (pp.index() >= count_) continue;
    keep.insert(pp.index());
    if (readers_.count(pp.index())) continue;  // ours already: we are ahead
    Reader r;
    r.begin = n * pp.index() / count_;
    r.end = n * (pp.index() + 1) / count_;
    r.epoch = pp.epoch();
    r.offset = std::min<uint64_t>(pp.offset(), r.end - r.begin);
    readers_[pp.index()] = std::move(r);
    spdlog::info("worker {}: reads data partition {}/{} (samples {}..{}) from epoch {} offset {}",
                 s.id, pp.index(), count_, readers_[pp.index()].begin, readers_[pp.index()].end,
                 pp.epoch(), pp.offset());
    MutexLock lock(s.mu);
    s.positions[pp.index()] = {pp.epoch(), pp.offset()};
  }
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    spdlog::info("worker {}: data partition {} moved to another worker", s.id, it->first);
    {
      // Let go only once the monitor holds its final position (the next
      // owner starts there).
      MutexLock lock(s.mu);
      s.WaitForReportedPositions(lock);
      s.positions.erase(it->first);
    }
    if (current_ == &it->second) current_ = nullptr;
    it = readers_.erase(it);
  }
}

bool PartitionReader::Plan(size_t batch, uint32_t epochs, uint64_t seed, BatchPlan* plan) {
  bool all_done = !readers_.empty();
  epoch_ = UINT32_MAX;
  for (auto& [index, r] : readers_) {
    const bool done = epochs > 0 && r.epoch >= epochs;
    all_done &= done;
    if (!done) epoch_ = std::min(epoch_, r.epoch);
  }
  if (epoch_ == UINT32_MAX) epoch_ = 0;
  if (all_done) return false;
  plan->samples.clear();
  current_ = nullptr;
  if (readers_.empty()) return true;
  auto it = readers_.upper_bound(last_read_);
  for (size_t tries = 0; tries <= readers_.size(); ++tries) {
    if (it == readers_.end()) it = readers_.begin();
    if (epochs == 0 || it->second.epoch < epochs) break;
    ++it;
  }
  plan->partition = it->first;
  current_ = &it->second;
  current_index_ = it->first;
  last_read_ = it->first;
  Reader& r = *current_;
  if (r.order_epoch != r.epoch) {
    r.order.resize(r.end - r.begin);
    std::iota(r.order.begin(), r.order.end(), static_cast<uint32_t>(r.begin));
    std::mt19937_64 rng(seed * 1000003 + plan->partition * 7919 + r.epoch);
    std::shuffle(r.order.begin(), r.order.end(), rng);
    r.order_epoch = r.epoch;
  }
  plan->epoch = r.epoch;
  const size_t take = std::min<size_t>(batch, r.order.size() - r.offset);
  plan->samples.assign(r.order.begin() + static_cast<long>(r.offset),
                       r.order.begin() + static_cast<long>(r.offset + take));
  return true;
}

double PartitionReader::EpochProgress() const {
  for (const auto& [index, r] : readers_) {
    if (r.epoch == epoch_ && !r.order.empty()) {
      return epoch_ + static_cast<double>(r.offset) / static_cast<double>(r.order.size());
    }
  }
  return epoch_;
}

bool PartitionReader::Consumed(size_t n, bool publish) {
  if (current_ == nullptr) return false;
  Reader& r = *current_;
  r.offset += n;
  if (r.offset >= r.order.size()) {
    ++r.epoch;
    r.offset = 0;
  }
  if (!publish) return true;
  {
    MutexLock lock(session_->mu);
    session_->positions[current_index_] = {r.epoch, r.offset};
    ++session_->progress;
  }
  session_->progress_cv.notify_all();
  return true;
}

void PartitionReader::Publish() {
  {
    MutexLock lock(session_->mu);
    for (const auto& [index, r] : readers_) session_->positions[index] = {r.epoch, r.offset};
    ++session_->progress;
  }
  session_->progress_cv.notify_all();
}

void PartitionReader::Rewind() {
  MutexLock lock(session_->mu);
  for (auto& [index, r] : readers_) {
    auto it = session_->positions.find(index);
    if (it == session_->positions.end()) continue;
    r.epoch = it->second.first;
    r.offset = it->second.second;
  }
}

}  // namespace pacer::worker
