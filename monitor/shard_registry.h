// The shard processes the monitor knows: who registered (id, address, key,
// node, incarnation), whether each is up, what its heartbeats say, and
// what the monitor's channel to it has acknowledged. The key ranges named
// after the shards live in the range table (monitor/range_table.h), at the
// same index. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_SHARD_REGISTRY_H_
#define PACER_MONITOR_SHARD_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "monitor/journal.h"
#include "monitor/monitor_metrics.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

// One shard process, as it registered and as its heartbeats report it.
struct ShardProcess {
  uint32_t id = 0;
  std::string address;
  std::string public_key;    // CURVE, as it authenticated at registration
  std::string node;          // --node as it registered ("": its address's host)
  uint64_t incarnation = 0;  // of the process that registered last
  uint32_t restarts = 0;
  TimePoint last_seen{};
  bool down = false;     // left on SIGTERM, or silent past the lease
  bool drained = false;  // its range moved away (pacerctl drain-shard); stopped
  // pacerctl drain-shard with --replicas handed its range to a backup: the
  // process stops (told so in its heartbeat replies) and never backs
  // anything up; the range lives on at its new primary.
  bool retired = false;
  // From its heartbeats: the furthest clock it applied, its checkpoint's
  // age in seconds (-1: none), the clock of its last heartbeat, and the
  // replicas it holds (range -> epoch).
  int64_t applied_clock = -1;
  float checkpoint_age = -1;
  int64_t reported_applied = -1;
  std::map<uint32_t, uint64_t> replicas;

  // The monitor's channel at this index: to the shard's own address, or
  // after a failover to where its range is served now. What that end has
  // acknowledged of the model's keys and of the membership, and the
  // requests in flight.
  struct Channel {
    bool acked_model = false;
    uint64_t acked_membership = 0;
    uint64_t model_request = 0;
    uint64_t membership_request = 0;
    uint64_t membership_request_version = 0;  // the version that request carried
    TimePoint last_sent{};
    // Its end changed (a restart, a promotion served): the keys and the
    // membership go again, at once.
    void Resend() {
      acked_model = false;
      acked_membership = 0;
      last_sent = TimePoint{};
    }
  };
  Channel channel;
};

class ShardRegistry {
 public:
  ShardRegistry(Journal* journal, MonitorMetrics* metrics) : journal_(journal), metrics_(metrics) {}

  size_t size() const { return shards_.size(); }
  bool empty() const { return shards_.empty(); }
  ShardProcess& operator[](size_t i) { return shards_[i]; }
  const ShardProcess& operator[](size_t i) const { return shards_[i]; }
  std::vector<ShardProcess>::iterator begin() { return shards_.begin(); }
  std::vector<ShardProcess>::iterator end() { return shards_.end(); }
  std::vector<ShardProcess>::const_iterator begin() const { return shards_.begin(); }
  std::vector<ShardProcess>::const_iterator end() const { return shards_.end(); }

  // The index of shard `id` (nullopt: no such shard).
  std::optional<size_t> Index(uint32_t id) const {
    auto it = index_.find(id);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }
  // The index of the shard registered at `address` (nullopt: none).
  std::optional<size_t> AtAddress(const std::string& address) const;
  std::vector<uint32_t> Ids() const;
  // What replicas are placed apart by: the shard's --node, else its
  // address's host.
  std::string HostOf(size_t i) const;
  // Whether shard `id` is a live shard that will go on serving (not down,
  // drained or retired).
  bool Serving(size_t i) const {
    return !shards_[i].down && !shards_[i].drained && !shards_[i].retired;
  }

  // A new shard process; its index is the old size.
  ShardProcess& Add(ShardProcess s);
  // Shards silent for longer than `lease` are marked down (they keep their
  // keys); true when one was.
  bool ExpireLeases(TimePoint now, Duration lease);
  // Shard i left (SIGTERM) or came back from a silence: the gauges follow.
  void SetDown(size_t i, bool down);
  // Shard i registered again as a new process (from its checkpoints): it
  // holds no replica until its heartbeats say so (nothing may count on what
  // the old one held); then the listeners registered with OnReturn hear.
  void Returned(size_t i);
  void OnReturn(std::function<void(size_t)> listener) { on_return_.push_back(std::move(listener)); }
  // pacer_monitor_shards and pacer_monitor_shards_up from the registry.
  void UpdateGauges();

  // Its part of the monitor's saved state: one entry per shard in
  // r->shards, in order (the range table fills in the range's fields).
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r, TimePoint now);

 private:
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  std::vector<ShardProcess> shards_;
  std::map<uint32_t, size_t> index_;  // id -> index in shards_
  std::vector<std::function<void(size_t)>> on_return_;
};

}  // namespace pacer

#endif  // PACER_MONITOR_SHARD_REGISTRY_H_
