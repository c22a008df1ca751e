// The monitor's saved state (MonitorRecord) to and from bytes: a
// MonitorState flatbuffer with a format number, verified on the way in.
#include "ps/base/messages.h"
#include "ps/base/wire_values.h"

namespace pacer {
namespace {

using wire_values::BuildGroups;
using wire_values::BuildOverrides;
using wire_values::GroupsOf;
using wire_values::OptimizerOf;
using wire_values::OptionalKind;
using wire_values::OptionalSettings;
using wire_values::OrNull;
using wire_values::OverridesOf;
using wire_values::Scalars;
using wire_values::Str;

constexpr uint32_t kMonitorStateFormat = 1;

}  // namespace

std::string EncodeMonitorRecord(const MonitorRecord& r) {
  flatbuffers::FlatBufferBuilder fbb(1024 + r.model.size() * sizeof(wire::KeyLen));
  std::vector<flatbuffers::Offset<wire::MonitorWorker>> workers;
  for (const auto& w : r.workers) {
    workers.push_back(wire::CreateMonitorWorkerDirect(
        fbb, w.id, w.rank, w.batch, w.staleness, w.staleness_range, w.start_clock, w.clock,
        w.joined_version, w.alive, w.done, OrNull(w.token), OrNull(w.public_key)));
  }
  std::vector<flatbuffers::Offset<wire::MonitorShard>> shards;
  for (const auto& s : r.shards) {
    shards.push_back(wire::CreateMonitorShardDirect(
        fbb, s.id, s.address.c_str(), s.incarnation, s.key_begin, s.key_end, s.applied_clock,
        s.restarts, s.drained, OrNull(s.public_key), s.backups.empty() ? nullptr : &s.backups,
        s.epoch, OrNull(s.node), s.host, OrNull(s.served_at),
        s.standby.empty() ? nullptr : &s.standby, s.retired, s.promoted_from));
  }
  auto model = fbb.CreateVectorOfStructs(r.model);
  auto reason = fbb.CreateString(r.stop_reason);
  std::vector<wire::PartitionPosition> pos;
  std::vector<uint32_t> owners, releasing;
  for (const auto& p : r.partitions) {
    pos.emplace_back(p.index, p.epoch, p.offset);
    owners.push_back(p.owner);
    releasing.push_back(p.releasing);
  }
  auto positions = fbb.CreateVectorOfStructs(pos);
  auto owner_v = fbb.CreateVector(owners);
  auto releasing_v = fbb.CreateVector(releasing);
  auto wv = fbb.CreateVector(workers);
  auto sv = fbb.CreateVector(shards);
  auto names = fbb.CreateVectorOfStrings(r.model_names);
  auto model_groups = fbb.CreateVector(r.model_groups);
  auto param_groups = BuildGroups(fbb, r.param_groups);
  auto overrides = BuildOverrides(fbb, r.lr_overrides);
  auto optimizer_settings = OptionalSettings(fbb, r.model_optimizer);
  flatbuffers::Offset<wire::DataStreamState> stream;
  if (r.stream) {
    std::vector<wire::StreamChunk> chunks;
    for (const auto& c : r.stream->chunks) {
      chunks.emplace_back(c.id, c.begin, c.end, c.pos, c.cut, c.epoch, c.owner, c.taker);
    }
    std::vector<wire::StreamSpan> pool;
    for (const auto& p : r.stream->pool) pool.emplace_back(p.begin, p.end, p.epoch);
    stream = wire::CreateDataStreamStateDirect(fbb, r.stream->cursor_epoch, r.stream->cursor,
                                               r.stream->next_id, &chunks, &pool);
  }
  wire::MonitorStateBuilder b(fbb);
  b.add_format(kMonitorStateFormat);
  b.add_job_id(r.job_id);
  b.add_state(r.state);
  b.add_stop_reason(reason);
  b.add_next_id(r.next_id);
  b.add_next_rank(r.next_rank);
  b.add_model(model);
  b.add_map_built(r.map_built);
  b.add_map_version(r.map_version);
  b.add_membership_version(r.membership_version);
  b.add_partition_count(r.partition_count);
  b.add_workers(wv);
  b.add_shards(sv);
  b.add_seconds_running(r.seconds_running.value_or(-1));
  b.add_saved_unix(r.saved_unix);
  b.add_last_accuracy(r.last_accuracy.value_or(-1.0f));
  b.add_time_to_target(r.time_to_target.value_or(-1));
  b.add_slack_open(r.slack_open);
  b.add_partitions(positions);
  b.add_partition_owners(owner_v);
  b.add_partition_releasing(releasing_v);
  b.add_batch_per_worker(r.batch_per_worker);
  b.add_model_names(names);
  b.add_model_groups(model_groups);
  b.add_param_groups(param_groups);
  b.add_lr_overrides(overrides);
  b.add_epoch(r.epoch);
  b.add_lr_overrides_version(r.lr_overrides_version);
  if (r.model_optimizer) {
    b.add_model_optimizer(*OptionalKind(r.model_optimizer));
    b.add_model_optimizer_settings(optimizer_settings);
  }
  b.add_data_samples(r.data_samples);
  if (!stream.IsNull()) b.add_stream(stream);
  fbb.Finish(b.Finish());
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

absl::StatusOr<MonitorRecord> DecodeMonitorRecord(std::string_view bytes) {
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!verifier.VerifyBuffer<wire::MonitorState>(nullptr)) {
    return absl::DataLossError("the saved monitor state does not verify");
  }
  const auto* st = flatbuffers::GetRoot<wire::MonitorState>(bytes.data());
  if (st->format() != kMonitorStateFormat) {
    return absl::DataLossError("monitor state format " + std::to_string(st->format()) +
                               ", this build reads " + std::to_string(kMonitorStateFormat));
  }
  MonitorRecord r;
  r.job_id = st->job_id();
  r.state = st->state();
  r.stop_reason = Str(st->stop_reason());
  r.next_id = st->next_id();
  r.next_rank = st->next_rank();
  if (st->model() != nullptr) {
    for (const wire::KeyLen* k : *st->model()) r.model.push_back(*k);
  }
  r.map_built = st->map_built();
  r.map_version = st->map_version();
  r.membership_version = st->membership_version();
  r.partition_count = st->partition_count();
  r.batch_per_worker = st->batch_per_worker();
  if (st->partitions() != nullptr) {
    for (flatbuffers::uoffset_t i = 0; i < st->partitions()->size(); ++i) {
      const wire::PartitionPosition* pp = st->partitions()->Get(i);
      MonitorRecord::Partition p;
      p.index = pp->index();
      p.epoch = pp->epoch();
      p.offset = pp->offset();
      if (st->partition_owners() != nullptr && i < st->partition_owners()->size()) {
        p.owner = st->partition_owners()->Get(i);
      }
      if (st->partition_releasing() != nullptr && i < st->partition_releasing()->size()) {
        p.releasing = st->partition_releasing()->Get(i);
      }
      r.partitions.push_back(p);
    }
  }
  if (st->workers() != nullptr) {
    for (const wire::MonitorWorker* mw : *st->workers()) {
      MonitorRecord::Worker w;
      w.id = mw->id();
      w.rank = mw->rank();
      w.batch = mw->batch();
      w.staleness = mw->staleness();
      w.staleness_range = mw->staleness_range();
      w.start_clock = mw->start_clock();
      w.clock = mw->clock();
      w.joined_version = mw->joined_version();
      w.alive = mw->alive();
      w.done = mw->done();
      w.token = Str(mw->token());
      w.public_key = Str(mw->public_key());
      r.workers.push_back(std::move(w));
    }
  }
  if (st->shards() != nullptr) {
    for (const wire::MonitorShard* ms : *st->shards()) {
      MonitorRecord::Shard s;
      s.id = ms->id();
      s.address = Str(ms->address());
      s.incarnation = ms->incarnation();
      s.key_begin = ms->key_begin();
      s.key_end = ms->key_end();
      s.applied_clock = ms->applied_clock();
      s.restarts = ms->restarts();
      s.drained = ms->drained();
      s.public_key = Str(ms->public_key());
      s.backups = Scalars(ms->backups());
      s.epoch = ms->epoch();
      s.node = Str(ms->node());
      s.host = ms->host();
      s.served_at = Str(ms->served_at());
      s.standby = Scalars(ms->standby());
      s.retired = ms->retired();
      s.promoted_from = ms->promoted_from();
      r.shards.push_back(std::move(s));
    }
  }
  if (st->seconds_running() >= 0) r.seconds_running = st->seconds_running();
  r.saved_unix = st->saved_unix();
  if (st->last_accuracy() >= 0) r.last_accuracy = st->last_accuracy();
  if (st->time_to_target() >= 0) r.time_to_target = st->time_to_target();
  r.slack_open = st->slack_open();
  if (st->model_names() != nullptr) {
    for (const flatbuffers::String* n : *st->model_names()) r.model_names.push_back(Str(n));
  }
  r.model_groups = Scalars(st->model_groups());
  r.param_groups = GroupsOf(st->param_groups());
  r.lr_overrides = OverridesOf(st->lr_overrides());
  r.lr_overrides_version = st->lr_overrides_version();
  r.model_optimizer = OptimizerOf(st->model_optimizer(), st->model_optimizer_settings());
  r.epoch = st->epoch();
  r.data_samples = st->data_samples();
  if (const wire::DataStreamState* ds = st->stream(); ds != nullptr) {
    DataStreamRecord d;
    d.cursor_epoch = ds->cursor_epoch();
    d.cursor = ds->cursor();
    d.next_id = ds->next_id();
    if (ds->chunks() != nullptr) {
      for (const wire::StreamChunk* c : *ds->chunks()) {
        d.chunks.push_back({c->id(), c->epoch(), c->begin(), c->end(), c->pos(), c->owner(),
                            c->cut(), c->taker()});
      }
    }
    if (ds->pool() != nullptr) {
      for (const wire::StreamSpan* p : *ds->pool()) d.pool.push_back({p->epoch(), p->begin(), p->end()});
    }
    r.stream = std::move(d);
  }
  return r;
}

}  // namespace pacer
