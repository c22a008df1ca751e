// ParallelPool (ps/base/parallel.h): every index once, from several
// threads; loops too small, nested or concurrent run on their caller.
#include "ps/base/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace pacer {
namespace {

// Runs a loop of n indices in chunks of `chunk`; counts each index's calls
// and the threads that ran any.
struct Counted {
  std::vector<std::atomic<int>> hits;
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::vector<std::pair<size_t, size_t>> ranges;
  explicit Counted(size_t n) : hits(n) {}
  void Run(ParallelPool& pool, size_t chunk) {
    pool.For(hits.size(), chunk, [&](size_t begin, size_t end) {
      {
        std::lock_guard<std::mutex> lock(mu);
        threads.insert(std::this_thread::get_id());
        ranges.emplace_back(begin, end);
      }
      // Long enough for a helper to wake and take some chunks; the hits
      // count last, so that a loop returning before its calls have shows.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (std::chrono::steady_clock::now() < until) {
      }
      for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
  }
  bool EachOnce() const {
    for (const auto& h : hits) {
      if (h.load() != 1) return false;
    }
    return true;
  }
};

TEST(ParallelPoolTest, EveryIndexRunsOnceInChunksOnSeveralThreads) {
  ParallelPool pool(3);
  ASSERT_EQ(pool.threads(), 3);
  bool helped = false;
  for (int rep = 0; rep < 20 && !helped; ++rep) {
    Counted c(1003);
    c.Run(pool, 10);  // 101 chunks, the last of 3
    ASSERT_TRUE(c.EachOnce()) << "rep " << rep;
    for (const auto& [b, e] : c.ranges) {
      EXPECT_EQ(b % 10, 0u);
      EXPECT_EQ(e, std::min<size_t>(b + 10, 1003));
    }
    helped = c.threads.size() > 1;
  }
  // 20 loops of 20 ms each: a helper that never takes a chunk is broken.
  EXPECT_TRUE(helped);
}

TEST(ParallelPoolTest, SmallLoopRunsOnTheCallerInOneCall) {
  ParallelPool pool(3);
  Counted c((ParallelPool::kMinChunks - 1) * 10);  // kMinChunks - 1 chunks
  c.Run(pool, 10);
  EXPECT_TRUE(c.EachOnce());
  ASSERT_EQ(c.ranges.size(), 1u);
  EXPECT_EQ(c.ranges[0], std::make_pair(size_t{0}, c.hits.size()));
  EXPECT_EQ(c.threads, std::set<std::thread::id>{std::this_thread::get_id()});

  bool called = false;
  pool.For(0, 10, [&](size_t, size_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ParallelPoolTest, OneThreadRunsEverythingOnTheCaller) {
  ParallelPool pool(1);
  Counted c(1000);
  c.Run(pool, 10);
  EXPECT_TRUE(c.EachOnce());
  EXPECT_EQ(c.ranges.size(), 1u);
}

TEST(ParallelPoolTest, ConcurrentAndNestedLoopsAllComplete) {
  ParallelPool pool(2);
  std::atomic<int> inner_calls{0};
  std::vector<std::unique_ptr<Counted>> counted;
  for (int i = 0; i < 4; ++i) counted.push_back(std::make_unique<Counted>(400));
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] {
      for (int rep = 0; rep < 5; ++rep) {
        Counted& c = *counted[i];
        for (auto& h : c.hits) h.store(0);
        c.Run(pool, 10);
        EXPECT_TRUE(c.EachOnce()) << "caller " << i << " rep " << rep;
        // A loop inside a loop: runs on its caller, never waits for itself.
        pool.For(100, 10, [&](size_t begin, size_t end) {
          for (size_t i = begin; i < end; ++i) {
            pool.For(100, 10, [&](size_t b, size_t e) { inner_calls += static_cast<int>(e - b); });
          }
        });
      }
    });
  }
  for (auto& t : callers) t.join();
  // 4 callers x 5 reps x 100 outer indices x 100 inner indices.
  EXPECT_EQ(inner_calls.load(), 4 * 5 * 100 * 100);
}

}  // namespace
}  // namespace pacer
