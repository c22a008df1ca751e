#include "monitor/data_stream.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "spdlog/spdlog.h"

namespace pacer {

DataStream::DataStream(const DataStreamOptions& options) : options_(options) {}

namespace {
// The pool's order: oldest epoch first, then by position.
bool SpanBefore(const DataStreamRecord::Span& a, const DataStreamRecord::Span& b) {
  return std::make_pair(a.epoch, a.begin) < std::make_pair(b.epoch, b.begin);
}
// A speed no worker reaches (a heartbeat's figure is the worker's word).
constexpr double kMaxSamplesPerSecond = 1e9;
}  // namespace

void DataStream::SetPace(uint32_t worker, double samples_per_second, uint32_t batch) {
  Pace& p = paces_[worker];
  if (std::isfinite(samples_per_second) && samples_per_second > 0) {
    p.samples_per_second = std::min(samples_per_second, kMaxSamplesPerSecond);
  }
  p.batch = std::max<uint32_t>(1, batch);
}

double DataStream::Speed(uint32_t worker) const {
  auto it = paces_.find(worker);
  return it == paces_.end() ? 0 : it->second.samples_per_second;
}

size_t DataStream::Held(uint32_t worker) const {
  auto it = by_owner_.find(worker);
  return it == by_owner_.end() ? 0 : it->second.size();
}

void DataStream::Insert(const Chunk& c) {
  chunks_[c.id] = c;
  by_owner_[c.owner].insert(c.id);
  ++epoch_chunks_[c.epoch];
}

std::map<uint64_t, DataStream::Chunk>::iterator DataStream::Erase(
    std::map<uint64_t, Chunk>::iterator it) {
  const Chunk& c = it->second;
  if (auto o = by_owner_.find(c.owner); o != by_owner_.end()) {
    o->second.erase(c.id);
    if (o->second.empty()) by_owner_.erase(o);
  }
  if (auto e = epoch_chunks_.find(c.epoch); e != epoch_chunks_.end() && --e->second == 0) {
    epoch_chunks_.erase(e);
  }
  return chunks_.erase(it);
}

uint32_t DataStream::Frontier() const {
  return cursor_ < options_.samples ? cursor_epoch_ : cursor_epoch_ + 1;
}

uint32_t DataStream::epoch() const {
  uint32_t e = Frontier();
  if (!epoch_chunks_.empty()) e = std::min(e, epoch_chunks_.begin()->first);
  if (!pool_.empty()) e = std::min(e, pool_.front().epoch);  // the pool is in order
  return e;
}

uint64_t DataStream::Unhanded(uint32_t e) const {
  uint64_t n = 0;
  if (e == cursor_epoch_) n = options_.samples - cursor_;
  if (e > cursor_epoch_) n = options_.samples;
  for (const Span& s : pool_) {
    if (s.epoch == e) n += s.end - s.begin;
  }
  return n;
}

double DataStream::epoch_progress() const {
  const uint32_t e = epoch();
  if (options_.samples == 0 || finished()) return 1;
  uint64_t open = Unhanded(e);
  for (const auto& [id, c] : chunks_) {
    if (c.epoch == e) open += c.end - c.pos;
  }
  return 1.0 - static_cast<double>(open) / static_cast<double>(options_.samples);
}

uint64_t DataStream::ChunkSize(uint32_t worker, uint64_t left) const {
  const Pace pace = paces_.count(worker) ? paces_.at(worker) : Pace{};
  double size = options_.chunk_samples;
  if (size <= 0) {
    size = pace.samples_per_second > 0 ? pace.samples_per_second * options_.chunk_seconds
                                       : static_cast<double>(pace.batch) * kUnmeasuredBatches;
  }
  // Near the end of an epoch, at most this worker's share (by speed) of what
  // is left, over the chunks it holds: the last chunks are split finer, so
  // that the workers run out of them at about the same time.
  double total = 0;
  for (const auto& [id, p] : paces_) total += p.samples_per_second;
  const double share = pace.samples_per_second > 0 && total > 0
                           ? pace.samples_per_second / total
                           : 1.0 / static_cast<double>(std::max<size_t>(1, paces_.size()));
  size = std::min(
      size, std::ceil(static_cast<double>(left) * share / std::max<uint32_t>(1, options_.hold)));
  // Never less than one of its batches.
  size = std::max(size, static_cast<double>(pace.batch));
  return static_cast<uint64_t>(std::max(1.0, size));
}

bool DataStream::HandOut(uint32_t worker, TimePoint now) {
  const uint64_t n = options_.samples;
  if (n == 0) return false;
  Chunk c;
  c.owner = worker;
  if (!pool_.empty()) {
    // Given back first, the oldest epoch first (the pool is kept in order).
    Span& s = pool_.front();
    const uint64_t size = ChunkSize(worker, Unhanded(s.epoch));
    c.epoch = s.epoch;
    c.begin = c.pos = s.begin;
    c.end = std::min(s.end, s.begin + size);
    s.begin = c.end;
    if (s.begin >= s.end) pool_.erase(pool_.begin());
  } else {
    if (cursor_ >= n) {
      const uint32_t next = cursor_epoch_ + 1;
      if (options_.epochs > 0 && next >= options_.epochs) return false;
      // At most one epoch ahead of the oldest unfinished one.
      if (next > epoch() + 1) return false;
      cursor_epoch_ = next;
      cursor_ = 0;
    }
    const uint64_t size = ChunkSize(worker, Unhanded(cursor_epoch_));
    c.epoch = cursor_epoch_;
    c.begin = c.pos = cursor_;
    c.end = std::min(n, cursor_ + size);
    cursor_ = c.end;
  }
  c.id = next_id_++;
  Insert(c);
  ++handed_out_;
  changed_ = true;
  (void)now;
  return true;
}

bool DataStream::MaybeTakeOver(uint32_t taker, TimePoint now) {
  (void)now;
  const uint32_t e = epoch();
  if (finished() || Unhanded(e) > 0) return false;  // the epoch still has chunks to hand out
  const double st = Speed(taker);
  if (st <= 0) return false;
  // One pass: each holder's samples of epoch e left, and whether a
  // hand-over is under way from it (one at a time for a holder and for a
  // taker).
  struct Holder {
    uint64_t left = 0;
    bool busy = false;
  };
  std::map<uint32_t, Holder> holders;
  for (const auto& [id, c] : chunks_) {
    if (c.taker == taker) return true;
    Holder& h = holders[c.owner];
    h.busy |= c.taker != 0;
    if (c.epoch == e) h.left += (c.taker != 0 ? std::max(c.cut, c.pos) : c.end) - c.pos;
  }
  uint32_t holder = 0;
  double worst = 0;
  for (const auto& [owner, h] : holders) {
    if (owner == taker || h.busy) continue;
    const double sh = Speed(owner);
    if (sh <= 0) continue;
    const double t = static_cast<double>(h.left) / sh;
    if (t > worst) worst = t, holder = owner;
  }
  if (holder == 0) return false;
  const double sh = Speed(holder);
  const double w = static_cast<double>(holders[holder].left);
  const double tt = static_cast<double>(holders[taker].left) / st;
  // The holder keeps x samples, so that both end together:
  //   x / sh == tt + (w - x) / st.
  const double keep = std::max(0.0, sh * (st * tt + w) / (sh + st));
  if (worst - keep / sh < options_.min_gain_seconds) return false;
  if (static_cast<uint64_t>(std::floor(w - keep)) == 0) return false;
  bool asked = false;
  // The holder reads its chunks of the epoch in order (by id): it keeps the
  // first `keep` samples of them; each chunk past that point is cut.
  double kept = 0;
  for (auto& [id, c] : chunks_) {
    if (c.owner != holder || c.epoch != e || c.pos >= c.end) continue;
    const double left = static_cast<double>(c.end - c.pos);
    if (kept + left <= keep) {
      kept += left;
      continue;
    }
    const uint64_t cut = c.pos + static_cast<uint64_t>(std::ceil(std::max(0.0, keep - kept)));
    kept = keep;
    if (cut >= c.end) continue;
    c.cut = cut;
    c.taker = taker;
    changed_ = asked = true;
    SPDLOG_DEBUG(
        "data stream: worker {} asked to stop chunk {} (epoch {}, {}..{} at {}) at {} "
        "for worker {} ({:.2f} s left there, {:.2f} s at the taker)",
        holder, id, e, c.begin, c.end, c.pos, cut, taker, worst, tt);
  }
  return asked;
}

void DataStream::Report(uint32_t worker, const std::vector<wire::DataChunk>& reported,
                        TimePoint now) {
  for (const wire::DataChunk& r : reported) {
    auto it = chunks_.find(r.id());
    if (it == chunks_.end() || it->second.owner != worker) continue;
    Chunk& c = it->second;
    const uint64_t pos = std::clamp<uint64_t>(r.pos(), c.pos, c.end);
    // The holder stops short of the end (the cut we asked for, or past it
    // by what it had read; or a cut a restarted monitor no longer knows of):
    // the rest goes to the taker, or back to the pool.
    if (r.end() < c.end && r.end() >= pos) {
      const uint64_t stop = r.end();
      const bool taker_live = c.taker != 0 && paces_.count(c.taker);
      SPDLOG_DEBUG("data stream: worker {} stops chunk {} at {} (of {}); the rest to {}", worker,
                   c.id, stop, c.end,
                   taker_live ? "worker " + std::to_string(c.taker) : "the pool");
      if (taker_live) {
        Chunk tail;
        tail.id = next_id_++;
        tail.epoch = c.epoch;
        tail.begin = tail.pos = stop;
        tail.end = c.end;
        tail.owner = c.taker;
        Insert(tail);
        ++taken_over_;
      } else {
        GiveBack(c.epoch, stop, c.end);
      }
      c.end = stop;
      c.cut = 0;
      c.taker = 0;
      changed_ = true;
    }
    Stats(c.epoch).samples[worker] += pos - c.pos;
    c.pos = pos;
    if (c.pos >= c.end) {
      Erase(it);
      changed_ = true;
    }
  }
  NoteProgress(now);
}

std::vector<wire::DataChunk> DataStream::Assign(uint32_t worker, TimePoint now) {
  paces_.try_emplace(worker);
  // Its next chunks first, then a tail for it. (Holding back the next
  // epoch's chunks while a tail is asked for the worker, so that it reads
  // the tail before it moves on, made the quick start's 2-epoch job 10-20%
  // slower and its tails longer: the taker idled until the holder
  // confirmed.)
  while (Held(worker) < options_.hold && HandOut(worker, now)) {
  }
  MaybeTakeOver(worker, now);
  NoteProgress(now);
  return Grants(worker);
}

std::vector<wire::DataChunk> DataStream::Grants(uint32_t worker) const {
  std::vector<wire::DataChunk> out;
  auto held = by_owner_.find(worker);
  if (held == by_owner_.end()) return out;
  for (uint64_t id : held->second) {
    const Chunk& c = chunks_.at(id);
    out.emplace_back(c.id, c.begin, c.taker != 0 ? c.cut : c.end, c.pos, c.epoch);
  }
  return out;
}

void DataStream::GiveBack(uint32_t e, uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  Span s{e, begin, end};
  auto at = std::lower_bound(pool_.begin(), pool_.end(), s, SpanBefore);
  pool_.insert(at, s);
  changed_ = true;
}

void DataStream::Release(uint32_t worker, TimePoint now) {
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    Chunk& c = it->second;
    if (c.taker == worker) {
      c.cut = 0;
      c.taker = 0;
      changed_ = true;
    }
    if (c.owner != worker) {
      ++it;
      continue;
    }
    GiveBack(c.epoch, c.pos, c.end);
    ++returned_;
    changed_ = true;
    it = Erase(it);
  }
  paces_.erase(worker);
  NoteProgress(now);
}

DataStream::EpochStats& DataStream::Stats(uint32_t e) {
  EpochStats& s = stats_[e];
  // Keep a few epochs (the end-of-run table and metrics read the latest).
  while (stats_.size() > 16) stats_.erase(stats_.begin());
  return s;
}

void DataStream::NoteProgress(TimePoint now) {
  const uint32_t e = epoch();
  for (uint32_t done = last_epoch_; done < e; ++done) {
    EpochStats& s = Stats(done);
    if (!s.ended) s.ended = now;
    if (!s.tail_start) s.tail_start = now;
  }
  last_epoch_ = std::max(last_epoch_, e);
  if (finished() || Unhanded(e) > 0) return;
  EpochStats& s = Stats(e);
  if (s.tail_start) return;
  // A known worker that holds nothing of this epoch left to read.
  std::set<uint32_t> reading;
  for (const auto& [id, c] : chunks_) {
    if (c.epoch == e && c.pos < (c.taker != 0 ? std::max(c.cut, c.pos) : c.end)) {
      reading.insert(c.owner);
    }
  }
  for (const auto& [w, pace] : paces_) {
    if (!reading.count(w)) {
      s.tail_start = now;
      break;
    }
  }
}

const std::map<uint32_t, uint64_t>& DataStream::samples_in_epoch(uint32_t e) const {
  static const std::map<uint32_t, uint64_t> kNone;
  auto it = stats_.find(e);
  return it == stats_.end() ? kNone : it->second.samples;
}

std::optional<double> DataStream::tail_seconds(uint32_t e) const {
  auto it = stats_.find(e);
  if (it == stats_.end() || !it->second.ended || !it->second.tail_start) return std::nullopt;
  return ToSeconds(*it->second.ended - *it->second.tail_start);
}

std::map<uint32_t, size_t> DataStream::holders() const {
  std::map<uint32_t, size_t> out;
  for (const auto& [id, c] : chunks_) ++out[c.owner];
  return out;
}

DataStreamRecord DataStream::Save() const {
  DataStreamRecord r;
  r.cursor_epoch = cursor_epoch_;
  r.cursor = cursor_;
  r.next_id = next_id_;
  for (const auto& [id, c] : chunks_) r.chunks.push_back(c);
  r.pool = pool_;
  return r;
}

absl::Status DataStream::Restore(const DataStreamRecord& r) {
  const uint64_t n = options_.samples;
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("saved data stream: " + what);
  };
  const uint32_t last = options_.epochs > 0 ? options_.epochs - 1 : UINT32_MAX;
  if (r.cursor > n || r.cursor_epoch > last) return bad("cursor past the data set or the epochs");
  std::map<uint64_t, Chunk> chunks;
  for (const Chunk& c : r.chunks) {
    if (!(c.begin <= c.pos && c.pos <= c.end && c.end <= n) || c.epoch > r.cursor_epoch ||
        c.id == 0 || c.id >= r.next_id || chunks.count(c.id) || c.owner == 0 ||
        (c.taker != 0 && (c.cut < c.pos || c.cut > c.end))) {
      return bad("chunk " + std::to_string(c.id) + " does not fit");
    }
    chunks[c.id] = c;
  }
  for (const Span& s : r.pool) {
    if (!(s.begin < s.end && s.end <= n) || s.epoch > r.cursor_epoch) return bad("pool span");
  }
  cursor_epoch_ = r.cursor_epoch;
  cursor_ = r.cursor;
  next_id_ = r.next_id;
  chunks_.clear();
  by_owner_.clear();
  epoch_chunks_.clear();
  for (const auto& [id, c] : chunks) Insert(c);
  pool_ = r.pool;
  std::sort(pool_.begin(), pool_.end(), SpanBefore);
  last_epoch_ = epoch();
  changed_ = false;
  return absl::OkStatus();
}

}  // namespace pacer
