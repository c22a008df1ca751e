// Tests of the monitor's managers on their own (monitor/*.h): the range
// table's one version bump and its index, the shard registry's leases, the
// membership's ranks and the order its listeners hear in, and replica
// placement and failover over a registry and a range table. MonitorCore's
// own tests (monitor_test.cc) drive them through messages.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "monitor/journal.h"
#include "monitor/membership.h"
#include "monitor/monitor_metrics.h"
#include "monitor/range_table.h"
#include "monitor/replication.h"
#include "monitor/shard_registry.h"
#include "prometheus/registry.h"

namespace pacer {
namespace {

using std::chrono::milliseconds;

struct Managers {
  prometheus::Registry registry;
  MonitorMetrics metrics{registry};
  Journal journal;
  FakeClock clock;
  ShardRegistry shards{&journal, &metrics};
  RangeTable ranges{&journal, &metrics};
  Membership members{&journal, &metrics};

  // Shards 1..n at tcp://hostI:5000, with a range each.
  void AddShards(uint32_t n) {
    for (uint32_t id = 1; id <= n; ++id) {
      ShardProcess s;
      s.id = id;
      s.address = "tcp://host" + std::to_string(id) + ":5000";
      s.last_seen = clock.Now();
      shards.Add(s);
      ranges.Add(id);
    }
  }
};

TEST(RangeTable, BuildBumpsOnceAndEveryChangeGoesThroughBump) {
  Managers m;
  m.AddShards(2);
  EXPECT_FALSE(m.ranges.built());
  EXPECT_FALSE(m.ranges.HoldsKeys(0));  // not built: no range holds keys
  m.journal.Take();
  m.ranges.Build({{0, 10}, {10, 10}});
  EXPECT_TRUE(m.ranges.built());
  EXPECT_EQ(m.ranges.version(), 1u);
  EXPECT_TRUE(m.journal.Take());  // saved before the map goes out
  EXPECT_TRUE(m.ranges.HoldsKeys(0));
  EXPECT_FALSE(m.ranges.HoldsKeys(1));  // an empty range
  EXPECT_NE(m.ranges[0].epoch, m.ranges[1].epoch);
  m.ranges.Bump("test");
  EXPECT_EQ(m.ranges.version(), 2u);
  EXPECT_TRUE(m.journal.Take());
  ASSERT_TRUE(m.ranges.Index(2).has_value());
  EXPECT_EQ(*m.ranges.Index(2), 1u);
  EXPECT_FALSE(m.ranges.Index(3).has_value());
  EXPECT_EQ(m.ranges[0].primary(), 1u);
  m.ranges[0].host = 2;
  EXPECT_EQ(m.ranges[0].primary(), 2u);
}

TEST(RangeTable, SavedAndRestoredWithTheRegistry) {
  Managers m;
  m.AddShards(2);
  m.ranges.Build({{0, 10}, {10, 20}});
  m.ranges[0].backups = {2};
  m.ranges[1].host = 1;
  m.ranges[1].served_at = "tcp://host1:6000";
  MonitorRecord r;
  m.shards.Save(&r);
  m.ranges.Save(&r);
  Managers back;
  back.shards.Restore(r, back.clock.Now());
  back.ranges.Restore(r);
  ASSERT_EQ(back.shards.size(), 2u);
  ASSERT_EQ(back.ranges.size(), 2u);
  EXPECT_EQ(back.shards[1].address, "tcp://host2:5000");
  EXPECT_EQ(back.ranges.version(), m.ranges.version());
  EXPECT_EQ(back.ranges[0].backups, std::vector<uint32_t>{2});
  EXPECT_EQ(back.ranges[1].primary(), 1u);
  EXPECT_EQ(back.ranges[1].served_at, "tcp://host1:6000");
  EXPECT_EQ(back.ranges[1].begin, 10u);
  EXPECT_EQ(*back.shards.Index(2), 1u);
}

TEST(ShardRegistry, SilentShardsGoDownAndTheReturnListenersHear) {
  Managers m;
  m.AddShards(2);
  m.clock.Advance(milliseconds(500));
  m.shards[1].last_seen = m.clock.Now();
  EXPECT_TRUE(m.shards.ExpireLeases(m.clock.Now(), milliseconds(300)));
  EXPECT_TRUE(m.shards[0].down);
  EXPECT_FALSE(m.shards[1].down);
  EXPECT_FALSE(m.shards.ExpireLeases(m.clock.Now(), milliseconds(300)));  // once
  std::vector<size_t> heard;
  m.shards.OnReturn([&](size_t i) { heard.push_back(i); });
  m.shards[0].replicas[2] = 5;
  m.shards.Returned(0);
  EXPECT_EQ(heard, std::vector<size_t>{0});
  EXPECT_TRUE(m.shards[0].replicas.empty());  // a new process holds none
  EXPECT_EQ(m.shards.HostOf(1), "host2");
  m.shards[1].node = "rack-b";
  EXPECT_EQ(m.shards.HostOf(1), "rack-b");
}

TEST(Membership, RanksAreReusedAndListenersHearInOrder) {
  Managers m;
  std::vector<std::string> heard;
  m.members.OnChange([&] { heard.push_back("change v" + std::to_string(m.members.version())); });
  m.members.OnLiveSetChange([&] { heard.push_back("live"); });
  const TimePoint now = m.clock.Now();
  EXPECT_EQ(m.members.Join(1, "a", "", now, 0).rank, 0u);
  EXPECT_EQ(m.members.Join(2, "b", "", now, 0).rank, 1u);
  // A joining worker: the live set first, then the change (before its
  // version moves); its joined version is the change's.
  EXPECT_EQ(heard, (std::vector<std::string>{"live", "change v0", "live", "change v1"}));
  EXPECT_EQ(m.members.at(2).joined_version, 2u);
  heard.clear();
  EXPECT_TRUE(m.members.Remove(1));
  EXPECT_FALSE(m.members.Remove(1));  // not live any more
  // A leaving one: the change, then the live set.
  EXPECT_EQ(heard, (std::vector<std::string>{"change v2", "live"}));
  EXPECT_EQ(m.members.Join(3, "c", "", now, 0).rank, 0u);  // the free rank
  EXPECT_EQ(m.members.ByToken("b")->id, 2u);
  EXPECT_EQ(m.members.ByToken("x"), nullptr);
  EXPECT_EQ(m.members.Evaluator(), 3u);  // the lowest rank
  m.clock.Advance(milliseconds(500));
  m.members.Find(2)->last_seen = m.clock.Now();
  m.members.ExpireLeases(m.clock.Now(), milliseconds(300));
  EXPECT_EQ(m.members.LiveWorkers(), std::vector<uint32_t>{2});
}

TEST(Membership, HoldIsPastEveryWorkerAndRisesWithALateOne) {
  Managers m;
  m.members.Join(1, "", "", m.clock.Now(), 7);
  m.members.Join(2, "", "", m.clock.Now(), 4);
  m.members.Hold();
  EXPECT_EQ(m.members.pause_at(), 9u);
  m.members.Hold();  // held already: unchanged
  EXPECT_EQ(m.members.pause_at(), 9u);
  m.members.Find(2)->clock = 12;
  m.members.RaiseHold(m.members.at(2));
  EXPECT_EQ(m.members.pause_at(), 12u);
  m.members.Release();
  EXPECT_EQ(m.members.pause_at(), 0u);
}

TEST(Replication, BackupsGoToOtherHostsAndADownPrimaryFailsOver) {
  Managers m;
  m.AddShards(3);
  m.shards[2].node = "host1";  // shard 3 shares shard 1's host
  Replication repl({/*replicas=*/1, milliseconds(300)}, &m.clock, &m.shards, &m.ranges,
                   &m.journal, &m.metrics);
  m.ranges.Build({{0, 10}, {10, 20}, {20, 30}});
  const uint64_t v = m.ranges.version();
  EXPECT_TRUE(repl.Assign());
  EXPECT_EQ(m.ranges.version(), v + 1);  // the new sets go out with the map
  EXPECT_EQ(m.ranges[0].backups, std::vector<uint32_t>{2});  // not on host1
  EXPECT_EQ(repl.under_replicated(), 0u);
  EXPECT_FALSE(repl.Assign());  // nothing changed
  // Shard 1 is down; shard 2 reported a replica of range 1's epoch.
  m.shards[1].replicas[1] = m.ranges[0].epoch;
  m.shards.SetDown(0, true);
  const uint64_t epoch = m.ranges[0].epoch;
  EXPECT_TRUE(repl.FailOver());
  EXPECT_EQ(m.ranges[0].primary(), 2u);
  EXPECT_GT(m.ranges[0].epoch, epoch);
  EXPECT_TRUE(m.ranges[0].backups.empty());  // Assign gives it a new one
  EXPECT_EQ(repl.failovers(), 1u);
  // The promoted shard reports where it serves the range: the map moves.
  msg::Heartbeat hb;
  msg::ShardInfo serving;
  serving.id = 1;
  serving.epoch = m.ranges[0].epoch;
  serving.address = "tcp://host2:6001";
  hb.serving.push_back(serving);
  const uint64_t before = m.ranges.version();
  repl.TakeHeartbeat(1, hb);
  EXPECT_EQ(m.ranges[0].served_at, "tcp://host2:6001");
  EXPECT_EQ(m.ranges.version(), before + 1);
}

}  // namespace
}  // namespace pacer
