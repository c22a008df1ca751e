// What the monitor saves of its job (--data-dir) and how a restarted one
// takes it back: MonitorCore's fields to and from a MonitorRecord, whose
// encoding lives in ps/base/messages.h.
#include <algorithm>
#include <map>

#include "monitor/monitor.h"
#include "ps/base/messages.h"
#include "spdlog/spdlog.h"

namespace pacer {

std::string MonitorCore::SaveState() const {
  std::map<uint32_t, std::string> tokens;
  for (const auto& [token, id] : worker_tokens_) tokens[id] = token;
  MonitorRecord r;
  r.job_id = options_.job_id;
  r.state = state_;
  r.stop_reason = stop_reason_;
  r.next_id = next_id_;
  r.next_rank = next_rank_;
  model_.Save(&r);
  r.map_built = map_built_;
  r.map_version = map_version_;
  r.membership_version = membership_version_;
  r.partition_count = partition_count_;
  for (const auto& [id, w] : workers_) {
    auto t = tokens.find(id);
    r.workers.push_back({w.id, w.rank, w.batch, w.staleness, w.staleness_range, w.start_clock,
                         w.clock, w.joined_version, w.alive, w.done,
                         t == tokens.end() ? std::string() : t->second, w.public_key});
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardState& sh = shards_[i];
    const auto range = i < ranges_.size() ? ranges_[i] : std::pair<uint64_t, uint64_t>{0, 0};
    r.shards.push_back({sh.id, sh.address, sh.incarnation, range.first, range.second,
                        sh.applied_clock, sh.restarts, sh.drained, sh.public_key, sh.backups,
                        sh.epoch, sh.node, sh.host, sh.served_at, sh.standby, sh.retired,
                        sh.promoted_from});
  }
  for (size_t p = 0; p < partitions_.size(); ++p) {
    r.partitions.push_back({static_cast<uint32_t>(p), partitions_[p].epoch, partitions_[p].offset,
                            partitions_[p].owner, partitions_[p].releasing});
  }
  r.seconds_running = seconds_running();
  r.saved_unix = UnixSeconds();
  if (last_accuracy_) r.last_accuracy = static_cast<float>(*last_accuracy_);
  r.time_to_target = time_to_target_;
  r.slack_open = policy_.slack_open();
  r.batch_per_worker = batch_per_worker_;
  r.epoch = epoch_;
  if (stream_) r.stream = stream_->Save();
  return EncodeMonitorRecord(r);
}

absl::Status MonitorCore::RestoreState(std::string_view bytes) {
  auto decoded = DecodeMonitorRecord(bytes);
  if (!decoded.ok()) return decoded.status();
  const MonitorRecord& st = *decoded;
  if (st.job_id != options_.job_id) {
    return absl::InvalidArgumentError("the saved state is job " + std::to_string(st.job_id) +
                                      ", this monitor runs job " + std::to_string(options_.job_id));
  }
  const TimePoint now = clock_->Now();
  state_ = st.state;
  stop_reason_ = st.stop_reason;
  next_id_ = st.next_id;
  next_rank_ = st.next_rank;
  model_.Restore(st);
  map_built_ = st.map_built;
  map_version_ = st.map_version;
  membership_version_ = st.membership_version;
  partition_count_ = st.partition_count;
  batch_per_worker_ = st.batch_per_worker;
  epoch_ = st.epoch;
  if (st.stream.has_value() != (options_.data_stream && st.map_built)) {
    return absl::InvalidArgumentError(
        st.stream ? std::string("the saved job reads its training set as one data stream; start "
                                "the monitor without --data-partitions")
                  : "the saved job reads data partitions (saved before the data stream became "
                    "the default, or started with --data-partitions); start the monitor with "
                    "--data-partitions " +
                        std::to_string(std::max<uint32_t>(1, st.partition_count)));
  }
  stream_.reset();
  if (st.stream) {
    stream_.emplace(StreamOptions());
    if (absl::Status s = stream_->Restore(*st.stream); !s.ok()) {
      stream_.reset();
      return absl::DataLossError(s.message());
    }
    logged_epoch_ = stream_->epoch();
  }
  partitions_.assign(partition_count_, PartitionState{});
  for (const auto& p : st.partitions) {
    if (p.index >= partitions_.size()) continue;
    partitions_[p.index] = {p.owner, p.epoch, p.offset, p.releasing};
  }
  workers_.clear();
  worker_tokens_.clear();
  std::map<uint32_t, policy::Assignment> saved;
  for (const auto& mw : st.workers) {
    WorkerState w;
    w.id = mw.id;
    w.rank = mw.rank;
    w.batch = mw.batch;
    w.staleness = mw.staleness;
    w.staleness_range = mw.staleness_range;
    w.start_clock = mw.start_clock;
    w.clock = mw.clock;
    w.joined_version = mw.joined_version;
    w.alive = mw.alive;
    w.done = mw.done;
    w.public_key = mw.public_key;
    w.last_seen = now;  // a fresh lease: it may still be training
    workers_[w.id] = w;
    if (!mw.token.empty()) worker_tokens_[mw.token] = w.id;
    if (w.alive && !w.done) saved[w.id] = {w.batch, w.staleness, w.staleness_range};
  }
  shards_.clear();
  ranges_.clear();
  for (const auto& ms : st.shards) {
    ShardState s;
    s.id = ms.id;
    s.address = ms.address;
    s.incarnation = ms.incarnation;
    s.public_key = ms.public_key;
    s.applied_clock = ms.applied_clock;
    s.restarts = ms.restarts;
    s.drained = ms.drained;
    s.backups = ms.backups;
    s.epoch = ms.epoch;
    s.node = ms.node;
    s.host = ms.host;
    s.served_at = ms.served_at;
    s.standby = ms.standby;
    s.retired = ms.retired;
    s.promoted_from = ms.promoted_from;
    s.last_seen = now;
    shards_.push_back(s);
    ranges_.emplace_back(ms.key_begin, ms.key_end);
  }
  if (st.seconds_running) {
    // The time it was down counts as running time (the time cap).
    const double down = std::max(0.0, UnixSeconds() - st.saved_unix);
    started_at_ = now - FromSeconds(*st.seconds_running + down);
  }
  if (st.last_accuracy) last_accuracy_ = *st.last_accuracy;
  if (st.time_to_target) time_to_target_ = st.time_to_target;
  // Workers that were here are gone or will say so; the job waits for a
  // live one before "all workers finished" can end it again.
  awaiting_workers_ = LiveWorkers().empty();
  if (state_ == wire::JobState::Stopped) {
    spdlog::warn("job {} had stopped ({}); resuming it", options_.job_id, stop_reason_);
    state_ = map_built_ ? wire::JobState::Running : wire::JobState::Waiting;
    stop_reason_.clear();
    if (map_built_ && !started_at_) started_at_ = now;
  }
  if (map_built_) {
    RescaleBatch(LiveWorkers().size());
    policy_.SetWorkers(LiveWorkers());
    if (stream_) {
      for (uint32_t id : LiveWorkers()) stream_->SetPace(id, 0, workers_.at(id).batch);
    }
    policy_.Restore(saved, st.slack_open);
    ApplyAssignments();
    metrics_.map_version->Set(static_cast<double>(map_version_));
  }
  // A new version, so that every shard takes the live set from us again.
  ChangeMembership("restarted", "monitor restarted");
  UpdateShardGauges();
  spdlog::info("resumed job {} from its saved state: {}, {} shard(s), {} live worker(s), shard map "
               "v{}, membership v{}",
               options_.job_id, wire::EnumNameJobState(state_), shards_.size(),
               LiveWorkers().size(), map_version_, membership_version_);
  return absl::OkStatus();
}

}  // namespace pacer
