#include "ps/applied_ledger.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace pacer {

bool AppliedLedger::Add(uint32_t worker, uint64_t seq) {
  if (seq == 0) return true;
  auto& spans = spans_[worker];
  // The span starting after seq, and the one before it (which may hold it).
  auto next = spans.upper_bound(seq);
  if (next != spans.begin()) {
    auto prev = std::prev(next);
    if (prev->second >= seq) {
      ++doubles_;
      return false;
    }
    if (prev->second + 1 == seq) {
      prev->second = seq;
      if (next != spans.end() && next->first == seq + 1) {
        prev->second = next->second;
        spans.erase(next);
      }
      ++size_;
      return true;
    }
  }
  if (next != spans.end() && next->first == seq + 1) {
    const uint64_t last = next->second;
    spans.erase(next);
    spans[seq] = last;
  } else {
    spans[seq] = seq;
  }
  ++size_;
  return true;
}

bool AppliedLedger::Contains(uint32_t worker, uint64_t seq) const {
  const auto w = spans_.find(worker);
  if (w == spans_.end()) return false;
  auto next = w->second.upper_bound(seq);
  if (next == w->second.begin()) return false;
  return std::prev(next)->second >= seq;
}

std::vector<SeqSpan> AppliedLedger::Spans() const {
  std::vector<SeqSpan> out;
  for (const auto& [worker, spans] : spans_) {
    for (const auto& [first, last] : spans) out.push_back({worker, first, last});
  }
  return out;
}

void AppliedLedger::Assign(const std::vector<SeqSpan>& spans, uint64_t doubles) {
  spans_.clear();
  for (const SeqSpan& in : spans) {
    if (in.first == 0 || in.last < in.first) continue;  // not a span: nothing applied
    auto& of = spans_[in.worker];
    uint64_t first = in.first, last = in.last;
    // Merge with every span that overlaps or touches [first, last].
    auto it = of.upper_bound(first);
    if (it != of.begin() && std::prev(it)->second + 1 >= first) --it;
    while (it != of.end() && (last == UINT64_MAX || it->first <= last + 1)) {
      first = std::min(first, it->first);
      last = std::max(last, it->second);
      it = of.erase(it);
    }
    of[first] = last;
  }
  size_ = 0;
  for (const auto& [worker, of] : spans_) {
    for (const auto& [first, last] : of) size_ += last - first + 1;
  }
  doubles_ = doubles;  // overlaps within `spans` are not the range's doubles
}

std::string AppliedLedger::Text() const {
  std::string out;
  for (const auto& [worker, spans] : spans_) {
    out.append("worker ").append(std::to_string(worker)).append(":");
    for (const auto& [first, last] : spans) {
      out.push_back(' ');
      out.append(std::to_string(first));
      if (last != first) out.append("-").append(std::to_string(last));
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace pacer
