// The job's data stream (pacer-monitor's default): one shuffled order of
// the whole training set per epoch, handed to the workers in chunks as they
// need them, with exactly-once visitation across worker death and monitor
// restarts, and an epoch that ends for every worker at about the same time.
//
// A chunk is a span [begin, end) of positions in epoch e's order (the order
// itself depends only on (seed, e) and is computed by the workers; the
// stream deals in positions). Of a chunk, [begin, pos) is trained: pos moves
// only forward and only with the holder's reports, which it sends after
// each acknowledged push. The rules:
//
//  - Hand-out (Assign): a worker holds up to `hold` chunks (its current one
//    and the next, so it never waits for data). A new one comes from the
//    pool of returned spans first (the lowest epoch first), then from the
//    hand-out cursor. Its size is `chunk_samples`, or else `chunk_seconds`
//    of the worker's measured speed; near the end of an epoch it is at most
//    the worker's share (by speed) of what is left over `hold`, so the last
//    chunks are split finer; never below one of its batches.
//  - Exactly once (Report, Release): a worker that leaves or dies gives its
//    chunks back to the pool at their reported positions; only its last
//    batch (trained, not yet reported; in mode local its last round) can be
//    trained twice.
//  - The tail (Assign, Report): once an epoch's order is all handed out, a
//    worker that asks for data may take over the unread tail of the holder
//    that would end the epoch last, when that shortens the epoch by at
//    least `min_gain_seconds`. The holder is told to stop at a cut (its
//    chunk's `end` in Grants); it confirms where it stops (at the cut, or
//    past it by what it had already read) in its next report, and only then
//    is the rest handed to the taker. Workers go on to the next epoch's
//    chunks without a barrier; the cursor runs at most one epoch ahead of
//    the oldest unfinished one.
//  - Epochs (--epochs E > 0): the cursor stops after epoch E - 1; the
//    stream is finished when every position of every epoch is trained.
//
// A pure library: no sockets, no clock of its own (callers pass the time),
// single-threaded (the monitor's thread). Its state round-trips through
// Save/Restore (the monitor's saved state).
#ifndef PACER_MONITOR_DATA_STREAM_H_
#define PACER_MONITOR_DATA_STREAM_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"
#include "ps/base/wire.h"

namespace pacer {

struct DataStreamOptions {
  // The training set's size (the model's declaration carries it). > 0.
  uint64_t samples = 0;
  // Passes over the whole training set (--epochs); 0: no end.
  uint32_t epochs = 0;
  // Chunks a worker holds at once: the one it reads and the next.
  uint32_t hold = 2;
  // A fixed chunk size in samples (--chunk-samples); 0: by speed.
  uint32_t chunk_samples = 0;
  // By speed: a chunk is this many seconds of the worker's measured
  // samples per second (before that is known: kUnmeasuredBatches batches).
  double chunk_seconds = 2.0;
  // A tail is taken over only when that ends the epoch at least this much
  // sooner (a hand-over costs about two heartbeats).
  double min_gain_seconds = 0.1;
};

class DataStream {
 public:
  // Chunk size before a worker's speed is known: this many of its batches.
  static constexpr uint32_t kUnmeasuredBatches = 8;

  explicit DataStream(const DataStreamOptions& options);

  // What the monitor measured of a worker (its heartbeat): samples per
  // second (0: not known yet) and its batch. Keeps the worker in the
  // speed sums that size chunks until Release.
  void SetPace(uint32_t worker, double samples_per_second, uint32_t batch);

  // A worker's report of the chunks it holds (its heartbeat): each chunk's
  // trained position moves forward (never past its end, never back); a
  // chunk whose tail was asked of it is cut where the worker says it stops,
  // and the tail goes to the taker (or the pool); a chunk trained to its
  // end is done. Chunks the worker does not hold are ignored.
  void Report(uint32_t worker, const std::vector<wire::DataChunk>& chunks, TimePoint now);

  // Tops the worker's chunks up to `hold` and may ask another holder for a
  // tail on its behalf; returns what the worker holds now (Grants).
  std::vector<wire::DataChunk> Assign(uint32_t worker, TimePoint now);

  // The worker's chunks as it is to know them: each one's epoch, begin,
  // trained position, and end (the cut while a tail is asked of it).
  std::vector<wire::DataChunk> Grants(uint32_t worker) const;

  // The worker left or died: its chunks go back to the pool at their
  // reported positions; hand-overs it was part of are called off.
  void Release(uint32_t worker, TimePoint now);

  // The oldest epoch not trained in full (== epochs once finished).
  uint32_t epoch() const;
  // Its trained fraction, 0..1.
  double epoch_progress() const;
  // With epochs > 0: every position of every epoch trained.
  bool finished() const { return options_.epochs > 0 && epoch() >= options_.epochs; }

  // Counters, for metrics and the end-of-run table.
  uint64_t chunks_handed_out() const { return handed_out_; }
  uint64_t tails_taken_over() const { return taken_over_; }
  uint64_t chunks_returned() const { return returned_; }
  // Samples each worker trained in epoch e (reported positions).
  const std::map<uint32_t, uint64_t>& samples_in_epoch(uint32_t e) const;
  // Seconds from the first moment a worker was left with nothing of epoch e
  // to read to the end of epoch e (nullopt: not ended in this process).
  std::optional<double> tail_seconds(uint32_t e) const;
  // The workers holding chunks, and the number each holds.
  std::map<uint32_t, size_t> holders() const;

  // Whether the chunks changed (handed out, cut, done, given back) since
  // the last call: the monitor saves its state before its replies go out,
  // so that a restarted monitor never hands out again what a worker holds.
  bool TakeChanged() {
    const bool c = changed_;
    changed_ = false;
    return c;
  }

  DataStreamRecord Save() const;
  // Replaces the state with a saved one; InvalidArgument when it does not
  // fit this training set (a span past its end, an unknown epoch).
  absl::Status Restore(const DataStreamRecord& record);

 private:
  using Chunk = DataStreamRecord::Chunk;
  using Span = DataStreamRecord::Span;
  struct Pace {
    double samples_per_second = 0;
    uint32_t batch = 1;
  };
  struct EpochStats {
    std::map<uint32_t, uint64_t> samples;  // per worker
    std::optional<TimePoint> tail_start, ended;
  };

  // The first epoch the cursor has not handed out in full.
  uint32_t Frontier() const;
  // Positions of epoch e not yet handed out (cursor and pool).
  uint64_t Unhanded(uint32_t e) const;
  // The size of the next chunk for `worker` from an epoch with `left`
  // positions not handed out.
  uint64_t ChunkSize(uint32_t worker, uint64_t left) const;
  // A new chunk for `worker`: from the pool, then the cursor. False: none.
  bool HandOut(uint32_t worker, TimePoint now);
  // Asks the holder that ends the oldest epoch last for a tail on
  // `taker`'s behalf; true when a hand-over for it is under way (asked now
  // or before).
  bool MaybeTakeOver(uint32_t taker, TimePoint now);
  double Speed(uint32_t worker) const;
  size_t Held(uint32_t worker) const;
  void GiveBack(uint32_t epoch, uint64_t begin, uint64_t end);
  void Insert(const Chunk& c);
  std::map<uint64_t, Chunk>::iterator Erase(std::map<uint64_t, Chunk>::iterator it);
  // Records tail starts and epoch ends after a change.
  void NoteProgress(TimePoint now);
  EpochStats& Stats(uint32_t e);

  const DataStreamOptions options_;
  uint32_t cursor_epoch_ = 0;
  uint64_t cursor_ = 0;  // next position of cursor_epoch_'s order to hand out
  uint64_t next_id_ = 1;
  std::map<uint64_t, Chunk> chunks_;  // held, by id
  // Indexes of chunks_ (kept by Insert and Erase): each owner's chunk ids,
  // and the number of chunks of each epoch.
  std::map<uint32_t, std::set<uint64_t>> by_owner_;
  std::map<uint32_t, size_t> epoch_chunks_;
  std::vector<Span> pool_;            // given back, not held
  std::map<uint32_t, Pace> paces_;
  uint64_t handed_out_ = 0, taken_over_ = 0, returned_ = 0;
  std::map<uint32_t, EpochStats> stats_;
  uint32_t last_epoch_ = 0;  // epoch() when last noted
  bool changed_ = false;
};

}  // namespace pacer

#endif  // PACER_MONITOR_DATA_STREAM_H_
