// The set of pushes a range has applied, as (worker, seq) pairs: what a
// shard exports (pacer-server --ledger) so that an audit, such as the chaos
// runner's, can check every durably acknowledged push against the range's
// final primary. Kept apart from dedup (each worker's last seq), so that it
// also sees a push applied twice when dedup fails or is switched off.
//
// Workers number their pushes 1, 2, 3, ... and every push reaches every
// range, so a worker's seqs form a few runs; they are kept as spans
// [first, last], a handful per worker. Not thread-safe: its owner's thread.
#ifndef PACER_PS_APPLIED_LEDGER_H_
#define PACER_PS_APPLIED_LEDGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/base/messages.h"

namespace pacer {

using msg::SeqSpan;  // [first, last] of one worker's seqs

class AppliedLedger {
 public:
  // Records that (worker, seq) was applied; false (and counted in
  // doubles()) when it already was. seq 0 (no seq given) is not recorded.
  bool Add(uint32_t worker, uint64_t seq);
  bool Contains(uint32_t worker, uint64_t seq) const;
  // Pushes recorded twice or more (each extra time counts once).
  uint64_t doubles() const { return doubles_; }
  // Pushes recorded.
  uint64_t size() const { return size_; }

  // Every span, by worker then seq: what a seed carries.
  std::vector<SeqSpan> Spans() const;
  // Replaces the contents with `spans` and `doubles` (a seed, a restore).
  void Assign(const std::vector<SeqSpan>& spans, uint64_t doubles);

  // One line per worker: "worker W: A-B C D-E" (what --ledger writes).
  std::string Text() const;

 private:
  // Per worker: first -> last of each span, disjoint and not adjacent.
  std::map<uint32_t, std::map<uint64_t, uint64_t>> spans_;
  uint64_t doubles_ = 0;
  uint64_t size_ = 0;
};

}  // namespace pacer

#endif  // PACER_PS_APPLIED_LEDGER_H_
