// What the monitor saves of its job (--data-dir) and how a restarted one
// takes it back: each manager writes and reads its own part of a
// MonitorRecord, whose encoding lives in ps/base/monitor_record.cc.
#include <algorithm>

#include "monitor/monitor.h"
#include "ps/base/messages.h"
#include "spdlog/spdlog.h"

namespace pacer {

std::string MonitorCore::SaveState() const {
  MonitorRecord r;
  r.job_id = options_.job_id;
  r.next_id = next_id_;
  job_.Save(&r);
  model_.Save(&r);
  membership_.Save(&r);
  shards_.Save(&r);  // one entry per shard first,
  ranges_.Save(&r);  // then its range's fields
  data_.Save(&r);
  policy_.Save(&r);
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
  if (st.stream.has_value() != (options_.data_stream && st.map_built)) {
    return absl::InvalidArgumentError(
        st.stream ? std::string("the saved job reads its training set as one data stream; start "
                                "the monitor without --data-partitions")
                  : "the saved job reads data partitions (saved before the data stream became "
                    "the default, or started with --data-partitions); start the monitor with "
                    "--data-partitions " +
                        std::to_string(std::max<uint32_t>(1, st.partition_count)));
  }
  const TimePoint now = clock_->Now();
  next_id_ = st.next_id;
  model_.Restore(st);  // before the stream, which takes the training set's size
  if (absl::Status s = data_.Restore(st, StreamOptions()); !s.ok()) return s;
  membership_.Restore(st, now);
  shards_.Restore(st, now);
  ranges_.Restore(st);
  job_.Restore(st);
  if (model_.declared()) job_.OnDeclarationTaken();  // not a job of refused workers
  if (ranges_.built()) {
    for (uint32_t id : membership_.LiveWorkers()) {
      data_.SetPace(id, 0, membership_.at(id).batch);
    }
  }
  policy_.Restore(st);  // after the membership: it takes the live workers' assignments
  // A new version, so that every shard takes the live set from us again.
  membership_.Change("restarted", "monitor restarted");
  spdlog::info("resumed job {} from its saved state: {}, {} shard(s), {} live worker(s), shard map "
               "v{}, membership v{}",
               options_.job_id, wire::EnumNameJobState(job_.state()), shards_.size(),
               membership_.LiveWorkers().size(), ranges_.version(), membership_.version());
  return absl::OkStatus();
}

}  // namespace pacer
