// SSP and DSSP rules (ps/staleness.h), against hand computations.
#include "ps/staleness.h"

#include <gtest/gtest.h>

#include <vector>

namespace pacer {
namespace {

TEST(SspTest, ZeroStalenessIsBsp) {
  // Clock c may be read once everyone pushed c - 1.
  EXPECT_TRUE(SspReadAllowed(0, -1, 0));
  EXPECT_FALSE(SspReadAllowed(1, -1, 0));
  EXPECT_TRUE(SspReadAllowed(1, 0, 0));
  EXPECT_FALSE(SspReadAllowed(5, 3, 0));
  EXPECT_TRUE(SspReadAllowed(5, 4, 0));
}

TEST(SspTest, NoReadStalerThanTheBound) {
  // With bound s, clock c needs everyone at c - s - 1: a fast worker may run
  // s clocks ahead of the slowest, never s + 1.
  for (uint32_t s : {1u, 3u, 10u}) {
    for (int64_t slowest = -1; slowest < 20; ++slowest) {
      for (uint64_t c = 0; c < 40; ++c) {
        const bool allowed = SspReadAllowed(c, slowest, s);
        EXPECT_EQ(allowed, static_cast<int64_t>(c) <= slowest + 1 + static_cast<int64_t>(s))
            << "c=" << c << " slowest=" << slowest << " s=" << s;
      }
    }
  }
  // A blocked worker is released when the slowest advances.
  EXPECT_FALSE(SspReadAllowed(8, 3, 3));
  EXPECT_TRUE(SspReadAllowed(8, 4, 3));
}

TEST(DsspTest, ExtraIterationsCloseTheGapToTheSlowest) {
  // Fast worker pushes every 1 s (last at 10 s); the slow one every 4 s
  // (last at 9 s, next predicted at 13 s). Three more iterations of the fast
  // worker land at 13 s.
  std::vector<double> fast = {7, 8, 9, 10};
  std::vector<double> slow = {1, 5, 9};
  EXPECT_EQ(DsspExtraIterations(fast, slow, 5), 3u);
  // r_max caps it.
  EXPECT_EQ(DsspExtraIterations(fast, slow, 2), 2u);
  EXPECT_EQ(DsspExtraIterations(fast, slow, 0), 0u);
}

TEST(DsspTest, EqualSpeedsGrantAtMostOneAndNoHistoryGrantsNothing) {
  std::vector<double> a = {0, 1, 2, 3};
  std::vector<double> b = {0.5, 1.5, 2.5, 3.5};  // same speed, next push at 4.5
  // |3 - 4.5| = 1.5, |4 - 4.5| = 0.5, |5 - 4.5| = 0.5: the tie goes to r = 1.
  EXPECT_EQ(DsspExtraIterations(a, b, 4), 1u);
  std::vector<double> one = {3};
  EXPECT_EQ(DsspExtraIterations(one, b, 4), 0u);
  EXPECT_EQ(DsspExtraIterations(a, one, 4), 0u);
  // The slow worker's next push is already behind: waiting helps nobody.
  std::vector<double> behind = {0, 1};  // next at 2, fast last at 3
  EXPECT_EQ(DsspExtraIterations(a, behind, 4), 0u);
}

}  // namespace
}  // namespace pacer
