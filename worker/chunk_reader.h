// A worker's side of the job's data stream (pacer-monitor's default;
// the monitor's side is monitor/data_stream.h): the chunks the monitor gave
// this worker, read one batch at a time, the oldest (epoch, chunk) first,
// each epoch in the one shuffled order of the whole training set that
// depends only on (seed, epoch).
//
// Its rules towards the monitor:
//  - A chunk's position moves only when a batch's push is acknowledged
//    (Ack); the heartbeat reports every chunk held, and each one trained to
//    its end until a reply shows the monitor took it (Report, Sync).
//  - A chunk never is read past the end it last confirmed. A reply that
//    lowers a chunk's end (its tail is asked for another worker) is
//    confirmed at that end, or past it by the batch in flight: the next
//    report says where it stops.
//  - A chunk the monitor no longer lists for this worker is dropped, with
//    what of it was in flight.
//
// Not thread-safe: the trainer calls it under its mutex.
#ifndef PACER_WORKER_CHUNK_READER_H_
#define PACER_WORKER_CHUNK_READER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "ps/base/wire.h"

namespace pacer::worker {

// Epoch `epoch`'s order of a training set of `samples` samples: a shuffle
// of 0..samples-1 that depends only on (seed, epoch), stratified over the
// index space. The indices are cut into S slices of equal size (within
// one; S the largest power of two up to min(samples, kEpochStrata)), each
// shuffled. The order is made of rounds: round r takes the r-th sample of
// every slice, visiting slice bitreverse(j) XOR mask at its j-th step (a
// fresh random mask per round). Any 2^k steps aligned in a round thus take
// one sample from each of 2^k equal parts of the index space, so that every
// stretch of the order covers the training set evenly by its indices: on a
// data set stored in order (by label, source, date), each class's share of
// any tenth of an epoch of 60,000 is within about 0.1 point of its share of
// the data set, where a uniform shuffle strays by about a point
// (bench/torch/versus_ddp.py --epochs, "ordered"). A batch is likewise
// spread over the whole set.
inline constexpr size_t kEpochStrata = 1024;
std::vector<uint32_t> EpochOrder(uint64_t seed, uint32_t epoch, size_t samples);

class ChunkReader {
 public:
  // `exact_positions` false only to show a chaos invariant failing
  // (pacer-worker --unsafe-disable exact-positions): each chunk's position
  // is reported one batch past what was acknowledged.
  ChunkReader(uint64_t seed, size_t samples, bool exact_positions = true)
      : seed_(seed), samples_(samples), exact_positions_(exact_positions) {}

  // One batch to train: training-set indices from one chunk.
  struct Batch {
    uint64_t chunk = 0;
    uint32_t epoch = 0;
    std::vector<uint32_t> samples;
  };

  // Positions [pos, pos + count) of epoch `epoch`'s order, in chunk `chunk`.
  struct Span {
    uint64_t chunk = 0;
    uint32_t epoch = 0;
    uint64_t pos = 0, count = 0;
  };

  // Takes the chunks a heartbeat reply lists for this worker (only a reply
  // of a running job lists them).
  void Sync(const std::vector<wire::DataChunk>& grants);
  // The next batch of at most `n` samples, from the oldest chunk with
  // samples left; it is in flight until Ack or the next Plan. With `add`
  // (a round of local steps: mode local) the batches in flight stay so and
  // this one is read after them, until Ack. nullopt: nothing to read.
  std::optional<Batch> Plan(size_t n, bool add = false);
  // As Plan, the positions only (no epoch order is made: the cluster
  // simulator's workers read no data).
  std::optional<Span> PlanPositions(size_t n, bool add = false);
  // The planned batches' push was acknowledged: their chunks' positions
  // move. Returns those chunks (a chunk the monitor took back meanwhile is
  // not among them).
  std::set<uint64_t> Ack();
  // The last planned batch is not trained (a round's step given up): it
  // is no longer in flight, and the next plan reads it again.
  void Unplan();
  // Nothing planned is trained (a round whose push was not taken): the
  // next plan reads it all again.
  void Drop() { inflight_.clear(); }
  // The chunks for a heartbeat: those held, and those trained to their end
  // that no reply has shown taken.
  std::vector<wire::DataChunk> Report();

  // Whether any chunk has samples left to read.
  bool has_data() const;
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    uint32_t epoch = 0;
    uint64_t begin = 0, end = 0, pos = 0;
  };
  const std::vector<uint32_t>& Order(uint32_t epoch);
  // Where the next plan reads `chunk`: its position past what is in flight.
  uint64_t Read(uint64_t chunk, const Held& h) const;

  const uint64_t seed_;
  const size_t samples_;
  const bool exact_positions_;
  uint64_t last_batch_ = 0;  // the size of the last batch planned
  uint64_t last_chunk_ = 0;  // its chunk
  std::map<uint64_t, Held> held_;  // by chunk id
  // Trained to their end, with their final state; `reported_` those of
  // them the last Report carried (dropped once a reply does not list them).
  std::map<uint64_t, Held> done_;
  std::set<uint64_t> reported_;
  // Samples planned past each chunk's position, not yet acknowledged.
  std::map<uint64_t, uint64_t> inflight_;
  std::map<uint32_t, std::vector<uint32_t>> orders_;  // by epoch
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_CHUNK_READER_H_
