#include "ps/base/messages.h"

#include "ps/base/wire_values.h"

namespace pacer {
namespace {

using wire_values::BuildGroups;
using wire_values::BuildOverrides;
using wire_values::BuildSettings;
using wire_values::GroupsOf;
using wire_values::KindOf;
using wire_values::OptimizerOf;
using wire_values::OptionalKind;
using wire_values::OptionalSettings;
using wire_values::OrNull;
using wire_values::OverridesOf;
using wire_values::Scalars;
using wire_values::SettingsOf;
using wire_values::Str;
using wire_values::Structs;
using wire_values::WireKind;

}  // namespace

namespace msg {

flatbuffers::Offset<wire::Ack> Build(flatbuffers::FlatBufferBuilder& fbb, const Ack&) {
  return wire::CreateAck(fbb);
}
flatbuffers::Offset<wire::Stop> Build(flatbuffers::FlatBufferBuilder& fbb, const Stop& m) {
  return wire::CreateStopDirect(fbb, m.reason.c_str());
}
flatbuffers::Offset<wire::MoveOut> Build(flatbuffers::FlatBufferBuilder& fbb, const MoveOut& m) {
  return wire::CreateMoveOut(fbb, m.key_begin, m.key_end, m.drop);
}
flatbuffers::Offset<wire::MoveData> Build(flatbuffers::FlatBufferBuilder& fbb, const MoveData& m) {
  auto keys = fbb.CreateVectorOfStructs(m.keys);
  auto groups = fbb.CreateVector(m.groups);
  auto key_steps = fbb.CreateVector(m.key_steps);
  auto param_groups = BuildGroups(fbb, m.param_groups);
  return wire::CreateMoveData(fbb, keys, m.applied_clock, m.steps, WireKind(m.optimizer),
                              m.state_slots, groups, key_steps, param_groups);
}
flatbuffers::Offset<wire::SetLr> Build(flatbuffers::FlatBufferBuilder& fbb, const SetLr& m) {
  return wire::CreateSetLrDirect(fbb, m.group.c_str(), m.lr, m.clear);
}
flatbuffers::Offset<wire::SetLrReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                            const SetLrReply& m) {
  return wire::CreateSetLrReply(fbb, BuildOverrides(fbb, m.overrides));
}

flatbuffers::Offset<wire::Error> Build(flatbuffers::FlatBufferBuilder& fbb, const Error& m) {
  return wire::CreateErrorDirect(fbb, m.code, m.reason.c_str());
}

Ack FromWire(const wire::Ack&) { return {}; }
Error FromWire(const wire::Error& t) { return {t.code(), Str(t.reason())}; }
Stop FromWire(const wire::Stop& t) { return {Str(t.reason())}; }
MoveOut FromWire(const wire::MoveOut& t) { return {t.key_begin(), t.key_end(), t.drop()}; }
MoveData FromWire(const wire::MoveData& t) {
  MoveData m;
  if (t.keys() != nullptr) {
    for (const wire::KeyLen* k : *t.keys()) m.keys.push_back(*k);
  }
  m.applied_clock = t.applied_clock();
  m.steps = t.steps();
  m.optimizer = KindOf(t.optimizer());
  m.state_slots = t.state_slots();
  m.groups = Scalars(t.groups());
  m.key_steps = Scalars(t.key_steps());
  m.param_groups = GroupsOf(t.param_groups());
  return m;
}
SetLr FromWire(const wire::SetLr& t) { return {Str(t.group()), t.lr(), t.clear()}; }
SetLrReply FromWire(const wire::SetLrReply& t) { return {OverridesOf(t.overrides())}; }


namespace {

std::vector<wire::KeyLen> Keys(const flatbuffers::Vector<const wire::KeyLen*>* v) {
  std::vector<wire::KeyLen> out;
  if (v == nullptr) return out;
  out.reserve(v->size());
  for (const wire::KeyLen* k : *v) out.push_back(*k);
  return out;
}

std::vector<wire::PartitionPosition> Positions(
    const flatbuffers::Vector<const wire::PartitionPosition*>* v) {
  std::vector<wire::PartitionPosition> out;
  if (v == nullptr) return out;
  for (const wire::PartitionPosition* p : *v) out.push_back(*p);
  return out;
}

flatbuffers::Offset<flatbuffers::Vector<const wire::KeyLen*>> KeysOf(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<wire::KeyLen>& keys) {
  return fbb.CreateVectorOfStructs(keys);
}

}  // namespace

flatbuffers::Offset<wire::JobConfig> Build(flatbuffers::FlatBufferBuilder& fbb, const JobConfig& m) {
  auto settings = BuildSettings(fbb, AllSettings(m.optimizer_settings));
  return wire::CreateJobConfig(fbb, m.mode, m.global_batch, m.epochs, m.time_cap_seconds,
                               m.target_accuracy, m.seed, m.eval_interval_seconds,
                               m.heartbeat_interval_ms, m.backup_workers, m.policy,
                               m.staleness_aware_lr, m.eval_interval_clocks,
                               WireKind(m.optimizer), settings, m.shard_lease_ms,
                               m.data_stream, m.round_steps, m.round_seconds);
}
JobConfig FromWire(const wire::JobConfig& t) {
  JobConfig m;
  m.mode = t.mode();
  m.optimizer = KindOf(t.optimizer());
  m.optimizer_settings = Resolve(DefaultSettings(m.optimizer), SettingsOf(t.optimizer_settings(), ""));
  m.global_batch = t.global_batch();
  m.epochs = t.epochs();
  m.time_cap_seconds = t.time_cap_seconds();
  m.target_accuracy = t.target_accuracy();
  m.seed = t.seed();
  m.eval_interval_seconds = t.eval_interval_seconds();
  m.heartbeat_interval_ms = t.heartbeat_interval_ms();
  m.backup_workers = t.backup_workers();
  m.policy = t.policy();
  m.staleness_aware_lr = t.staleness_aware_lr();
  m.eval_interval_clocks = t.eval_interval_clocks();
  m.shard_lease_ms = t.shard_lease_ms();
  m.data_stream = t.data_stream();
  m.round_steps = t.round_steps();
  m.round_seconds = t.round_seconds();
  return m;
}

namespace {
std::vector<flatbuffers::Offset<wire::ShardInfo>> BuildShardInfos(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<ShardInfo>& shards) {
  std::vector<flatbuffers::Offset<wire::ShardInfo>> infos;
  for (const ShardInfo& s : shards) {
    infos.push_back(wire::CreateShardInfoDirect(fbb, s.id, s.address.c_str(), s.key_begin,
                                                s.key_end, OrNull(s.public_key),
                                                s.backups.empty() ? nullptr : &s.backups, s.epoch));
  }
  return infos;
}
std::vector<ShardInfo> ShardInfosOf(
    const flatbuffers::Vector<flatbuffers::Offset<wire::ShardInfo>>* v) {
  std::vector<ShardInfo> shards;
  if (v == nullptr) return shards;
  for (const wire::ShardInfo* s : *v) {
    shards.push_back({s->id(), Str(s->address()), s->key_begin(), s->key_end(),
                      Str(s->public_key()), Scalars(s->backups()), s->epoch()});
  }
  return shards;
}
}  // namespace

flatbuffers::Offset<wire::ShardMap> Build(flatbuffers::FlatBufferBuilder& fbb, const ShardMap& m) {
  auto infos = BuildShardInfos(fbb, m.shards);
  return wire::CreateShardMapDirect(fbb, m.version, &infos);
}
ShardMap FromWire(const wire::ShardMap& t) {
  ShardMap m;
  m.version = t.version();
  m.shards = ShardInfosOf(t.shards());
  return m;
}

flatbuffers::Offset<wire::Assignment> Build(flatbuffers::FlatBufferBuilder& fbb,
                                            const Assignment& m) {
  return wire::CreateAssignment(fbb, m.batch_size, m.staleness_bound, m.staleness_range);
}
Assignment FromWire(const wire::Assignment& t) {
  return {t.batch_size(), t.staleness_bound(), t.staleness_range()};
}

flatbuffers::Offset<wire::Register> Build(flatbuffers::FlatBufferBuilder& fbb, const Register& m) {
  flatbuffers::Optional<uint32_t> hint = flatbuffers::nullopt;
  if (m.rank_hint) hint = *m.rank_hint;
  return wire::CreateRegisterDirect(fbb, m.role, m.address.c_str(), m.shard_id, m.checkpoint_job,
                                    m.checkpoint_map_version, m.incarnation, OrNull(m.node), hint);
}
Register FromWire(const wire::Register& t) {
  Register m{t.role(),          Str(t.address()), t.shard_id(), t.checkpoint_job(),
             t.checkpoint_map_version(), t.incarnation(), Str(t.node()), std::nullopt};
  if (t.rank_hint()) m.rank_hint = *t.rank_hint();
  return m;
}

flatbuffers::Offset<wire::RegisterReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                               const RegisterReply& m) {
  flatbuffers::Offset<wire::JobConfig> job;
  if (m.job) job = Build(fbb, *m.job);
  return wire::CreateRegisterReply(fbb, m.id, m.rank, job);
}
RegisterReply FromWire(const wire::RegisterReply& t) {
  RegisterReply m;
  m.id = t.id();
  m.rank = t.rank();
  if (t.job() != nullptr) m.job = FromWire(*t.job());
  return m;
}

flatbuffers::Offset<wire::Heartbeat> Build(flatbuffers::FlatBufferBuilder& fbb, const Heartbeat& m) {
  auto positions = fbb.CreateVectorOfStructs(m.positions);
  auto replicas_infos = BuildShardInfos(fbb, m.replicas);
  auto replicas = replicas_infos.empty() ? 0 : fbb.CreateVector(replicas_infos);
  auto serving_infos = BuildShardInfos(fbb, m.serving);
  auto serving = serving_infos.empty() ? 0 : fbb.CreateVector(serving_infos);
  auto lagging_infos = BuildShardInfos(fbb, m.lagging);
  auto lagging = lagging_infos.empty() ? 0 : fbb.CreateVector(lagging_infos);
  std::vector<flatbuffers::Offset<wire::RangeLag>> lag_list;
  for (const RangeLag& r : m.lag) {
    lag_list.push_back(wire::CreateRangeLag(fbb, r.range, r.epoch, r.records, r.seconds));
  }
  auto lag = lag_list.empty() ? 0 : fbb.CreateVector(lag_list);
  auto chunks = m.chunks.empty() ? 0 : fbb.CreateVectorOfStructs(m.chunks);
  wire::HeartbeatBuilder b(fbb);
  b.add_role(m.role);
  b.add_clock(m.clock);
  b.add_samples_per_second(m.samples_per_second);
  b.add_done(m.done);
  b.add_iterations(m.iterations);
  b.add_batch(m.batch);
  b.add_compute_seconds_per_sample(m.compute_seconds_per_sample);
  b.add_communication_seconds(m.communication_seconds);
  b.add_wait_seconds(m.wait_seconds);
  b.add_memory_limit_batch(m.memory_limit_batch);
  b.add_positions(positions);
  b.add_checkpoint_age_seconds(m.checkpoint_age_seconds);
  b.add_paused(m.paused);
  b.add_samples(m.samples);
  b.add_compute_seconds(m.compute_seconds);
  b.add_batch_squares(m.batch_squares);
  b.add_batch_compute(m.batch_compute);
  b.add_compute_min_seconds(m.compute_min_seconds);
  b.add_compute_max_seconds(m.compute_max_seconds);
  if (!replicas.IsNull()) b.add_replicas(replicas);
  if (!serving.IsNull()) b.add_serving(serving);
  b.add_handed_off(m.handed_off);
  if (!lagging.IsNull()) b.add_lagging(lagging);
  if (!lag.IsNull()) b.add_lag(lag);
  if (!chunks.IsNull()) b.add_chunks(chunks);
  return b.Finish();
}
Heartbeat FromWire(const wire::Heartbeat& t) {
  Heartbeat m;
  m.role = t.role();
  m.clock = t.clock();
  m.samples_per_second = t.samples_per_second();
  m.done = t.done();
  m.iterations = t.iterations();
  m.batch = t.batch();
  m.compute_seconds_per_sample = t.compute_seconds_per_sample();
  m.communication_seconds = t.communication_seconds();
  m.wait_seconds = t.wait_seconds();
  m.memory_limit_batch = t.memory_limit_batch();
  m.positions = Positions(t.positions());
  m.checkpoint_age_seconds = t.checkpoint_age_seconds();
  m.paused = t.paused();
  m.samples = t.samples();
  m.compute_seconds = t.compute_seconds();
  m.batch_squares = t.batch_squares();
  m.batch_compute = t.batch_compute();
  m.compute_min_seconds = t.compute_min_seconds();
  m.compute_max_seconds = t.compute_max_seconds();
  m.replicas = ShardInfosOf(t.replicas());
  m.serving = ShardInfosOf(t.serving());
  m.handed_off = t.handed_off();
  m.lagging = ShardInfosOf(t.lagging());
  if (t.lag() != nullptr) {
    for (const wire::RangeLag* r : *t.lag()) {
      m.lag.push_back({r->range(), r->epoch(), r->records(), r->seconds()});
    }
  }
  m.chunks = Structs(t.chunks());
  return m;
}

flatbuffers::Offset<wire::HeartbeatReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                                const HeartbeatReply& m) {
  flatbuffers::Offset<wire::ShardMap> map;
  if (m.shard_map) map = Build(fbb, *m.shard_map);
  flatbuffers::Offset<wire::Assignment> assignment;
  if (m.assignment) assignment = Build(fbb, *m.assignment);
  auto reason = m.stop_reason.empty() ? 0 : fbb.CreateString(m.stop_reason);
  auto partitions = fbb.CreateVectorOfStructs(m.partitions);
  auto faults = fbb.CreateString(m.faults);
  auto overrides = m.lr_overrides.empty() ? 0 : fbb.CreateVectorOfStructs(m.lr_overrides);
  auto backups_infos = BuildShardInfos(fbb, m.replica_backups);
  auto backups = backups_infos.empty() ? 0 : fbb.CreateVector(backups_infos);
  auto backing_infos = BuildShardInfos(fbb, m.backing);
  auto backing = backing_infos.empty() ? 0 : fbb.CreateVector(backing_infos);
  auto promote_infos = BuildShardInfos(fbb, m.promote);
  auto promote = promote_infos.empty() ? 0 : fbb.CreateVector(promote_infos);
  auto promote_backups_infos = BuildShardInfos(fbb, m.promote_backups);
  auto promote_backups =
      promote_backups_infos.empty() ? 0 : fbb.CreateVector(promote_backups_infos);
  auto deposed_infos = BuildShardInfos(fbb, m.deposed_ranges);
  auto deposed_ranges = deposed_infos.empty() ? 0 : fbb.CreateVector(deposed_infos);
  auto hold_ranges = m.hold_durable_ranges.empty() ? 0 : fbb.CreateVector(m.hold_durable_ranges);
  auto chunks = m.chunks.empty() ? 0 : fbb.CreateVectorOfStructs(m.chunks);
  return wire::CreateHeartbeatReply(fbb, m.state, map, m.membership_version, m.start_clock,
                                    m.partition_index, m.partition_count, assignment, reason,
                                    m.evaluate, partitions, m.pause_at, faults, m.faults_version,
                                    overrides, m.lr_overrides_version, m.replica_epoch, backups,
                                    backing, promote, promote_backups, m.deposed, m.hand_off,
                                    deposed_ranges, m.hold_durable, m.hand_off_given_up,
                                    hold_ranges, chunks, m.data_epoch, m.evaluate_now);
}
HeartbeatReply FromWire(const wire::HeartbeatReply& t) {
  HeartbeatReply m;
  m.state = t.state();
  if (t.shard_map() != nullptr) m.shard_map = FromWire(*t.shard_map());
  m.membership_version = t.membership_version();
  m.start_clock = t.start_clock();
  m.partition_index = t.partition_index();
  m.partition_count = t.partition_count();
  if (t.assignment() != nullptr) m.assignment = FromWire(*t.assignment());
  m.stop_reason = Str(t.stop_reason());
  m.evaluate = t.evaluate();
  m.partitions = Positions(t.partitions());
  m.pause_at = t.pause_at();
  m.faults = Str(t.faults());
  m.faults_version = t.faults_version();
  m.lr_overrides = Structs(t.lr_overrides());
  m.lr_overrides_version = t.lr_overrides_version();
  m.replica_epoch = t.replica_epoch();
  m.replica_backups = ShardInfosOf(t.replica_backups());
  m.backing = ShardInfosOf(t.backing());
  m.promote = ShardInfosOf(t.promote());
  m.promote_backups = ShardInfosOf(t.promote_backups());
  m.deposed = t.deposed();
  m.hand_off = t.hand_off();
  m.deposed_ranges = ShardInfosOf(t.deposed_ranges());
  m.hold_durable = t.hold_durable();
  m.hand_off_given_up = t.hand_off_given_up();
  m.hold_durable_ranges = Scalars(t.hold_durable_ranges());
  m.chunks = Structs(t.chunks());
  m.data_epoch = t.data_epoch();
  m.evaluate_now = t.evaluate_now();
  return m;
}

flatbuffers::Offset<wire::DeclareModel> Build(flatbuffers::FlatBufferBuilder& fbb,
                                              const DeclareModel& m) {
  auto keys = KeysOf(fbb, m.keys);
  auto names = m.names.empty() ? 0 : fbb.CreateVectorOfStrings(m.names);
  auto groups = m.groups.empty() ? 0 : fbb.CreateVector(m.groups);
  auto param_groups = m.param_groups.empty() ? 0 : BuildGroups(fbb, m.param_groups);
  auto settings = OptionalSettings(fbb, m.optimizer);
  return wire::CreateDeclareModel(fbb, keys, m.shard_map_version, names, groups, param_groups,
                                  m.samples, OptionalKind(m.optimizer), settings);
}
DeclareModel FromWire(const wire::DeclareModel& t) {
  DeclareModel m{Keys(t.keys()), t.shard_map_version(), {}, Scalars(t.groups()),
                 GroupsOf(t.param_groups()), t.samples(),
                 OptimizerOf(t.optimizer(), t.optimizer_settings())};
  if (t.names() != nullptr) {
    for (const flatbuffers::String* n : *t.names()) m.names.push_back(Str(n));
  }
  return m;
}

flatbuffers::Offset<wire::Membership> Build(flatbuffers::FlatBufferBuilder& fbb,
                                            const Membership& m) {
  std::vector<flatbuffers::Offset<wire::WorkerInfo>> workers;
  for (const WorkerInfo& w : m.workers) {
    workers.push_back(wire::CreateWorkerInfoDirect(fbb, w.id, w.rank, w.batch, w.start_clock,
                                                   w.staleness, w.staleness_range,
                                                   OrNull(w.public_key)));
  }
  return wire::CreateMembershipDirect(fbb, m.version, &workers);
}
Membership FromWire(const wire::Membership& t) {
  Membership m;
  m.version = t.version();
  if (t.workers() != nullptr) {
    for (const wire::WorkerInfo* w : *t.workers()) {
      m.workers.push_back({w->id(), w->rank(), w->batch(), w->start_clock(), w->staleness(),
                           w->staleness_range(), Str(w->public_key())});
    }
  }
  return m;
}

flatbuffers::Offset<wire::Init> Build(flatbuffers::FlatBufferBuilder& fbb, const Init& m) {
  return wire::CreateInit(fbb, KeysOf(fbb, m.keys));
}
Init FromWire(const wire::Init& t) { return {Keys(t.keys())}; }

flatbuffers::Offset<wire::Push> Build(flatbuffers::FlatBufferBuilder& fbb, const Push& m) {
  auto keys = KeysOf(fbb, m.keys);
  auto lrs = m.lrs.empty() ? 0 : fbb.CreateVectorOfStructs(m.lrs);
  wire::PushBuilder b(fbb);
  b.add_clock(m.clock);
  b.add_batch(m.batch);
  b.add_keys(keys);
  if (m.read_applied) b.add_read_applied(*m.read_applied);
  if (m.read_steps) b.add_read_steps(*m.read_steps);
  b.add_seq(m.seq);
  b.add_part(m.part);
  b.add_parts(m.parts);
  if (!m.lrs.empty()) b.add_lrs(lrs);
  b.add_epoch(m.epoch);
  return b.Finish();
}
Push FromWire(const wire::Push& t) {
  Push m;
  m.clock = t.clock();
  m.batch = t.batch();
  m.keys = Keys(t.keys());
  if (t.read_applied()) m.read_applied = *t.read_applied();
  if (t.read_steps()) m.read_steps = *t.read_steps();
  m.seq = t.seq();
  m.part = t.part();
  m.parts = t.parts();
  m.lrs = Structs(t.lrs());
  m.epoch = t.epoch();
  return m;
}

flatbuffers::Offset<wire::PushReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                           const PushReply& m) {
  return wire::CreatePushReply(fbb, m.clock, m.complete, m.durable_seq, m.epoch);
}
PushReply FromWire(const wire::PushReply& t) {
  return {t.clock(), t.complete(), t.durable_seq(), t.epoch()};
}

flatbuffers::Offset<wire::Pull> Build(flatbuffers::FlatBufferBuilder& fbb, const Pull& m) {
  return wire::CreatePull(fbb, m.clock, KeysOf(fbb, m.keys), m.latest, m.with_state, m.epoch);
}
Pull FromWire(const wire::Pull& t) {
  return {t.clock(), Keys(t.keys()), t.latest(), t.with_state(), t.epoch()};
}

flatbuffers::Offset<wire::PullReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                           const PullReply& m) {
  auto keys = KeysOf(fbb, m.keys);
  auto key_steps = m.key_steps.empty() ? 0 : fbb.CreateVector(m.key_steps);
  return wire::CreatePullReply(fbb, m.clock, m.applied_clock, keys, m.waited_seconds, m.steps,
                               WireKind(m.optimizer), m.state_slots, key_steps, m.durable_seq,
                               m.epoch);
}
PullReply FromWire(const wire::PullReply& t) {
  return {t.clock(),           t.applied_clock(),         Keys(t.keys()),
          t.waited_seconds(),  t.steps(),                 KindOf(t.optimizer()),
          t.state_slots(),     Scalars(t.key_steps()),    t.durable_seq(),
          t.epoch()};
}

flatbuffers::Offset<wire::Replicate> Build(flatbuffers::FlatBufferBuilder& fbb,
                                           const Replicate& m) {
  flatbuffers::Offset<wire::MoveData> seed;
  if (m.seed) seed = Build(fbb, *m.seed);
  std::vector<flatbuffers::Offset<wire::ReplicaStep>> steps;
  for (const ReplicaStep& s : m.steps) {
    steps.push_back(wire::CreateReplicaStep(fbb, KeysOf(fbb, s.keys), s.grad_scale,
                                            fbb.CreateVector(s.lr), s.values, s.assign,
                                            fbb.CreateVector(s.key_steps), s.fraction));
  }
  std::vector<wire::WorkerSeq> marks;
  for (const auto& [worker, seq] : m.marks) marks.emplace_back(worker, seq);
  std::vector<wire::WorkerSeq> applied;
  for (const auto& [worker, seq] : m.applied) applied.emplace_back(worker, seq);
  std::vector<wire::SeqSpan> ledger;
  for (const SeqSpan& s : m.ledger) ledger.emplace_back(s.worker, s.first, s.last);
  return wire::CreateReplicate(fbb, m.range, m.epoch, m.record, seed, fbb.CreateVector(steps),
                               fbb.CreateVectorOfStructs(marks), m.applied_clock, m.step_count,
                               m.check_begin, m.check_end, m.check,
                               fbb.CreateVectorOfStructs(applied),
                               fbb.CreateVectorOfStructs(ledger), m.doubles, m.last);
}
Replicate FromWire(const wire::Replicate& t) {
  Replicate m;
  m.range = t.range();
  m.epoch = t.epoch();
  m.record = t.record();
  if (t.seed() != nullptr) m.seed = FromWire(*t.seed());
  if (t.steps() != nullptr) {
    for (const wire::ReplicaStep* s : *t.steps()) {
      m.steps.push_back({Keys(s->keys()), s->grad_scale(), Scalars(s->lr()), s->values(),
                         s->assign(), Scalars(s->key_steps()), s->fraction()});
    }
  }
  if (t.marks() != nullptr) {
    for (const wire::WorkerSeq* w : *t.marks()) m.marks.emplace_back(w->worker(), w->seq());
  }
  if (t.applied() != nullptr) {
    for (const wire::WorkerSeq* w : *t.applied()) m.applied.emplace_back(w->worker(), w->seq());
  }
  if (t.ledger() != nullptr) {
    for (const wire::SeqSpan* s : *t.ledger()) m.ledger.push_back({s->worker(), s->first(), s->last()});
  }
  m.doubles = t.doubles();
  m.last = t.last();
  m.applied_clock = t.applied_clock();
  m.step_count = t.step_count();
  m.check_begin = t.check_begin();
  m.check_end = t.check_end();
  m.check = t.check();
  return m;
}

flatbuffers::Offset<wire::ReplicateReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                                const ReplicateReply& m) {
  return wire::CreateReplicateReply(fbb, m.range, m.record, m.need_seed);
}
ReplicateReply FromWire(const wire::ReplicateReply& t) {
  return {t.range(), t.record(), t.need_seed()};
}

flatbuffers::Offset<wire::AccuracyReport> Build(flatbuffers::FlatBufferBuilder& fbb,
                                                const AccuracyReport& m) {
  return wire::CreateAccuracyReport(fbb, m.clock, m.accuracy, m.loss, m.samples, m.every_clocks,
                                    m.request, m.scheduled);
}
AccuracyReport FromWire(const wire::AccuracyReport& t) {
  return {t.clock(), t.accuracy(), t.loss(), t.samples(), t.every_clocks(), t.request(),
          t.scheduled()};
}

flatbuffers::Offset<wire::StatusRequest> Build(flatbuffers::FlatBufferBuilder& fbb,
                                               const StatusRequest&) {
  return wire::CreateStatusRequest(fbb);
}
StatusRequest FromWire(const wire::StatusRequest&) { return {}; }

flatbuffers::Offset<wire::StatusReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                             const StatusReply& m) {
  std::vector<flatbuffers::Offset<wire::ShardStatus>> shards;
  for (const ShardStatus& s : m.shards) {
    shards.push_back(wire::CreateShardStatusDirect(fbb, s.id, s.address.c_str(), s.key_begin,
                                                   s.key_end, s.up, s.applied_clock,
                                                   s.checkpoint_age_seconds, s.restarts,
                                                   s.backups.empty() ? nullptr : &s.backups,
                                                   s.epoch, OrNull(s.node), s.lag_records,
                                                   s.lag_seconds));
  }
  std::vector<flatbuffers::Offset<wire::WorkerStatus>> workers;
  for (const WorkerStatus& w : m.workers) {
    workers.push_back(wire::CreateWorkerStatusDirect(
        fbb, w.id, w.rank, w.batch, w.staleness, w.staleness_range, w.clock, w.alive, w.done,
        w.samples_per_second, &w.partitions, w.paused, w.chunks.empty() ? nullptr : &w.chunks,
        w.epoch_samples));
  }
  flatbuffers::Offset<wire::ShardMap> map;
  if (m.shard_map) map = Build(fbb, *m.shard_map);
  flatbuffers::Offset<wire::DataStreamStatus> stream;
  if (m.data_stream) {
    const DataStreamStatus& s = *m.data_stream;
    stream = wire::CreateDataStreamStatus(fbb, s.epoch, s.epochs, s.progress, s.samples,
                                          s.handed_out, s.taken_over, s.returned);
  }
  return wire::CreateStatusReplyDirect(fbb, m.state, m.mode, m.policy, m.stop_reason.c_str(),
                                       m.seconds_running, m.last_accuracy, map,
                                       m.membership_version, &m.model, &shards, &workers,
                                       &m.partitions, m.pause_at, m.moving, m.replicas, stream);
}
StatusReply FromWire(const wire::StatusReply& t) {
  StatusReply m;
  m.state = t.state();
  m.mode = t.mode();
  m.policy = t.policy();
  m.stop_reason = Str(t.stop_reason());
  m.seconds_running = t.seconds_running();
  m.last_accuracy = t.last_accuracy();
  if (t.shard_map() != nullptr) m.shard_map = FromWire(*t.shard_map());
  m.membership_version = t.membership_version();
  m.model = Keys(t.model());
  if (t.shards() != nullptr) {
    for (const wire::ShardStatus* s : *t.shards()) {
      m.shards.push_back({s->id(), Str(s->address()), s->key_begin(), s->key_end(), s->up(),
                          s->applied_clock(), s->checkpoint_age_seconds(), s->restarts(),
                          Scalars(s->backups()), s->epoch(), Str(s->node()),
                          s->lag_records(), s->lag_seconds()});
    }
  }
  if (t.workers() != nullptr) {
    for (const wire::WorkerStatus* w : *t.workers()) {
      WorkerStatus ws{w->id(), w->rank(), w->batch(), w->staleness(), w->staleness_range(),
                      w->clock(), w->alive(), w->done(), w->samples_per_second(), {}, w->paused(),
                      {}, 0};
      if (w->partitions() != nullptr) ws.partitions.assign(w->partitions()->begin(), w->partitions()->end());
      ws.chunks = Structs(w->chunks());
      ws.epoch_samples = w->epoch_samples();
      m.workers.push_back(std::move(ws));
    }
  }
  m.partitions = Positions(t.partitions());
  m.pause_at = t.pause_at();
  m.moving = t.moving();
  m.replicas = t.replicas();
  if (const wire::DataStreamStatus* s = t.data_stream(); s != nullptr) {
    m.data_stream = DataStreamStatus{s->epoch(),      s->epochs(),     s->progress(),
                                     s->samples(),    s->handed_out(), s->taken_over(),
                                     s->returned()};
  }
  return m;
}

flatbuffers::Offset<wire::RemoveWorker> Build(flatbuffers::FlatBufferBuilder& fbb,
                                              const RemoveWorker& m) {
  return wire::CreateRemoveWorker(fbb, m.id);
}
RemoveWorker FromWire(const wire::RemoveWorker& t) { return {t.id()}; }

flatbuffers::Offset<wire::ShardControl> Build(flatbuffers::FlatBufferBuilder& fbb,
                                              const ShardControl& m) {
  return wire::CreateShardControl(fbb, m.op, m.shard_id);
}
ShardControl FromWire(const wire::ShardControl& t) { return {t.op(), t.shard_id()}; }

flatbuffers::Offset<wire::FaultControl> Build(flatbuffers::FlatBufferBuilder& fbb,
                                              const FaultControl& m) {
  return wire::CreateFaultControlDirect(fbb, m.op, m.target.c_str(), m.spec.c_str());
}
FaultControl FromWire(const wire::FaultControl& t) {
  return {t.op(), Str(t.target()), Str(t.spec())};
}

flatbuffers::Offset<wire::FaultControlReply> Build(flatbuffers::FlatBufferBuilder& fbb,
                                                   const FaultControlReply& m) {
  std::vector<flatbuffers::Offset<wire::FaultEntry>> entries;
  for (const auto& [target, spec] : m.entries) {
    entries.push_back(wire::CreateFaultEntryDirect(fbb, target.c_str(), spec.c_str()));
  }
  return wire::CreateFaultControlReplyDirect(fbb, m.version, &entries);
}
FaultControlReply FromWire(const wire::FaultControlReply& t) {
  FaultControlReply m;
  m.version = t.version();
  if (t.entries() != nullptr) {
    for (const wire::FaultEntry* e : *t.entries()) {
      m.entries.emplace_back(Str(e->target()), Str(e->spec()));
    }
  }
  return m;
}

}  // namespace msg

}  // namespace pacer
