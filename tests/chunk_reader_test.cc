// The worker's side of the data stream (worker/chunk_reader.h) alone: the
// order it reads in, a cut confirmed where it stops, positions that move
// only with acknowledgements, finished chunks reported until the monitor
// took them, and chunks the monitor no longer lists dropped.
#include "worker/chunk_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace pacer::worker {
namespace {

wire::DataChunk Chunk(uint64_t id, uint64_t begin, uint64_t end, uint64_t pos, uint32_t epoch) {
  return wire::DataChunk(id, begin, end, pos, epoch);
}

TEST(ChunkReaderTest, EpochOrderIsAPermutationThatDependsOnlyOnSeedAndEpoch) {
  std::vector<uint32_t> a = EpochOrder(7, 3, 1000);
  EXPECT_EQ(a, EpochOrder(7, 3, 1000));
  EXPECT_NE(a, EpochOrder(7, 4, 1000));
  EXPECT_NE(a, EpochOrder(8, 3, 1000));
  // A permutation at every size: fewer samples than slices, none a
  // multiple of them, one, none.
  for (size_t n : {size_t{1000}, size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{1023},
                   size_t{1025}}) {
    std::vector<uint32_t> sorted = EpochOrder(7, 3, n);
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    EXPECT_EQ(sorted, all) << n;
  }
}

// The order is stratified over the index space: on a training set stored
// sorted by label (ten classes of 6000, as Fashion-MNIST sorted), each
// class's share of every tenth of the epoch, and of any stretch that long,
// stays within 0.2 points of its 10% (a uniform shuffle strays by about a
// point: 0.8-1.3 over ten seeds). Also at a size that is no multiple of the
// slices (tenths of 1000: one sample is 0.1 point; uniform: 2-3 points).
TEST(ChunkReaderTest, EpochOrderCoversTheIndexSpaceEvenlyInEveryStretch) {
  const std::vector<std::pair<size_t, double>> sizes = {{60000, 0.002}, {10007, 0.008}};
  for (const auto& [n, within] : sizes) {
    for (uint32_t epoch = 0; epoch < 3; ++epoch) {
      const std::vector<uint32_t> order = EpochOrder(1, epoch, n);
      ASSERT_EQ(order.size(), n);
      const size_t tenth = n / 10;
      // The ten tenths, then stretches of a tenth's length at odd offsets.
      std::vector<size_t> starts;
      for (size_t t = 0; t < 10; ++t) starts.push_back(t * tenth);
      for (size_t t = 0; t < 9; ++t) starts.push_back((t * tenth + 377 * (t + 1)) % (n - tenth));
      for (size_t start : starts) {
        std::vector<size_t> classes(10, 0);
        for (size_t i = start; i < start + tenth; ++i) ++classes[order[i] * 10 / n];
        for (size_t c = 0; c < 10; ++c) {
          EXPECT_NEAR(static_cast<double>(classes[c]) / static_cast<double>(tenth), 0.1, within)
              << "n " << n << ", epoch " << epoch << ", from " << start << ", class " << c;
        }
      }
    }
  }
  std::vector<uint32_t> small = EpochOrder(3, 0, 100);
  std::sort(small.begin(), small.end());
  for (uint32_t i = 0; i < 100; ++i) ASSERT_EQ(small[i], i);
}

TEST(ChunkReaderTest, ReadsTheOldestChunkFirstInTheEpochsOrder) {
  ChunkReader r(7, 1000);
  r.Sync({Chunk(9, 0, 100, 0, 1), Chunk(4, 500, 600, 520, 0), Chunk(5, 600, 700, 600, 0)});
  auto b = r.Plan(32);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->chunk, 4u);  // epoch 0 before epoch 1, then by id
  EXPECT_EQ(b->epoch, 0u);
  const std::vector<uint32_t> order = EpochOrder(7, 0, 1000);
  EXPECT_EQ(b->samples, std::vector<uint32_t>(order.begin() + 520, order.begin() + 552));
  // Not acknowledged: the same batch again.
  auto again = r.Plan(32);
  EXPECT_EQ(again->samples, b->samples);
  r.Ack();
  // 48 left in chunk 4: a short batch, none past its end.
  r.Plan(100);
  r.Ack();
  EXPECT_EQ(r.Plan(10)->chunk, 5u);
}

// Mode local: a round's batches stay in flight together, each read after
// the last, and move the positions only at the round's ack; a step given
// up is read again, and so is a whole round that was not taken.
TEST(ChunkReaderTest, ARoundsBatchesStayInFlightUntilItsAck) {
  ChunkReader r(7, 1000);
  r.Sync({Chunk(1, 0, 100, 0, 0), Chunk(2, 100, 200, 100, 0)});
  const std::vector<uint32_t> order = EpochOrder(7, 0, 1000);
  const auto span = [&](size_t from, size_t to) {
    return std::vector<uint32_t>(order.begin() + static_cast<long>(from),
                                 order.begin() + static_cast<long>(to));
  };
  ASSERT_EQ(r.Plan(60)->samples, span(0, 60));
  auto rest = r.Plan(60, /*add=*/true);
  EXPECT_EQ(rest->chunk, 1u);
  EXPECT_EQ(rest->samples, span(60, 100));  // the chunk's rest, none past its end
  auto next = r.Plan(30, /*add=*/true);
  EXPECT_EQ(next->chunk, 2u);
  EXPECT_EQ(next->samples, span(100, 130));
  // A step given up: its batch is read again.
  r.Unplan();
  EXPECT_EQ(r.Plan(30, /*add=*/true)->samples, span(100, 130));
  // Nothing moved before the ack; a cut counts the whole round as read.
  r.Sync({Chunk(1, 0, 100, 0, 0), Chunk(2, 100, 110, 100, 0)});
  std::vector<wire::DataChunk> rep = r.Report();
  ASSERT_EQ(rep.size(), 2u);
  EXPECT_EQ(rep[0].pos(), 0u);
  EXPECT_EQ(rep[1].pos(), 100u);
  EXPECT_EQ(rep[1].end(), 130u);
  r.Ack();
  rep = r.Report();  // both trained to their ends
  ASSERT_EQ(rep.size(), 2u);
  EXPECT_EQ(rep[0].pos(), 100u);
  EXPECT_EQ(rep[1].pos(), 130u);
  // A round that was not taken: the next plan without `add` reads it again.
  ChunkReader q(7, 1000);
  q.Sync({Chunk(3, 200, 300, 200, 0)});
  auto first = q.Plan(10);
  ASSERT_TRUE(q.Plan(10, /*add=*/true).has_value());
  EXPECT_EQ(q.Plan(10)->samples, first->samples);
  // ... and after Drop, also with `add` (a round that ended when the data
  // at hand ran out, and was not taken).
  ASSERT_TRUE(q.Plan(10, /*add=*/true).has_value());
  q.Drop();
  EXPECT_EQ(q.Plan(10, /*add=*/true)->samples, first->samples);
  // A chunk the monitor takes back mid-round leaves the round: the ack
  // moves only the others.
  ChunkReader d(7, 1000);
  d.Sync({Chunk(4, 0, 100, 0, 0), Chunk(5, 100, 200, 100, 0)});
  ASSERT_EQ(d.Plan(100)->chunk, 4u);
  ASSERT_EQ(d.Plan(10, /*add=*/true)->chunk, 5u);
  d.Sync({Chunk(5, 100, 200, 100, 0)});
  EXPECT_EQ(d.Ack(), std::set<uint64_t>{5});
  rep = d.Report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].pos(), 110u);
}

TEST(ChunkReaderTest, ACutIsConfirmedWhereItStopsCountingTheBatchInFlight) {
  ChunkReader r(1, 1000);
  r.Sync({Chunk(1, 0, 500, 100, 0)});
  ASSERT_TRUE(r.Plan(50).has_value());  // [100, 150) in flight
  // The monitor asks it to stop at 120: it has read to 150.
  r.Sync({Chunk(1, 0, 120, 100, 0)});
  std::vector<wire::DataChunk> rep = r.Report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].end(), 150u);
  EXPECT_EQ(rep[0].pos(), 100u);  // not acknowledged yet
  r.Ack();
  rep = r.Report();
  ASSERT_EQ(rep.size(), 1u);  // trained to where it stops
  EXPECT_EQ(rep[0].pos(), 150u);
  EXPECT_FALSE(r.has_data());
  // A cut below what it has read never lowers its end further; an end
  // above it is not taken either.
  r.Sync({Chunk(2, 0, 400, 0, 1)});
  r.Sync({Chunk(2, 0, 1000, 0, 1)});
  EXPECT_EQ(r.Report()[0].end(), 400u);
}

TEST(ChunkReaderTest, AFinishedChunkIsReportedUntilAReplyNoLongerListsIt) {
  ChunkReader r(1, 1000);
  r.Sync({Chunk(3, 0, 40, 0, 0)});
  r.Plan(40);
  r.Ack();
  // A reply to a heartbeat sent before the ack still lists it, at its old
  // position: it is not read again.
  r.Sync({Chunk(3, 0, 40, 0, 0)});
  EXPECT_FALSE(r.Plan(10).has_value());
  std::vector<wire::DataChunk> rep = r.Report();
  ASSERT_EQ(rep.size(), 1u);
  EXPECT_EQ(rep[0].pos(), 40u);
  // The reply to that report does not list it: reported no more.
  r.Sync({});
  EXPECT_TRUE(r.Report().empty());
}

TEST(ChunkReaderTest, AReportLostOnTheWayIsSentAgain) {
  ChunkReader r(1, 1000);
  r.Sync({Chunk(3, 0, 40, 0, 0)});
  r.Plan(40);
  r.Ack();
  EXPECT_EQ(r.Report().size(), 1u);  // the heartbeat got no reply
  EXPECT_EQ(r.Report().size(), 1u);  // so the next one carries it again
}

TEST(ChunkReaderTest, AChunkTheMonitorNoLongerListsIsDropped) {
  ChunkReader r(1, 1000);
  r.Sync({Chunk(1, 0, 100, 0, 0), Chunk(2, 100, 200, 100, 0)});
  r.Sync({Chunk(2, 100, 200, 100, 0)});
  auto b = r.Plan(500);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->chunk, 2u);
  EXPECT_EQ(r.held(), 1u);
}

TEST(ChunkReaderTest, AChunkThatDoesNotFitTheDataSetIsRefused) {
  ChunkReader r(1, 100);
  r.Sync({Chunk(1, 0, 200, 0, 0), Chunk(2, 50, 60, 70, 0)});
  EXPECT_EQ(r.held(), 0u);
}

TEST(ChunkReaderTest, WithExactPositionsOffItReportsABatchAhead) {
  ChunkReader r(1, 1000, /*exact_positions=*/false);
  r.Sync({Chunk(1, 0, 500, 0, 0)});
  r.Plan(50);
  r.Ack();
  r.Plan(50);
  EXPECT_EQ(r.Report()[0].pos(), 100u);  // 50 acknowledged
}

}  // namespace
}  // namespace pacer::worker
