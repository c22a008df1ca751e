// Straggler emulation (worker/straggler.h): the schedule parser, the factor
// lookup and the busy threads.
#include "worker/straggler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace pacer::worker {
namespace {

TEST(SlowdownScheduleTest, ParsesAndLooksUpByElapsedSecond) {
  auto s = ParseSlowdownSchedule("0:1,30:4,60:1");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ(SlowdownAt(*s, 1.0, 0), 1.0);
  EXPECT_EQ(SlowdownAt(*s, 1.0, 29.9), 1.0);
  EXPECT_EQ(SlowdownAt(*s, 1.0, 30), 4.0);
  EXPECT_EQ(SlowdownAt(*s, 1.0, 59), 4.0);
  EXPECT_EQ(SlowdownAt(*s, 1.0, 600), 1.0);
  // Before the first step, the base factor (--slowdown) holds.
  auto late = ParseSlowdownSchedule("10:2.5");
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(SlowdownAt(*late, 3.0, 5), 3.0);
  EXPECT_EQ(SlowdownAt(*late, 3.0, 10), 2.5);
  EXPECT_EQ(SlowdownAt({}, 2.0, 100), 2.0);
}

TEST(SlowdownScheduleTest, BadSchedulesNameTheItem) {
  for (const char* bad : {"", "0", "0:", ":2", "0:1,30", "a:1", "0:x", "0:0.5", "-1:2",
                          "10:2,5:3", "10:2,10:3", "0:1x", "0:2000", "0:nan", "inf:2"}) {
    auto s = ParseSlowdownSchedule(bad);
    EXPECT_FALSE(s.ok()) << "'" << bad << "' was accepted";
  }
  auto s = ParseSlowdownSchedule("0:1,30:y");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("30:y"), std::string::npos) << s.status();
}

TEST(CpuContentionTest, BusyThreadsRunUntilDestroyed) {
  auto c = CpuContention::Start(2, -1);
  ASSERT_TRUE(c.ok()) << c.status();
  const uint64_t before = (*c)->spins();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GT((*c)->spins(), before);
  c->reset();  // joins the threads; a hang here fails the test by timeout
}

TEST(CpuContentionTest, RefusesAnImpossibleCpu) {
  EXPECT_FALSE(CpuContention::Start(1, 100000).ok());
  EXPECT_FALSE(CpuContention::Start(-1, -1).ok());
}

}  // namespace
}  // namespace pacer::worker
