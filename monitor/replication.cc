#include "monitor/replication.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "ps/shard.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// "2, 3", or "none".
std::string IdList(const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s.empty() ? "none" : s;
}

}  // namespace

size_t Replication::PrimaryIndex(size_t i) const {
  const RangeState& r = (*ranges_)[i];
  if (r.host == 0) return i;
  return shards_->Index(r.host).value_or(i);
}

bool Replication::Assign() {
  RangeTable& ranges = *ranges_;
  const ShardRegistry& shards = *shards_;
  if (!ranges.built()) return false;
  // Ranges each shard holds or backs: new backups go to the least loaded.
  std::vector<size_t> load(shards.size(), 0);
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges.HoldsKeys(i)) ++load[PrimaryIndex(i)];
    for (uint32_t b : ranges[i].backups) {
      if (auto at = shards.Index(b)) ++load[*at];
    }
  }
  bool changed = false;
  for (size_t i = 0; i < ranges.size(); ++i) {
    std::vector<uint32_t>& set = ranges[i].backups;
    const std::vector<uint32_t> before = set;
    const size_t want = ranges.HoldsKeys(i) ? options_.replicas : 0;
    const size_t p = PrimaryIndex(i);
    // A backup goes when it is down, drained or gone, or the range needs
    // fewer (a smaller --replicas, or the range moved away). Nor is a range
    // backed up by the shard it is named after once it is served elsewhere
    // (a failover, and that shard came back): a shard holds replicas of
    // other ranges only (ShardCore::SetBacking), so it would hold none, and
    // the range would have no copy to fail over to (found by the crash
    // loop, bench/replication/crash_loop.sh).
    std::erase_if(set, [&](uint32_t b) {
      const auto at = shards.Index(b);
      const bool drop = !at || *at == p || *at == i || !usable(*at);
      if (drop && at) --load[*at];
      return drop;
    });
    while (set.size() > want) {
      --load[*shards.Index(set.back())];
      set.pop_back();
    }
    while (set.size() < want) {
      std::optional<size_t> best;
      std::tuple<bool, size_t, size_t> best_key{};
      for (size_t j = 0; j < shards.size(); ++j) {
        if (j == p || j == i || !usable(j) || std::count(set.begin(), set.end(), shards[j].id) > 0) {
          continue;
        }
        // Fell behind on this range a short while ago (DropLagging), or
        // stands by for it: its old replica of this epoch would count as in
        // sync before its new seed came.
        const RangeState& r = ranges[i];
        if (auto d = r.lag_dropped.find(shards[j].id);
            (d != r.lag_dropped.end() && clock_->Now() < d->second) ||
            std::count(r.standby.begin(), r.standby.end(), shards[j].id) > 0) {
          continue;
        }
        const std::string host = shards.HostOf(j);
        bool shared = host == shards.HostOf(p);
        for (uint32_t b : set) shared = shared || host == shards.HostOf(*shards.Index(b));
        const std::tuple<bool, size_t, size_t> key{shared, load[j], j};
        if (!best || key < best_key) {
          best = j;
          best_key = key;
        }
      }
      if (!best) break;  // too few live shards
      set.push_back(shards[*best].id);
      ++load[*best];
    }
    if (set != before) {
      changed = true;
      if (want > 0) {
        spdlog::info("keys [{}, {}) on shard {} (epoch {}): backups {}", ranges[i].begin,
                     ranges[i].end, ranges[i].id, ranges[i].epoch, IdList(set));
      }
    }
  }
  for (size_t i = 0; i < ranges.size(); ++i) PruneStandby(i);
  size_t short_of_k = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges.HoldsKeys(i) && ranges[i].backups.size() < options_.replicas) ++short_of_k;
  }
  if (short_of_k != under_replicated_) {
    if (short_of_k > 0) {
      spdlog::warn("{} key range(s) have fewer than {} backup(s): too few live shards (each backup "
                   "must be another shard than its range's primary); a shard that registers "
                   "fills the gap",
                   short_of_k, options_.replicas);
    } else if (options_.replicas > 0) {
      spdlog::info("every key range has its {} backup(s)", options_.replicas);
    }
    under_replicated_ = short_of_k;
  }
  if (changed) ranges.Bump("replica sets");
  UpdateGauges();
  return changed;
}

void Replication::TakeHeartbeat(size_t at, const msg::Heartbeat& hb) {
  const ShardProcess& shard = (*shards_)[at];
  TakeServing(shard, hb.serving);
  for (const msg::RangeLag& r : hb.lag) {
    // From the range's primary (the shard itself, or its host since a
    // failover), at the range's epoch.
    const auto ri = ranges_->Index(r.range);
    if (!ri) continue;
    RangeState& range = (*ranges_)[*ri];
    if (range.epoch != r.epoch || range.primary() != shard.id) continue;
    range.lag = r;
    range.lag_at = shard.last_seen;
  }
}

void Replication::TakeServing(const ShardProcess& host, const std::vector<msg::ShardInfo>& serving) {
  for (const msg::ShardInfo& r : serving) {
    const auto i = ranges_->Index(r.id);
    if (!i) continue;
    RangeState& s = (*ranges_)[*i];
    if (s.host != host.id || s.epoch != r.epoch || s.served_at == r.address) continue;
    s.served_at = r.address;
    s.promoted_from = 0;  // served: nothing to go back to
    // Its keys and the membership go to the range's new address; the
    // workers take it with the map.
    (*shards_)[*i].channel.Resend();
    ranges_->Bump("a promoted range is served");
    spdlog::info("shard {}'s range is served by shard {} at {} (epoch {}): shard map v{}", s.id,
                 host.id, r.address, s.epoch, ranges_->version());
  }
}

void Replication::FillHeartbeatReply(size_t at, const msg::Heartbeat& hb, bool moving,
                                     msg::HeartbeatReply* reply) {
  RangeTable& ranges = *ranges_;
  const ShardProcess& shard = (*shards_)[at];
  // Ranges it still serves since a promotion that another shard serves
  // now (they failed over again while it was cut off).
  for (const msg::ShardInfo& r : hb.serving) {
    const auto ri = ranges.Index(r.id);
    if (!ri || ranges[*ri].epoch <= r.epoch) continue;  // not superseded (yet)
    msg::ShardInfo gone;
    gone.id = r.id;
    gone.epoch = ranges[*ri].epoch;
    reply->deposed_ranges.push_back(std::move(gone));
  }
  DropLagging(at, hb.lagging);
  if (hb.handed_off && !handoff_ && !moving && ranges[at].host == 0 && !shard.retired &&
      ranges.HoldsKeys(at)) {
    // It stopped applying for a drain this monitor does not know of (it
    // restarted meanwhile, or gave the drain up too early): finish it.
    spdlog::warn("shard {} says it handed its range over; finishing that drain", shard.id);
    handoff_ = Handoff{at, clock_->Now(), clock_->Now()};
  }
  StepHandoff(at, hb.handed_off);
  FillReply(at, reply);
  if (shard.retired) {
    // Drained: its range is served by the backup it handed it to.
    reply->state = wire::JobState::Stopped;
    reply->stop_reason = "drained: its range is served by shard " + std::to_string(ranges[at].host);
  }
}

bool Replication::FailOver() {
  if (options_.replicas == 0 || !ranges_->built()) return false;
  bool changed = false;
  for (size_t i = 0; i < ranges_->size(); ++i) {
    const RangeState& s = (*ranges_)[i];
    if (!ranges_->HoldsKeys(i) || (*shards_)[i].drained) continue;
    // Its primary: the shard itself, or after a failover the one hosting it.
    const auto h = s.host == 0 ? std::optional<size_t>(i) : shards_->Index(s.host);
    const bool primary_down = !h || (*shards_)[*h].down;
    if (!primary_down) continue;
    const ShardProcess& gone = (*shards_)[h.value_or(i)];
    const std::string why = fmt::format("shard {} silent for {:.2f} s (--shard-lease {:.2f} s)",
                                        gone.id, ToSeconds(clock_->Now() - gone.last_seen),
                                        ToSeconds(options_.shard_lease));
    if (handoff_ && handoff_->shard == i) {
      spdlog::warn("drain of shard {}: it died before handing its range over; a failover "
                   "takes it",
                   s.id);
      handoff_.reset();
    }
    // A promotion lost before it was served goes back at once only to a
    // live shard; to a dead one when it returns (OnShardRestarted), so
    // that a backup seeded meanwhile may still report and take it.
    changed |= PromoteBackup(i, why) || RevertUnservedPromotion(i, why, /*to_down=*/false);
  }
  if (changed) UpdateGauges();
  return changed;
}

bool Replication::RevertUnservedPromotion(size_t i, const std::string& why, bool to_down) {
  RangeState& s = (*ranges_)[i];
  if (s.host == 0 || !s.served_at.empty() || s.promoted_from == 0 || s.promoted_from == s.host) {
    return false;
  }
  // No worker heard of the promoted shard's address for the range (it
  // goes out with the map once the shard reports serving it), so it
  // acknowledged nothing of it; what its replica held came from the last
  // shard that served the range, whose state has all of it (or, if it
  // died, its checkpoint is what is left).
  const uint32_t lost = s.host, back = s.promoted_from;
  const auto bi = shards_->Index(back);
  if (!bi || (*shards_)[*bi].retired || (*shards_)[*bi].drained) return false;  // stopped for good
  if ((*shards_)[*bi].down && !to_down) return false;
  s.host = back == s.id ? 0 : back;
  s.promoted_from = 0;
  s.served_at.clear();
  s.epoch = ranges_->NextEpoch();  // the lost shard, if only cut off, lets go of it
  s.backups.clear();
  s.standby.clear();
  ranges_->Bump("an unserved promotion goes back");
  spdlog::warn("shard {}'s keys [{}, {}) go back to shard {} at epoch {}: {}, shard {} had not "
               "served them since its promotion, and no backup reported holding them",
               s.id, s.begin, s.end, back, s.epoch, why, lost);
  return true;
}

void Replication::OnShardRestarted(size_t at) {
  if (options_.replicas == 0 || !ranges_->built()) return;
  const uint32_t id = (*shards_)[at].id;
  bool changed = false;
  for (size_t i = 0; i < ranges_->size(); ++i) {
    if (!ranges_->HoldsKeys(i) || (*shards_)[i].drained || (*ranges_)[i].primary() != id) continue;
    // It restarted before its lease ran out (else the range failed over
    // already). Its checkpoint lacks what was applied since; a backup that
    // holds the range has every durable push, and takes it over now. With
    // none, the range comes back from the checkpoint (pushes since lost).
    if (handoff_ && handoff_->shard == i) {
      spdlog::warn("drain of shard {}: it restarted before handing its range over; a failover "
                   "takes it",
                   (*ranges_)[i].id);
      handoff_.reset();
    }
    const std::string why = fmt::format(
        "shard {} restarted (a new process: its checkpoint lacks what it applied since)", id);
    // Promoted here and not served: the new process holds neither a
    // replica nor a checkpoint of it; back to the last that served it.
    changed |= PromoteBackup(i, why, /*restarted=*/true) ||
               RevertUnservedPromotion(i, why, /*to_down=*/true);
  }
  for (size_t i = 0; i < ranges_->size(); ++i) {
    // Ranges promoted away from it to a shard lost before serving them
    // (FailOver waits for a backup to report, or for this shard): back.
    const RangeState& r = (*ranges_)[i];
    const auto h = r.host == 0 ? std::nullopt : shards_->Index(r.host);
    if (r.promoted_from != id || !r.served_at.empty() || !h || !(*shards_)[*h].down ||
        (*shards_)[i].drained || !ranges_->HoldsKeys(i)) {
      continue;
    }
    const std::string why = fmt::format("shard {} is lost and shard {} is back", r.host, id);
    changed |= PromoteBackup(i, why) || RevertUnservedPromotion(i, why, /*to_down=*/false);
  }
  if (changed) UpdateGauges();
}

std::optional<uint32_t> Replication::InSyncBackup(size_t i, bool standby) const {
  const RangeState& s = (*ranges_)[i];
  const auto in_sync = [&](uint32_t b) {
    const auto bi = shards_->Index(b);
    if (!bi || !usable(*bi)) return false;  // gone, or about to stop (a drain in progress)
    const auto& held = (*shards_)[*bi].replicas;
    auto it = held.find(s.id);
    return it != held.end() && it->second == s.epoch;
  };
  for (uint32_t b : s.backups) {
    if (in_sync(b)) return b;
  }
  if (standby) {
    for (uint32_t b : s.standby) {
      if (in_sync(b)) return b;
    }
  }
  return std::nullopt;
}

bool Replication::PruneStandby(size_t i) {
  RangeState& s = (*ranges_)[i];
  if (s.standby.empty()) return false;
  const bool has_range = ranges_->HoldsKeys(i);
  const uint32_t primary = s.primary();
  // Covered: a backup in the set holds the range. With none in the set the
  // primary calls every applied push durable at once (the guarantee of
  // --replicas 0), so a standby would lack durable pushes: let go too.
  const bool covered = InSyncBackup(i).has_value() || s.backups.empty();
  const std::vector<uint32_t> before = s.standby;
  std::erase_if(s.standby, [&](uint32_t b) {
    const auto bi = shards_->Index(b);
    return covered || !has_range || !bi || b == primary || !shards_->Serving(*bi) ||
           std::count(s.backups.begin(), s.backups.end(), b) > 0;
  });
  if (s.standby == before) return false;
  if (covered) {
    spdlog::info("keys [{}, {}) (shard {}'s range): backup {} holds the range; standby {} lets "
                 "its replica go",
                 s.begin, s.end, s.id, IdList(s.backups), IdList(before));
  }
  journal_->Mark();
  return true;
}

bool Replication::PromoteBackup(size_t i, const std::string& reason, bool restarted) {
  RangeState& s = (*ranges_)[i];
  const uint32_t before = s.primary();
  // A live backup that reported a replica of this epoch takes over (a
  // standby, when no backup in the set can, unless this is a drain).
  const bool drain = handoff_ && handoff_->shard == i;
  const std::optional<uint32_t> backup = InSyncBackup(i, /*standby=*/!drain);
  if (!backup) return false;
  const uint32_t b = *backup;
  const bool from_standby = std::count(s.standby.begin(), s.standby.end(), b) > 0 &&
                            std::count(s.backups.begin(), s.backups.end(), b) == 0;
  // Kept until b serves the range (TakeServing): if b is lost before, the
  // range goes back to the last shard that served it (RevertUnserved-
  // Promotion): `before`, unless `before` never served it either.
  if (s.host == 0 || !s.served_at.empty() || s.promoted_from == 0) s.promoted_from = before;
  s.host = b;
  s.served_at.clear();
  s.epoch = ranges_->NextEpoch();
  // The promoted replica is the primary now; Assign gives the range a new
  // backup, seeded from it while training goes on.
  s.backups.clear();
  s.standby.clear();
  s.failed_over_at = clock_->Now();
  ++failovers_;
  if (from_standby) {
    spdlog::warn("failover of shard {}'s range: to standby {} (dropped for falling behind; "
                 "durability was held since, so its replica holds every durable push; no "
                 "backup in the set was known to hold the range)",
                 s.id, b);
  }
  (drain ? metrics_->handoffs : restarted ? metrics_->restart_failovers : metrics_->failovers)
      ->Increment();
  journal_->Mark();
  spdlog::warn("failover: {}; shard {}'s keys [{}, {}) go from shard {} to its backup, shard {}, "
               "at epoch {}",
               reason, s.id, s.begin, s.end, before, b, s.epoch);
  return true;
}

void Replication::DropLagging(size_t from, const std::vector<msg::ShardInfo>& lagging) {
  if (options_.replicas == 0 || !ranges_->built() || lagging.empty()) return;
  const TimePoint now = clock_->Now();
  const uint32_t primary = (*shards_)[from].id;
  bool changed = false;
  for (const msg::ShardInfo& r : lagging) {
    const auto ri = ranges_->Index(r.id);
    // Only the range's primary speaks for it (not one it failed over from).
    if (!ri || (*ranges_)[*ri].primary() != primary) continue;
    RangeState& s = (*ranges_)[*ri];
    for (uint32_t b : r.backups) {
      auto it = std::find(s.backups.begin(), s.backups.end(), b);
      if (it == s.backups.end()) continue;
      s.backups.erase(it);
      s.lag_dropped[b] = now + kLagCooldown;
      // Kept as a standby; its primary is told to hold durability
      // (hold_durable for its own range, hold_durable_ranges for one it
      // serves since a promotion).
      if (std::count(s.standby.begin(), s.standby.end(), b) == 0) s.standby.push_back(b);
      metrics_->backups_dropped->Increment();
      changed = true;
      spdlog::warn("backup {} of shard {}'s range fell behind (its primary, shard {}, waited over "
                   "{:.0f} s for its acknowledgement): dropped from the set, kept as a standby "
                   "until a new backup holds the range; not given this range again for {:.0f} s",
                   b, s.id, primary, ToSeconds(ShardCore::kBackupLagLimit),
                   ToSeconds(kLagCooldown));
    }
  }
  if (!changed) return;
  // The new set goes out before anyone counts on the dropped backup; a
  // free shard, if any, takes its place (Assign counts only its own
  // changes, so the map's version goes up here too).
  Assign();
  ranges_->Bump("a lagging backup dropped");
}

bool Replication::CanHandOff(size_t i) const {
  const uint32_t id = (*shards_)[i].id;
  bool hosts_others = false;
  for (size_t j = 0; j < ranges_->size(); ++j) hosts_others |= (*ranges_)[j].host == id;
  return options_.replicas > 0 && (*ranges_)[i].host == 0 && !(*shards_)[i].down &&
         !hosts_others && InSyncBackup(i).has_value();
}

void Replication::StartHandoff(size_t i) {
  const RangeState& r = (*ranges_)[i];
  handoff_ = Handoff{i, clock_->Now(), clock_->Now()};
  handoff_given_up_.erase(r.id);
  spdlog::info("draining shard {}: it hands keys [{}, {}) to its backup ({}) before it stops",
               r.id, r.begin, r.end, IdList(r.backups));
  // The ranges it backs up get other backups now: the heartbeat reply that
  // asks it to hand over also tells it to let go of their replicas, long
  // before it stops (a hand-over can finish before the next tick, and a
  // stopped shard hears nothing more).
  Assign();
}

void Replication::StepHandoff(size_t i, bool handed_off) {
  if (!handoff_ || handoff_->shard != i) return;
  const RangeState& s = (*ranges_)[i];
  const TimePoint now = clock_->Now();
  if (!handed_off) {
    if (now - handoff_->started >= kHandoffTimeout) {
      // Never got going (e.g. the shard's backups never held its last
      // record): given up; the shard forgets the request unless it has
      // stopped applying, and then says so and the drain is finished.
      spdlog::error("drain of shard {}: not handed over after {:.0f} s; given up (pacerctl "
                    "drain-shard may be asked again)",
                    s.id, ToSeconds(kHandoffTimeout));
      handoff_given_up_.insert(s.id);  // told so: it applies again
      handoff_.reset();
      return;
    }
    if (now - handoff_->reported >= std::chrono::seconds(5)) {
      handoff_->reported = now;
      spdlog::warn("drain of shard {}: waiting {:.1f} s for it to stop and for its backups ({}) "
                   "to hold everything it applied",
                   s.id, ToSeconds(now - handoff_->started), IdList(s.backups));
    }
    return;
  }
  const std::string why = fmt::format(
      "pacerctl drain-shard: shard {} stopped applying and its backups hold all it applied "
      "({:.2f} s)",
      s.id, ToSeconds(now - handoff_->started));
  if (!PromoteBackup(i, why)) {
    // Its backups changed meanwhile: wait for one to report this epoch.
    return;
  }
  (*shards_)[i].retired = true;
  handoff_.reset();
  Assign();
  shards_->UpdateGauges();
}

void Replication::FillReply(size_t i, msg::HeartbeatReply* reply) const {
  const RangeTable& ranges = *ranges_;
  const ShardRegistry& shards = *shards_;
  if (options_.replicas == 0 || !ranges.built() || i >= ranges.size()) return;
  const auto info = [&](size_t j) {
    msg::ShardInfo s;
    s.id = shards[j].id;
    s.address = shards[j].address;
    s.public_key = shards[j].public_key;
    s.epoch = ranges[j].epoch;
    return s;
  };
  const auto add_backups = [&](const std::vector<uint32_t>& ids, std::vector<msg::ShardInfo>* to) {
    for (uint32_t b : ids) {
      if (auto at = shards.Index(b)) to->push_back(info(*at));
    }
  };
  const uint32_t id = shards[i].id;
  // The ranges it serves since a failover, with their backups.
  for (size_t j = 0; j < ranges.size(); ++j) {
    if (ranges[j].host != id || !ranges.HoldsKeys(j)) continue;
    msg::ShardInfo r;
    r.id = ranges[j].id;
    r.epoch = ranges[j].epoch;
    r.key_begin = ranges[j].begin;
    r.key_end = ranges[j].end;
    r.backups = ranges[j].backups;
    reply->promote.push_back(std::move(r));
    add_backups(ranges[j].backups, &reply->promote_backups);
    // A standby may be promoted: nothing it lacks may become durable.
    if (!ranges[j].standby.empty()) reply->hold_durable_ranges.push_back(ranges[j].id);
  }
  // Its own range, unless that is served elsewhere now: then it is told
  // so (a shard cut off from the monitor while its range failed over still
  // holds it, and workers with an older map may still reach it).
  if (ranges.HoldsKeys(i) && ranges[i].host == 0) {
    reply->replica_epoch = ranges[i].epoch;
    add_backups(ranges[i].backups, &reply->replica_backups);
    reply->hand_off = handoff_ && handoff_->shard == i;
    reply->hand_off_given_up = handoff_given_up_.count(id) > 0;
    // A standby may be promoted: nothing it lacks may become durable.
    reply->hold_durable = !ranges[i].standby.empty();
  } else if (ranges.HoldsKeys(i)) {
    reply->replica_epoch = ranges[i].epoch;
    reply->deposed = true;
  }
  // The ranges it backs up, each with its primary's key.
  for (size_t j = 0; j < ranges.size(); ++j) {
    if (j == i || !ranges.HoldsKeys(j) || !ranges.Backs(j, id)) continue;
    msg::ShardInfo r = info(j);
    const auto p = shards.Index(ranges[j].primary());  // after a failover, the host's key
    r.public_key = shards[p.value_or(j)].public_key;
    reply->backing.push_back(std::move(r));
  }
}

}  // namespace pacer
