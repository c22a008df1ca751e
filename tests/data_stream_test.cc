// The monitor's data stream (monitor/data_stream.h) alone, on simulated time:
// hand-out, return on death, tail take-over, epoch roll-over, and restore
// from saved state, each checked against a record of every position trained
// that the test keeps itself.
#include "monitor/data_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace pacer {
namespace {

using std::chrono::milliseconds;

// A worker as the trainer behaves towards the stream: it holds the chunks
// it is granted, reads the oldest (epoch, id) first one batch at a time,
// never past the end it last confirmed, and stops at a cut where it is (at
// the cut, or past it by the batch it has in flight).
struct SimWorker {
  struct Held {
    uint32_t epoch = 0;
    uint64_t begin = 0, end = 0, pos = 0;
  };
  uint32_t id = 0;
  uint32_t batch = 1;
  std::map<uint64_t, Held> held;
  std::set<uint64_t> completed;  // ids trained to their end (never taken again)
  std::vector<wire::DataChunk> done_unreported;
  // A batch planned and trained, not yet acknowledged: [pos, pos + n) of
  // chunk `chunk`.
  uint64_t inflight_chunk = 0, inflight_n = 0;

  // Takes a heartbeat reply's grants.
  void Sync(const std::vector<wire::DataChunk>& grants) {
    std::set<uint64_t> listed;
    for (const wire::DataChunk& g : grants) {
      listed.insert(g.id());
      if (completed.count(g.id())) continue;
      auto it = held.find(g.id());
      if (it == held.end()) {
        held[g.id()] = {g.epoch(), g.begin(), g.end(), g.pos()};
        continue;
      }
      Held& h = it->second;
      const uint64_t read = h.pos + (inflight_chunk == g.id() ? inflight_n : 0);
      h.end = std::max(std::min(h.end, g.end()), read);
    }
    for (auto it = held.begin(); it != held.end();) {
      it = listed.count(it->first) ? std::next(it) : held.erase(it);
    }
  }
  // The next chunk to read, or null.
  std::pair<const uint64_t, Held>* Next() {
    std::pair<const uint64_t, Held>* best = nullptr;
    for (auto& kv : held) {
      if (kv.second.pos >= kv.second.end) continue;
      if (best == nullptr || std::make_pair(kv.second.epoch, kv.first) <
                                 std::make_pair(best->second.epoch, best->first)) {
        best = &kv;
      }
    }
    return best;
  }
  // Plans and trains one batch (not yet acknowledged); false: nothing to read.
  bool Plan(std::map<uint32_t, std::vector<int>>* trained) {
    auto* c = Next();
    if (c == nullptr) return false;
    Held& h = c->second;
    const uint64_t n = std::min<uint64_t>(batch, h.end - h.pos);
    std::vector<int>& t = (*trained)[h.epoch];
    for (uint64_t p = h.pos; p < h.pos + n; ++p) ++t.at(p);
    inflight_chunk = c->first;
    inflight_n = n;
    return true;
  }
  // The push is acknowledged: the position moves.
  void Ack() {
    if (inflight_chunk == 0) return;
    auto it = held.find(inflight_chunk);
    if (it != held.end()) {
      it->second.pos += inflight_n;
      if (it->second.pos >= it->second.end) {
        const Held& h = it->second;
        done_unreported.emplace_back(it->first, h.begin, h.end, h.pos, h.epoch);
        completed.insert(it->first);
        held.erase(it);
      }
    }
    inflight_chunk = inflight_n = 0;
  }
  // The heartbeat's chunk list.
  std::vector<wire::DataChunk> Report() {
    std::vector<wire::DataChunk> out = std::move(done_unreported);
    done_unreported.clear();
    for (const auto& [cid, h] : held) out.emplace_back(cid, h.begin, h.end, h.pos, h.epoch);
    return out;
  }
};

// A run of simulated workers against one stream. Each tick is 0.1 s: every
// worker trains `steps` batches (0: it idles this tick), then heartbeats.
struct Sim {
  DataStreamOptions options;
  std::unique_ptr<DataStream> stream;
  std::map<uint32_t, SimWorker> workers;
  std::map<uint32_t, uint32_t> steps_per_tick;
  std::map<uint32_t, std::vector<int>> trained;  // epoch -> count per position
  TimePoint now{};
  int ticks = 0;

  explicit Sim(DataStreamOptions o) : options(o), stream(std::make_unique<DataStream>(o)) {}

  // A worker joins. The monitor knows every live worker's speed (samples
  // per second, as measured) before it hands out chunks: Add them all,
  // then Start (or Heartbeat a newcomer).
  void Add(uint32_t id, uint32_t batch, uint32_t steps) {
    workers[id].id = id;
    workers[id].batch = batch;
    steps_per_tick[id] = steps;
    stream->SetPace(id, batch * steps * 10.0, batch);
  }
  void Start() {
    for (auto& [id, w] : workers) Heartbeat(id);
  }
  void Heartbeat(uint32_t id) {
    SimWorker& w = workers.at(id);
    stream->Report(id, w.Report(), now);
    w.Sync(stream->Assign(id, now));
  }
  std::vector<int>& Epoch(uint32_t e) {
    auto& v = trained[e];
    v.resize(options.samples);
    return v;
  }
  void Tick() {
    for (uint32_t e = 0; e <= stream->epoch() + 1; ++e) Epoch(e);
    for (auto& [id, w] : workers) {
      for (uint32_t s = 0; s < steps_per_tick[id]; ++s) {
        if (!w.Plan(&trained)) break;
        w.Ack();
        // The trainer reports after every acknowledged push.
        Heartbeat(id);
      }
      Heartbeat(id);
    }
    now += milliseconds(100);
    ++ticks;
  }
  // Runs until finished or `max_ticks`.
  void Run(int max_ticks) {
    while (!stream->finished() && ticks < max_ticks) Tick();
  }
};

// Every position of epoch e trained exactly once.
void ExpectOnce(Sim& sim, uint32_t e) {
  const std::vector<int>& t = sim.Epoch(e);
  for (size_t p = 0; p < t.size(); ++p) {
    ASSERT_EQ(t[p], 1) << "epoch " << e << " position " << p;
  }
}

// A stream whose every epoch is one chunk held whole: `samples` samples,
// `epochs` epochs, one chunk at a time of the whole epoch.
DataStreamOptions WholeEpochChunks(uint64_t samples, uint32_t epochs) {
  DataStreamOptions o;
  o.samples = samples;
  o.epochs = epochs;
  o.hold = 1;
  o.chunk_samples = static_cast<uint32_t>(samples);
  return o;
}

TEST(DataStreamTest, HandsOutHoldChunksInOrder) {
  DataStreamOptions o;
  o.samples = 1000;
  o.chunk_samples = 100;
  DataStream s(o);
  s.SetPace(7, 0, 10);
  std::vector<wire::DataChunk> g = s.Assign(7, TimePoint{});
  ASSERT_EQ(g.size(), 2u);  // its current chunk and the next
  EXPECT_EQ(g[0].begin(), 0u);
  EXPECT_EQ(g[0].end(), 100u);
  EXPECT_EQ(g[1].begin(), 100u);
  EXPECT_EQ(g[1].end(), 200u);
  EXPECT_EQ(g[0].epoch(), 0u);
  // Holding two, it gets no third.
  EXPECT_EQ(s.Assign(7, TimePoint{}).size(), 2u);
  EXPECT_EQ(s.chunks_handed_out(), 2u);
  EXPECT_TRUE(s.TakeChanged());
  EXPECT_FALSE(s.TakeChanged());
}

TEST(DataStreamTest, ChunkSizeFollowsSpeed) {
  DataStreamOptions o;
  o.samples = 1'000'000;
  o.chunk_seconds = 2;
  DataStream s(o);
  s.SetPace(1, 100, 10);
  s.SetPace(2, 400, 40);
  const auto slow = s.Assign(1, TimePoint{});
  const auto quick = s.Assign(2, TimePoint{});
  EXPECT_EQ(slow[0].end() - slow[0].begin(), 200u);
  EXPECT_EQ(quick[0].end() - quick[0].begin(), 800u);
  // Unmeasured: a few of its batches.
  s.SetPace(3, 0, 16);
  const auto fresh = s.Assign(3, TimePoint{});
  EXPECT_EQ(fresh[0].end() - fresh[0].begin(), 16u * DataStream::kUnmeasuredBatches);
}

TEST(DataStreamTest, LastChunksOfAnEpochAreFiner) {
  DataStreamOptions o;
  o.samples = 1000;
  o.chunk_samples = 300;
  DataStream s(o);
  s.SetPace(1, 100, 1);
  s.SetPace(2, 100, 1);
  std::vector<uint64_t> sizes;
  std::set<uint64_t> seen;
  for (int i = 0; i < 12; ++i) {
    // Worker 1 trains every chunk it gets at once.
    for (const auto& c : s.Assign(1, TimePoint{})) {
      if (!seen.insert(c.id()).second) continue;
      sizes.push_back(c.end() - c.begin());
      s.Report(1, {wire::DataChunk(c.id(), c.begin(), c.end(), c.end(), 0)}, TimePoint{});
    }
  }
  // At most its share of what is left (two workers of equal speed) over
  // the two chunks it holds: 1000 / 4 = 250 at first, then less and less,
  // never below its batch.
  ASSERT_GE(sizes.size(), 4u);
  EXPECT_EQ(sizes[0], 250u);
  EXPECT_EQ(sizes[1], 188u);  // 750 / 4
  EXPECT_LT(sizes[3], sizes[2]);
  EXPECT_GE(*std::min_element(sizes.begin(), sizes.end()), 1u);
}

TEST(DataStreamTest, EveryPositionOncePerEpochWithAStraggler) {
  DataStreamOptions o;
  o.samples = 6000;
  o.epochs = 3;
  Sim sim(o);
  sim.Add(1, 40, 4);  // 1600 samples/s
  sim.Add(2, 40, 4);
  sim.Add(3, 10, 1);  // a 16x straggler: 100 samples/s
  sim.Start();
  sim.Run(2000);
  ASSERT_TRUE(sim.stream->finished());
  for (uint32_t e = 0; e < 3; ++e) ExpectOnce(sim, e);
  EXPECT_EQ(sim.stream->epoch(), 3u);
  // The floor: 18000 samples at 3300 per second is 5.5 s (55 ticks); the
  // tail rule keeps the run near it (a straggler reading its own third
  // alone would take 60 s).
  EXPECT_LE(sim.ticks, 62);
  for (uint32_t e = 0; e < 3; ++e) {
    ASSERT_TRUE(sim.stream->tail_seconds(e).has_value()) << e;
    EXPECT_LE(*sim.stream->tail_seconds(e), 0.5) << "epoch " << e;
    uint64_t total = 0;
    for (const auto& [w, n] : sim.stream->samples_in_epoch(e)) total += n;
    EXPECT_EQ(total, o.samples);
  }
}

TEST(DataStreamTest, ReturnOnDeathLosesNothing) {
  DataStreamOptions o;
  o.samples = 2000;
  o.epochs = 1;
  o.chunk_samples = 300;
  Sim sim(o);
  sim.Add(1, 25, 2);
  sim.Add(2, 25, 2);
  sim.Start();
  for (int i = 0; i < 5; ++i) sim.Tick();
  // Worker 2 trains a last batch whose acknowledgement it never reports,
  // then dies: its chunks go back at their reported positions.
  SimWorker& dead = sim.workers.at(2);
  ASSERT_TRUE(dead.Plan(&sim.trained));
  const uint64_t again = dead.inflight_n;
  sim.stream->Release(2, sim.now);
  sim.workers.erase(2);
  sim.steps_per_tick.erase(2);
  EXPECT_EQ(sim.stream->chunks_returned(), 2u);
  sim.Add(3, 25, 2);  // a newcomer joins
  sim.Heartbeat(3);
  sim.Run(1000);
  ASSERT_TRUE(sim.stream->finished());
  const std::vector<int>& t = sim.Epoch(0);
  uint64_t twice = 0;
  for (size_t p = 0; p < t.size(); ++p) {
    ASSERT_GE(t[p], 1) << "position " << p << " skipped";
    ASSERT_LE(t[p], 2) << "position " << p;
    twice += t[p] == 2;
  }
  // Only the dead worker's last batch.
  EXPECT_EQ(twice, again);
}

TEST(DataStreamTest, TailIsHandedOverOnlyOnceTheHolderConfirms) {
  DataStream s(WholeEpochChunks(1000, 1));
  const TimePoint t0{};
  s.SetPace(1, 100, 10);  // the holder: slow
  auto held = s.Assign(1, t0);
  ASSERT_EQ(held.size(), 1u);                                         // [0, 1000): the whole epoch
  s.Report(1, {wire::DataChunk(held[0].id(), 0, 1000, 500, 0)}, t0);  // half trained
  // A quick worker finds the epoch all handed out: the holder is asked for
  // a tail, the taker gets nothing yet.
  s.SetPace(2, 1000, 10);
  EXPECT_TRUE(s.Assign(2, t0).empty());
  auto asked = s.Grants(1);
  ASSERT_EQ(asked.size(), 1u);
  const uint64_t cut = asked[0].end();
  // So that both end together: the holder keeps 500 * 100 / 1100.
  EXPECT_EQ(cut, 546u);
  EXPECT_TRUE(s.Assign(2, t0).empty());  // still not confirmed
  // The holder had read 30 past the cut: it stops there, and says so.
  const uint64_t stop = cut + 30;
  s.Report(1, {wire::DataChunk(held[0].id(), 0, stop, 510, 0)}, t0);
  auto tail = s.Grants(2);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].begin(), stop);
  EXPECT_EQ(tail[0].end(), 1000u);
  EXPECT_EQ(s.tails_taken_over(), 1u);
  EXPECT_EQ(s.Grants(1)[0].end(), stop);
  // Both end; so does the epoch.
  s.Report(1, {wire::DataChunk(held[0].id(), 0, stop, stop, 0)}, t0);
  EXPECT_FALSE(s.finished());
  s.Report(2, {wire::DataChunk(tail[0].id(), stop, 1000, 1000, 0)}, t0);
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.samples_in_epoch(0).at(1), stop);
  EXPECT_EQ(s.samples_in_epoch(0).at(2), 1000u - stop);
}

TEST(DataStreamTest, NoTakeOverWhenItGainsTooLittle) {
  DataStreamOptions o = WholeEpochChunks(1000, 0);
  o.min_gain_seconds = 10;
  DataStream s(o);
  s.SetPace(1, 100, 10);
  s.Assign(1, TimePoint{});
  s.SetPace(2, 1000, 10);
  const auto next = s.Assign(2, TimePoint{});  // epoch 1's chunk instead
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].epoch(), 1u);
  EXPECT_EQ(s.Grants(1)[0].end(), 1000u);
}

TEST(DataStreamTest, TakerThatDiesCallsTheHandOverOff) {
  DataStream s(WholeEpochChunks(1000, 1));
  s.SetPace(1, 100, 10);
  auto held = s.Assign(1, TimePoint{});
  s.SetPace(2, 1000, 10);
  s.Assign(2, TimePoint{});
  ASSERT_LT(s.Grants(1)[0].end(), 1000u);  // asked
  s.Release(2, TimePoint{});
  // Called off: the holder keeps its whole chunk, unless it had stopped
  // already; then the rest goes back to the pool.
  EXPECT_EQ(s.Grants(1)[0].end(), 1000u);
  s.Report(1, {wire::DataChunk(held[0].id(), 0, 700, 500, 0)}, TimePoint{});
  s.SetPace(3, 100, 10);
  auto rest = s.Assign(3, TimePoint{});
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest[0].begin(), 700u);
}

TEST(DataStreamTest, EpochRollsOverAtMostOneAhead) {
  DataStreamOptions o = WholeEpochChunks(100, 4);
  o.min_gain_seconds = 1e9;  // no take-over: the holder keeps epoch 0 open
  DataStream s(o);
  s.SetPace(1, 10, 10);
  auto a = s.Assign(1, TimePoint{});  // epoch 0: [0, 100)
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].end(), 100u);
  s.SetPace(2, 10, 10);
  // Worker 2 runs through epoch 1 while worker 1 holds epoch 0's chunks.
  for (int i = 0; i < 10; ++i) {
    std::vector<wire::DataChunk> mine = s.Assign(2, TimePoint{});
    for (const auto& c : mine) {
      EXPECT_EQ(c.epoch(), 1u) << "the cursor ran two epochs ahead";
      s.Report(2, {wire::DataChunk(c.id(), c.begin(), c.end(), c.end(), c.epoch())}, TimePoint{});
    }
  }
  EXPECT_EQ(s.epoch(), 0u);
  // Epoch 0 ends: epoch 1 is done too, and epoch 2 opens.
  for (const auto& c : a) {
    s.Report(1, {wire::DataChunk(c.id(), c.begin(), c.end(), c.end(), 0)}, TimePoint{});
  }
  EXPECT_EQ(s.epoch(), 2u);
  EXPECT_EQ(s.Assign(2, TimePoint{})[0].epoch(), 2u);
  EXPECT_FALSE(s.finished());
}

TEST(DataStreamTest, FinishesAfterItsEpochs) {
  DataStream s(WholeEpochChunks(100, 2));
  s.SetPace(1, 10, 10);
  for (int i = 0; i < 5; ++i) {
    for (const auto& c : s.Assign(1, TimePoint{})) {
      s.Report(1, {wire::DataChunk(c.id(), c.begin(), c.end(), c.end(), c.epoch())}, TimePoint{});
    }
  }
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.epoch(), 2u);
  EXPECT_TRUE(s.Assign(1, TimePoint{}).empty());
  EXPECT_EQ(s.chunks_handed_out(), 2u);
}

TEST(DataStreamTest, RestoredStreamCarriesOn) {
  DataStreamOptions o;
  o.samples = 3000;
  o.epochs = 2;
  Sim sim(o);
  sim.Add(1, 30, 3);
  sim.Add(2, 30, 3);
  sim.Add(3, 10, 1);
  sim.Start();
  for (int i = 0; i < 12; ++i) sim.Tick();
  // The monitor restarts: a new stream from the saved state; the workers
  // hold their chunks and go on (their speeds measured again).
  const DataStreamRecord saved = sim.stream->Save();
  sim.stream = std::make_unique<DataStream>(o);
  ASSERT_TRUE(sim.stream->Restore(saved).ok());
  for (auto& [id, w] : sim.workers)
    sim.stream->SetPace(id, w.batch * sim.steps_per_tick[id] * 10.0, w.batch);
  sim.Run(1000);
  ASSERT_TRUE(sim.stream->finished());
  ExpectOnce(sim, 0);
  ExpectOnce(sim, 1);
}

TEST(DataStreamTest, RestoredFromBeforeACutTakesTheHoldersWord) {
  const DataStreamOptions o = WholeEpochChunks(1000, 1);
  DataStream s(o);
  s.SetPace(1, 100, 10);
  auto held = s.Assign(1, TimePoint{});
  const DataStreamRecord before = s.Save();
  // A cut the holder confirmed, saved by nobody: after the restart the
  // holder still stops where it said; the rest is handed out again.
  DataStream r(o);
  ASSERT_TRUE(r.Restore(before).ok());
  r.SetPace(1, 100, 10);
  r.Report(1, {wire::DataChunk(held[0].id(), 0, 800, 600, 0)}, TimePoint{});
  r.SetPace(2, 100, 10);
  auto rest = r.Assign(2, TimePoint{});
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].begin(), 800u);
  EXPECT_LE(rest[0].end(), 1000u);
}

TEST(DataStreamTest, RestoreRefusesAStateThatDoesNotFit) {
  DataStreamOptions o;
  o.samples = 100;
  o.epochs = 2;
  DataStream s(o);
  DataStreamRecord r;
  r.next_id = 5;
  r.chunks.push_back({1, 0, 0, 200, 0, 3, 0, 0});  // past the data set
  EXPECT_FALSE(s.Restore(r).ok());
  r.chunks = {{1, 0, 50, 40, 60, 3, 0, 0}};  // pos past end
  EXPECT_FALSE(s.Restore(r).ok());
  r.chunks = {};
  r.cursor_epoch = 2;  // past --epochs
  EXPECT_FALSE(s.Restore(r).ok());
}

}  // namespace
}  // namespace pacer
