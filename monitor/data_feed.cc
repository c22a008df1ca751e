#include "monitor/data_feed.h"

#include <algorithm>
#include <map>

#include "spdlog/spdlog.h"

namespace pacer {

void DataFeed::Start(const std::optional<DataStreamOptions>& stream, uint32_t partitions) {
  if (stream) {
    // One stream over the whole training set instead of partitions.
    stream_.emplace(*stream);
    for (uint32_t id : members_->LiveWorkers()) stream_->SetPace(id, 0, 1);
    partition_count_ = 0;
    partitions_.clear();
    spdlog::info("data stream over {} samples: {} epoch(s), chunks of {}", stream->samples,
                 stream->epochs == 0 ? std::string("no cap on") : std::to_string(stream->epochs),
                 stream->chunk_samples > 0 ? std::to_string(stream->chunk_samples) + " samples"
                                           : std::string("2 s of each worker's speed"));
  } else {
    partition_count_ = partitions;
    partitions_.assign(partition_count_, PartitionState{});
  }
}

void DataFeed::Reassign() {
  AssignPartitions();
  ReleaseDeparted();
}

void DataFeed::AssignPartitions() {
  if (partitions_.empty()) return;
  std::map<uint32_t, std::vector<size_t>> owned;  // live worker -> partitions
  std::vector<uint32_t> live = members_->LiveWorkers();
  std::sort(live.begin(), live.end(), [&](uint32_t a, uint32_t b) {
    return members_->at(a).rank < members_->at(b).rank;
  });
  for (uint32_t id : live) owned[id];
  for (size_t p = 0; p < partitions_.size(); ++p) {
    // A worker that died while handing a partition over cannot report any
    // more: the new owner starts from its last reported position.
    if (partitions_[p].releasing != 0 && !owned.count(partitions_[p].releasing)) {
      partitions_[p].releasing = 0;
    }
    auto it = owned.find(partitions_[p].owner);
    if (it != owned.end()) {
      it->second.push_back(p);
    } else {
      partitions_[p].owner = 0;
    }
  }
  if (live.empty()) return;
  auto fewest = [&] {
    uint32_t best = live[0];
    for (uint32_t id : live) {
      if (owned[id].size() < owned[best].size()) best = id;
    }
    return best;
  };
  auto most = [&] {
    uint32_t best = live[0];
    for (uint32_t id : live) {
      if (owned[id].size() > owned[best].size()) best = id;
    }
    return best;
  };
  for (size_t p = 0; p < partitions_.size(); ++p) {
    if (partitions_[p].owner != 0) continue;
    const uint32_t to = fewest();
    partitions_[p].owner = to;
    owned[to].push_back(p);
    spdlog::info("data partition {} (epoch {}, offset {}) -> worker {}", p, partitions_[p].epoch,
                 partitions_[p].offset, to);
  }
  for (;;) {
    const uint32_t from = most(), to = fewest();
    if (owned[from].size() < owned[to].size() + 2) break;
    // Not one that is still being handed over to `from`.
    auto pick = std::find_if(owned[from].rbegin(), owned[from].rend(),
                             [&](size_t q) { return partitions_[q].releasing == 0; });
    if (pick == owned[from].rend()) break;
    const size_t p = *pick;
    owned[from].erase(std::next(pick).base());
    owned[to].push_back(p);
    partitions_[p].owner = to;
    partitions_[p].releasing = from;
    spdlog::info("data partition {} (epoch {}, offset {}) moves from worker {} to worker {}", p,
                 partitions_[p].epoch, partitions_[p].offset, from, to);
  }
}

void DataFeed::ReleaseDeparted() {
  if (!stream_) return;
  const TimePoint now = clock_->Now();
  for (const auto& [id, w] : members_->workers()) {
    if (!w.alive || w.done) stream_->Release(id, now);
  }
  if (stream_->TakeChanged()) journal_->Mark();
}

void DataFeed::TakeReport(const WorkerState& w, const msg::Heartbeat& hb) {
  std::set<uint32_t> reading;
  for (const wire::PartitionPosition& pp : hb.positions) {
    if (pp.index() >= partitions_.size()) continue;
    reading.insert(pp.index());
    PartitionState& ps = partitions_[pp.index()];
    // Only the worker reading a partition moves it, and only forward.
    const bool reader = ps.releasing != 0 ? ps.releasing == w.id : ps.owner == w.id;
    if (!reader) continue;
    if (std::make_pair(pp.epoch(), pp.offset()) > std::make_pair(ps.epoch, ps.offset)) {
      ps.epoch = pp.epoch();
      ps.offset = pp.offset();
    }
  }
  for (auto& ps : partitions_) {
    // It no longer reads the partition it hands over: its position is final.
    if (ps.releasing == w.id && !reading.count(static_cast<uint32_t>(&ps - partitions_.data()))) {
      ps.releasing = 0;
    }
  }
  if (stream_) stream_->Report(w.id, hb.chunks, w.last_seen);
}

void DataFeed::FillReply(const WorkerState& w, msg::HeartbeatReply* reply) const {
  reply->partition_count = partition_count_;
  for (size_t p = 0; p < partitions_.size(); ++p) {
    if (partitions_[p].owner == w.id && partitions_[p].releasing == 0) {
      reply->partitions.emplace_back(static_cast<uint32_t>(p), partitions_[p].epoch,
                                     partitions_[p].offset);
    }
  }
  reply->partition_index = reply->partitions.empty() ? 0 : reply->partitions[0].index();
}

void DataFeed::StreamReply(const WorkerState& w, float samples_per_second, bool training,
                           std::optional<TimePoint> started, msg::HeartbeatReply* reply) {
  if (!stream_) return;
  if (training) {
    stream_->SetPace(w.id, samples_per_second, w.batch);
    reply->chunks = stream_->Assign(w.id, w.last_seen);
  }
  reply->data_epoch = stream_->epoch();
  if (stream_->TakeChanged()) journal_->Mark();  // saved before the reply goes out
  LogEpochsEnded(started);
}

void DataFeed::SetPace(uint32_t worker, float samples_per_second, uint32_t batch) {
  if (stream_) stream_->SetPace(worker, samples_per_second, batch);
}

void DataFeed::LogEpochsEnded(std::optional<TimePoint> started) {
  for (; logged_epoch_ < stream_->epoch(); ++logged_epoch_) {
    const uint32_t e = logged_epoch_;
    std::string shares;
    uint64_t total = 0;
    for (const auto& [id, n] : stream_->samples_in_epoch(e)) total += n;
    for (const auto& [id, n] : stream_->samples_in_epoch(e)) {
      const WorkerState* w = members_->Find(id);
      shares += fmt::format("{}worker {} (rank {}) {:.1f}%", shares.empty() ? "" : ", ", id,
                            w == nullptr ? 0u : w->rank,
                            100.0 * static_cast<double>(n) / static_cast<double>(std::max<uint64_t>(1, total)));
    }
    const std::optional<double> tail = stream_->tail_seconds(e);
    spdlog::info("epoch {} done{}: tail {}; samples by worker: {}", e,
                 started ? fmt::format(" at {:.2f} s", ToSeconds(clock_->Now() - *started))
                         : std::string(),
                 tail ? fmt::format("{:.2f} s", *tail) : std::string("not measured"), shares);
  }
}

void DataFeed::FillStatus(msg::StatusReply* r, uint32_t epochs, uint64_t samples) const {
  for (msg::WorkerStatus& ws : r->workers) {
    for (size_t p = 0; p < partitions_.size(); ++p) {
      if (partitions_[p].owner == ws.id) ws.partitions.push_back(static_cast<uint32_t>(p));
    }
    if (stream_) {
      ws.chunks = stream_->Grants(ws.id);
      const auto& trained = stream_->samples_in_epoch(stream_->epoch());
      if (auto it = trained.find(ws.id); it != trained.end()) ws.epoch_samples = it->second;
    }
  }
  if (stream_) {
    r->data_stream = msg::DataStreamStatus{
        stream_->epoch(),          epochs,
        static_cast<float>(stream_->epoch_progress()), samples,
        stream_->chunks_handed_out(), stream_->tails_taken_over(),
        stream_->chunks_returned()};
  }
  for (size_t p = 0; p < partitions_.size(); ++p) {
    r->partitions.emplace_back(static_cast<uint32_t>(p), partitions_[p].epoch, partitions_[p].offset);
  }
}

void DataFeed::Save(MonitorRecord* r) const {
  r->partition_count = partition_count_;
  for (size_t p = 0; p < partitions_.size(); ++p) {
    r->partitions.push_back({static_cast<uint32_t>(p), partitions_[p].epoch, partitions_[p].offset,
                             partitions_[p].owner, partitions_[p].releasing});
  }
  if (stream_) r->stream = stream_->Save();
}

absl::Status DataFeed::Restore(const MonitorRecord& r, const DataStreamOptions& stream) {
  partition_count_ = r.partition_count;
  stream_.reset();
  if (r.stream) {
    stream_.emplace(stream);
    if (absl::Status s = stream_->Restore(*r.stream); !s.ok()) {
      stream_.reset();
      return absl::DataLossError(s.message());
    }
    logged_epoch_ = stream_->epoch();
  }
  partitions_.assign(partition_count_, PartitionState{});
  for (const auto& p : r.partitions) {
    if (p.index >= partitions_.size()) continue;
    partitions_[p.index] = {p.owner, p.epoch, p.offset, p.releasing};
  }
  return absl::OkStatus();
}

}  // namespace pacer
