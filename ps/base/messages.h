// Typed messages and records and their Flatbuffers form, converted in one
// place: the edge where Pacer's structs meet the schema (schema/pacer.fbs),
// so that the cores handle typed values.
//
// A message type M (in namespace msg) names its table as M::Wire; Build
// writes it into a builder, FromWire reads it back, and EncodeMessage /
// msg::Read (and RpcChannel's typed Send and Call) do the whole trip to and
// from frames. Every request and reply has its struct here, and so has the
// monitor's saved state (MonitorRecord); the cores and clients handle these
// values, and no other library file builds or reads a table. The envelope,
// the checks on a received message and Error replies stay in wire.h.
#ifndef PACER_PS_BASE_MESSAGES_H_
#define PACER_PS_BASE_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/optimizer_config.h"
#include "ps/base/wire.h"

namespace pacer {

namespace msg {

// An empty success reply.
struct Ack {
  using Wire = wire::Ack;
};

// The monitor to a shard: leave the job (the job ended, or it was drained).
struct Stop {
  using Wire = wire::Stop;
  std::string reason;
};

// The monitor to a shard: send keys [key_begin, key_end) with their values
// (answered by MoveData), or with `drop`, let go of them (answered by Ack).
struct MoveOut {
  using Wire = wire::MoveOut;
  uint64_t key_begin = 0, key_end = 0;
  bool drop = false;
};

// Keys moving to a new owner; their values (parameters, then each optimizer
// state slot's, in key order) are the payload frame. groups and key_steps
// run parallel to keys.
struct MoveData {
  using Wire = wire::MoveData;
  std::vector<wire::KeyLen> keys;
  int64_t applied_clock = -1;
  uint64_t steps = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  uint32_t state_slots = 1;
  std::vector<uint32_t> groups;
  std::vector<uint64_t> key_steps;
  std::vector<GroupSettings> param_groups;
};

// pacerctl to the monitor: a group's lr by hand, or (clear) no longer.
struct SetLr {
  using Wire = wire::SetLr;
  std::string group;
  float lr = 0;
  bool clear = false;
};

// Every override now set, by group name.
struct SetLrReply {
  using Wire = wire::SetLrReply;
  std::vector<std::pair<std::string, float>> overrides;
};

// A refusal: why, as a code and in words.
struct Error {
  using Wire = wire::Error;
  wire::ErrorCode code = wire::ErrorCode::Unknown;
  std::string reason;
};

// --- the job and the cluster, as register and heartbeat replies carry them

struct JobConfig {
  using Wire = wire::JobConfig;
  wire::Mode mode = wire::Mode::Bsp;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  OptimizerSettings optimizer_settings = DefaultSettings(OptimizerKind::kSgd);
  uint32_t global_batch = 192;
  uint32_t epochs = 0;
  double time_cap_seconds = 0;
  float target_accuracy = 0;
  uint64_t seed = 1;
  double eval_interval_seconds = 1.0;
  uint32_t heartbeat_interval_ms = 100;
  uint32_t backup_workers = 0;
  wire::Policy policy = wire::Policy::Fixed;
  bool staleness_aware_lr = true;
  uint32_t eval_interval_clocks = 0;
  uint32_t shard_lease_ms = 1000;  // --shard-lease
  bool data_stream = false;        // The data stream: workers read chunks
  // Mode local: a round's end, by local steps or by seconds (0: not by
  // that measure; --round-steps, --round-seconds).
  uint32_t round_steps = 0;
  double round_seconds = 0;
};

struct ShardInfo {
  uint32_t id = 0;
  std::string address;
  uint64_t key_begin = 0, key_end = 0;
  std::string public_key;  // CURVE (Z85) as it authenticated; "" without
  // The shards that hold replicas of this range (monitor --replicas), and
  // the range's epoch: it goes up whenever its primary or its keys change.
  std::vector<uint32_t> backups;
  uint64_t epoch = 0;
  bool operator==(const ShardInfo&) const = default;
};

// A range's replication lag at its primary (wire::RangeLag).
struct RangeLag {
  uint32_t range = 0;
  uint64_t epoch = 0;
  uint64_t records = 0;  // sent, not acknowledged by every backup
  float seconds = 0;     // since the oldest of those left
  bool operator==(const RangeLag&) const = default;
};

struct ShardMap {
  using Wire = wire::ShardMap;
  uint64_t version = 0;
  std::vector<ShardInfo> shards;
};

// A live worker as the shards see it.
struct WorkerInfo {
  uint32_t id = 0, rank = 0, batch = 0;
  uint64_t start_clock = 0;
  uint32_t staleness = 0, staleness_range = 0;
  std::string public_key;
};

struct Assignment {
  using Wire = wire::Assignment;
  uint32_t batch_size = 0, staleness_bound = 0, staleness_range = 0;
};

// --- registration and heartbeats (schema/pacer.fbs says what each field is)

struct Register {
  using Wire = wire::Register;
  wire::Role role = wire::Role::Worker;
  std::string address;  // a shard's address; a worker's token
  uint32_t shard_id = 0;
  uint64_t checkpoint_job = 0, checkpoint_map_version = 0;
  uint64_t incarnation = 0;
  std::string node;  // a shard's host or node (--node); "": its address's host
  std::optional<uint32_t> rank_hint;  // the rank a worker asks for (nullopt: any)
};

struct RegisterReply {
  using Wire = wire::RegisterReply;
  uint32_t id = 0, rank = 0;
  std::optional<JobConfig> job;
};

struct Heartbeat {
  using Wire = wire::Heartbeat;
  wire::Role role = wire::Role::Worker;
  uint64_t clock = 0;
  float samples_per_second = 0;
  bool done = false;
  uint32_t iterations = 0, batch = 0;
  float compute_seconds_per_sample = 0, communication_seconds = 0, wait_seconds = 0;
  uint32_t memory_limit_batch = 0;
  std::vector<wire::PartitionPosition> positions;
  float checkpoint_age_seconds = -1;
  bool paused = false;
  uint64_t samples = 0;
  double compute_seconds = 0, batch_squares = 0, batch_compute = 0;
  double compute_min_seconds = 0, compute_max_seconds = 0;
  // A shard, with --replicas: the replicas it holds (id: the range's
  // primary, epoch), and the ranges it serves since a promotion (id: the
  // range, address, epoch).
  std::vector<ShardInfo> replicas;
  std::vector<ShardInfo> serving;
  // Asked to hand its range over: it applies nothing more and its backups
  // hold all it applied.
  bool handed_off = false;
  // A primary: per range it serves (id), the backups that fall behind.
  std::vector<ShardInfo> lagging;
  // A primary: the replication lag of each range it serves with backups.
  std::vector<RangeLag> lag;
  // A worker, with the data stream: the chunks it holds.
  std::vector<wire::DataChunk> chunks;
};

struct HeartbeatReply {
  using Wire = wire::HeartbeatReply;
  wire::JobState state = wire::JobState::Waiting;
  std::optional<ShardMap> shard_map;
  uint64_t membership_version = 0, start_clock = 0;
  uint32_t partition_index = 0, partition_count = 0;
  std::optional<Assignment> assignment;
  std::string stop_reason;
  bool evaluate = false;
  std::vector<wire::PartitionPosition> partitions;
  uint64_t pause_at = 0;
  std::string faults;
  uint64_t faults_version = 0;
  // To shards: pacerctl set-lr's overrides, by group index.
  std::vector<wire::GroupLr> lr_overrides;
  uint64_t lr_overrides_version = 0;
  // To shards, with --replicas: its range's epoch and backups (id, address,
  // key), and the ranges it backs up (id: their primary; epoch).
  uint64_t replica_epoch = 0;
  std::vector<ShardInfo> replica_backups;
  std::vector<ShardInfo> backing;
  // To a backup: serve these ranges (id: the range; epoch: its new one;
  // backups: theirs, whose addresses and keys promote_backups gives).
  std::vector<ShardInfo> promote;
  std::vector<ShardInfo> promote_backups;
  // To a shard whose own range another shard serves since a failover: it
  // answers nothing of that range any more (replica_epoch: the range's
  // current epoch).
  bool deposed = false;
  // To a primary being drained (with backups): stop applying, have the
  // backups take a last record, then say handed_off.
  bool hand_off = false;
  // Ranges it serves since a promotion that failed over again elsewhere
  // (id: the range, epoch: its new one).
  std::vector<ShardInfo> deposed_ranges;
  // To a primary: its range has a standby (a dropped backup the monitor may
  // promote): durability stays where it is until this is false again.
  bool hold_durable = false;
  // To a primary that stopped applying for a drain: the drain was given up.
  bool hand_off_given_up = false;
  // To a shard serving ranges since a promotion: those with a standby (as
  // hold_durable for its own range).
  std::vector<uint32_t> hold_durable_ranges;
  // To a worker, with the data stream: its chunks, and the job's epoch.
  std::vector<wire::DataChunk> chunks;
  uint32_t data_epoch = 0;
  uint64_t evaluate_now = 0;  // to the evaluator: evaluate at once (0: no)
};

// --- the monitor to the shards

// names and groups run parallel to keys (or are empty: no names, every
// key in group 0); param_groups are groups 1, 2, ...
struct DeclareModel {
  using Wire = wire::DeclareModel;
  std::vector<wire::KeyLen> keys;
  uint64_t shard_map_version = 0;
  std::vector<std::string> names;
  std::vector<uint32_t> groups;
  std::vector<GroupSettings> param_groups;
  uint64_t samples = 0;  // the training set's size (0: not said)
  // From a worker: the optimizer its script declares (nullopt: none). From
  // the monitor to a shard: the job's.
  std::optional<JobOptimizer> optimizer;
};

struct Membership {
  using Wire = wire::Membership;
  uint64_t version = 0;
  std::vector<WorkerInfo> workers;
};

// --- the data path. The keys are copied out of the message (a frame's
// bytes need not be aligned for wire::KeyLen; a model has tens of keys);
// the values travel in the payload frame, never copied here.

struct Init {
  using Wire = wire::Init;
  std::vector<wire::KeyLen> keys;
};

struct Push {
  using Wire = wire::Push;
  uint64_t clock = 0;
  uint32_t batch = 0;
  std::vector<wire::KeyLen> keys;
  std::optional<int64_t> read_applied;
  std::optional<uint64_t> read_steps;
  uint64_t seq = 0;
  uint32_t part = 0, parts = 1;
  std::vector<wire::GroupLr> lrs;  // the worker's lr for some groups
  uint64_t epoch = 0;  // the range's epoch in the sender's map (0: none)
};

struct PushReply {
  using Wire = wire::PushReply;
  uint64_t clock = 0;
  bool complete = true;
  // --replicas: the sender's pushes through this seq are on every in-sync
  // backup (0: none yet, or the range has none).
  uint64_t durable_seq = 0;
  uint64_t epoch = 0;  // the range's epoch at the shard (0: none known)
};

struct Pull {
  using Wire = wire::Pull;
  uint64_t clock = 0;
  std::vector<wire::KeyLen> keys;
  bool latest = false;
  bool with_state = false;  // latest only: the optimizer state too
  uint64_t epoch = 0;       // as in Push
};

struct PullReply {
  using Wire = wire::PullReply;
  uint64_t clock = 0;
  int64_t applied_clock = -1;
  std::vector<wire::KeyLen> keys;
  float waited_seconds = 0;
  uint64_t steps = 0;
  // with_state: the payload holds the parameters, then state_slots buffers
  // of the keys' optimizer state; key_steps runs parallel to keys.
  OptimizerKind optimizer = OptimizerKind::kSgd;
  uint32_t state_slots = 0;
  std::vector<uint64_t> key_steps;
  uint64_t durable_seq = 0;  // as in PushReply
  uint64_t epoch = 0;        // as in PushReply
};

// Replication (--replicas): a range's primary to a backup. A seed (the
// range's keys as a move carries them; values in the payload), or the
// steps applied since the previous record, their gradients end to end in
// the payload; then the primary's applied clock, step count and the
// workers' last applied push seqs that changed (marks). check_end >
// check_begin: the CRC-32 (Crc32) of the parameters, then each state slot,
// of the keys in [check_begin, check_end) after the record.
struct ReplicaStep {
  std::vector<wire::KeyLen> keys;  // empty: every key, values at their offsets
  float grad_scale = 1.0f;
  std::vector<float> lr;           // per group, scale included
  uint64_t values = 0;             // floats of the payload it takes
  // Instead of a gradient, the state the batch's steps left in `keys`
  // (every key when empty): the parameters, then each state slot's values,
  // end to end in key order (ParamTable::Read), and the keys' step counts;
  // grad_scale and lr unused. A primary sends this when it takes fewer
  // values than the batch's gradients.
  bool assign = false;
  std::vector<uint64_t> key_steps;
  float fraction = 1.0f;  // of a full step (StepRecord::fraction)
};
// A run of one worker's push seqs, [first, last] (AppliedLedger).
struct SeqSpan {
  uint32_t worker = 0;
  uint64_t first = 0, last = 0;
  bool operator==(const SeqSpan&) const = default;
};
struct Replicate {
  using Wire = wire::Replicate;
  uint32_t range = 0;  // the primary's shard id
  uint64_t epoch = 0;
  uint64_t record = 0;
  std::optional<MoveData> seed;
  std::vector<ReplicaStep> steps;
  std::vector<std::pair<uint32_t, uint64_t>> marks;  // worker, last applied seq
  int64_t applied_clock = -1;
  uint64_t step_count = 0;
  uint64_t check_begin = 0, check_end = 0;
  uint32_t check = 0;
  std::vector<std::pair<uint32_t, uint64_t>> applied;  // worker, seq: each push applied
  std::vector<SeqSpan> ledger;  // a seed: every push the range has applied
  uint64_t doubles = 0;         // a seed: pushes the range applied more than once
  bool last = false;            // the primary is leaving; nothing follows
};
// The backup holds `range` through `record`; need_seed: it has no replica
// of it, or misses records before this one.
struct ReplicateReply {
  using Wire = wire::ReplicateReply;
  uint32_t range = 0;
  uint64_t record = 0;
  bool need_seed = false;
};

struct AccuracyReport {
  using Wire = wire::AccuracyReport;
  uint64_t clock = 0;
  float accuracy = 0, loss = 0;
  uint32_t samples = 0, every_clocks = 0;
  uint64_t request = 0;  // the evaluate_now it answers (0: scheduled)
  bool scheduled = false;  // from the runtime's evaluation loop
};

// --- pacerctl and the monitor

struct StatusRequest {
  using Wire = wire::StatusRequest;
};

struct ShardStatus {
  uint32_t id = 0;
  std::string address;
  uint64_t key_begin = 0, key_end = 0;
  bool up = false;
  int64_t applied_clock = -1;
  float checkpoint_age_seconds = -1;
  uint32_t restarts = 0;
  std::vector<uint32_t> backups;  // the shards that back its range
  uint64_t epoch = 0;             // its range's epoch (0: no range)
  std::string node;               // what replicas are placed apart by
  // Its range's replication lag as its primary last reported it (-1: not
  // known: no backups, or no recent report at the range's epoch).
  int64_t lag_records = -1;
  float lag_seconds = -1;
};

struct WorkerStatus {
  uint32_t id = 0, rank = 0, batch = 0, staleness = 0, staleness_range = 0;
  uint64_t clock = 0;
  bool alive = false, done = false;
  float samples_per_second = 0;
  std::vector<uint32_t> partitions;
  bool paused = false;
  std::vector<wire::DataChunk> chunks;  // the data stream's, held
  uint64_t epoch_samples = 0;           // trained in the current epoch
};

struct DataStreamStatus {
  uint32_t epoch = 0, epochs = 0;
  float progress = 0;
  uint64_t samples = 0, handed_out = 0, taken_over = 0, returned = 0;
};

struct StatusReply {
  using Wire = wire::StatusReply;
  wire::JobState state = wire::JobState::Waiting;
  wire::Mode mode = wire::Mode::Bsp;
  wire::Policy policy = wire::Policy::Fixed;
  std::string stop_reason;
  double seconds_running = -1;
  float last_accuracy = -1;
  std::optional<ShardMap> shard_map;
  uint64_t membership_version = 0;
  std::vector<wire::KeyLen> model;
  std::vector<ShardStatus> shards;
  std::vector<WorkerStatus> workers;
  std::vector<wire::PartitionPosition> partitions;
  uint64_t pause_at = 0;
  bool moving = false;
  uint32_t replicas = 0;  // backups wanted per range
  std::optional<DataStreamStatus> data_stream;  // the data stream, once started
};

struct RemoveWorker {
  using Wire = wire::RemoveWorker;
  uint32_t id = 0;
};

struct ShardControl {
  using Wire = wire::ShardControl;
  wire::ShardOp op = wire::ShardOp::Add;
  uint32_t shard_id = 0;
};

struct FaultControl {
  using Wire = wire::FaultControl;
  wire::FaultOp op = wire::FaultOp::List;
  std::string target, spec;
};

struct FaultControlReply {
  using Wire = wire::FaultControlReply;
  uint64_t version = 0;
  std::vector<std::pair<std::string, std::string>> entries;  // target, spec
};

flatbuffers::Offset<wire::Ack> Build(flatbuffers::FlatBufferBuilder& fbb, const Ack& m);
flatbuffers::Offset<wire::Error> Build(flatbuffers::FlatBufferBuilder& fbb, const Error& m);
flatbuffers::Offset<wire::Stop> Build(flatbuffers::FlatBufferBuilder& fbb, const Stop& m);
flatbuffers::Offset<wire::MoveOut> Build(flatbuffers::FlatBufferBuilder& fbb, const MoveOut& m);
flatbuffers::Offset<wire::MoveData> Build(flatbuffers::FlatBufferBuilder& fbb, const MoveData& m);
flatbuffers::Offset<wire::SetLr> Build(flatbuffers::FlatBufferBuilder& fbb, const SetLr& m);
flatbuffers::Offset<wire::SetLrReply> Build(flatbuffers::FlatBufferBuilder& fbb, const SetLrReply& m);

Ack FromWire(const wire::Ack& t);
Error FromWire(const wire::Error& t);
Stop FromWire(const wire::Stop& t);
MoveOut FromWire(const wire::MoveOut& t);
MoveData FromWire(const wire::MoveData& t);
SetLr FromWire(const wire::SetLr& t);
SetLrReply FromWire(const wire::SetLrReply& t);
flatbuffers::Offset<wire::JobConfig> Build(flatbuffers::FlatBufferBuilder& fbb, const JobConfig& m);
flatbuffers::Offset<wire::ShardMap> Build(flatbuffers::FlatBufferBuilder& fbb, const ShardMap& m);
flatbuffers::Offset<wire::Assignment> Build(flatbuffers::FlatBufferBuilder& fbb, const Assignment& m);
flatbuffers::Offset<wire::Register> Build(flatbuffers::FlatBufferBuilder& fbb, const Register& m);
flatbuffers::Offset<wire::RegisterReply> Build(flatbuffers::FlatBufferBuilder& fbb, const RegisterReply& m);
flatbuffers::Offset<wire::Heartbeat> Build(flatbuffers::FlatBufferBuilder& fbb, const Heartbeat& m);
flatbuffers::Offset<wire::HeartbeatReply> Build(flatbuffers::FlatBufferBuilder& fbb, const HeartbeatReply& m);
flatbuffers::Offset<wire::DeclareModel> Build(flatbuffers::FlatBufferBuilder& fbb, const DeclareModel& m);
flatbuffers::Offset<wire::Membership> Build(flatbuffers::FlatBufferBuilder& fbb, const Membership& m);
flatbuffers::Offset<wire::Init> Build(flatbuffers::FlatBufferBuilder& fbb, const Init& m);
flatbuffers::Offset<wire::Push> Build(flatbuffers::FlatBufferBuilder& fbb, const Push& m);
flatbuffers::Offset<wire::PushReply> Build(flatbuffers::FlatBufferBuilder& fbb, const PushReply& m);
flatbuffers::Offset<wire::Pull> Build(flatbuffers::FlatBufferBuilder& fbb, const Pull& m);
flatbuffers::Offset<wire::PullReply> Build(flatbuffers::FlatBufferBuilder& fbb, const PullReply& m);
flatbuffers::Offset<wire::AccuracyReport> Build(flatbuffers::FlatBufferBuilder& fbb, const AccuracyReport& m);
flatbuffers::Offset<wire::StatusRequest> Build(flatbuffers::FlatBufferBuilder& fbb, const StatusRequest& m);
flatbuffers::Offset<wire::StatusReply> Build(flatbuffers::FlatBufferBuilder& fbb, const StatusReply& m);
flatbuffers::Offset<wire::RemoveWorker> Build(flatbuffers::FlatBufferBuilder& fbb, const RemoveWorker& m);
flatbuffers::Offset<wire::ShardControl> Build(flatbuffers::FlatBufferBuilder& fbb, const ShardControl& m);
flatbuffers::Offset<wire::FaultControl> Build(flatbuffers::FlatBufferBuilder& fbb, const FaultControl& m);
flatbuffers::Offset<wire::FaultControlReply> Build(flatbuffers::FlatBufferBuilder& fbb, const FaultControlReply& m);
flatbuffers::Offset<wire::Replicate> Build(flatbuffers::FlatBufferBuilder& fbb, const Replicate& m);
flatbuffers::Offset<wire::ReplicateReply> Build(flatbuffers::FlatBufferBuilder& fbb, const ReplicateReply& m);
JobConfig FromWire(const wire::JobConfig& t);
ShardMap FromWire(const wire::ShardMap& t);
Assignment FromWire(const wire::Assignment& t);
Register FromWire(const wire::Register& t);
RegisterReply FromWire(const wire::RegisterReply& t);
Heartbeat FromWire(const wire::Heartbeat& t);
HeartbeatReply FromWire(const wire::HeartbeatReply& t);
DeclareModel FromWire(const wire::DeclareModel& t);
Membership FromWire(const wire::Membership& t);
Init FromWire(const wire::Init& t);
Push FromWire(const wire::Push& t);
PushReply FromWire(const wire::PushReply& t);
Pull FromWire(const wire::Pull& t);
PullReply FromWire(const wire::PullReply& t);
AccuracyReport FromWire(const wire::AccuracyReport& t);
StatusRequest FromWire(const wire::StatusRequest& t);
StatusReply FromWire(const wire::StatusReply& t);
RemoveWorker FromWire(const wire::RemoveWorker& t);
ShardControl FromWire(const wire::ShardControl& t);
FaultControl FromWire(const wire::FaultControl& t);
FaultControlReply FromWire(const wire::FaultControlReply& t);
Replicate FromWire(const wire::Replicate& t);
ReplicateReply FromWire(const wire::ReplicateReply& t);

// The body of `d` as an M; `d.type()` must be M's (check it first).
template <class M>
M Read(const Decoded& d) {
  return FromWire(*d.As<typename M::Wire>());
}

}  // namespace msg

// The frames of `m` sent under `env`, with an optional payload frame.
template <class M>
Frames EncodeMessage(const Envelope& env, const M& m, Frame payload = {}, bool with_crc = true) {
  flatbuffers::FlatBufferBuilder fbb(256);
  return EncodeBody(env, fbb, msg::Build(fbb, m), std::move(payload), with_crc);
}

// The monitor's data stream (monitor/data_stream.h) as it is saved.
struct DataStreamRecord {
  struct Chunk {
    uint64_t id = 0;
    uint32_t epoch = 0;
    uint64_t begin = 0, end = 0, pos = 0;
    uint32_t owner = 0;
    // A tail hand-over asked of the owner: stop at `cut`, the rest to
    // `taker` (0: none asked).
    uint64_t cut = 0;
    uint32_t taker = 0;
  };
  struct Span {
    uint32_t epoch = 0;
    uint64_t begin = 0, end = 0;
  };
  uint32_t cursor_epoch = 0;
  uint64_t cursor = 0;
  uint64_t next_id = 1;
  std::vector<Chunk> chunks;
  std::vector<Span> pool;
};

// What a restarted monitor needs to go on with its job (--data-dir).
struct MonitorRecord {
  struct Worker {
    uint32_t id = 0, rank = 0, batch = 0, staleness = 0, staleness_range = 0;
    uint64_t start_clock = 0, clock = 0, joined_version = 0;
    bool alive = true, done = false;
    std::string token;       // its registration token ("": none)
    std::string public_key;  // CURVE ("" without transport security)
  };
  struct Shard {
    uint32_t id = 0;
    std::string address;
    uint64_t incarnation = 0;
    uint64_t key_begin = 0, key_end = 0;
    int64_t applied_clock = -1;
    uint32_t restarts = 0;
    bool drained = false;
    std::string public_key;
    std::vector<uint32_t> backups;  // the shards that back its range
    uint64_t epoch = 0;             // its range's epoch
    std::string node;
    uint32_t host = 0;              // after a failover: the shard serving its range
    std::string served_at;          // and at which address
    std::vector<uint32_t> standby;  // dropped lagging backups kept until replaced
    bool retired = false;           // handed its range over (drain-shard) and stopped
    uint32_t promoted_from = 0;     // the primary before a promotion not yet served
  };
  // A data partition: its read position, owner and previous owner (worker
  // ids; 0: none).
  struct Partition {
    uint32_t index = 0, epoch = 0;
    uint64_t offset = 0;
    uint32_t owner = 0, releasing = 0;
  };

  uint64_t job_id = 0;
  wire::JobState state = wire::JobState::Waiting;
  std::string stop_reason;
  uint32_t next_id = 0, next_rank = 0;
  std::vector<wire::KeyLen> model;
  bool map_built = false;
  uint64_t map_version = 0, membership_version = 0;
  uint32_t partition_count = 0;
  std::vector<Worker> workers;
  std::vector<Shard> shards;  // in registration order
  std::vector<Partition> partitions;
  std::optional<double> seconds_running;  // none: not started
  double saved_unix = 0;                  // wall clock of the save
  std::optional<float> last_accuracy;
  std::optional<double> time_to_target;
  bool slack_open = true;
  double batch_per_worker = 0;  // --rescale-batch: B / workers at the start
  // The declaration's tensor names, groups per key and parameter groups.
  std::vector<std::string> model_names;
  std::vector<uint32_t> model_groups;
  std::vector<GroupSettings> param_groups;
  std::vector<std::pair<std::string, float>> lr_overrides;  // pacerctl set-lr
  uint64_t lr_overrides_version = 0;
  // The optimizer the first declaration gave (nullopt: none declared).
  std::optional<JobOptimizer> model_optimizer;
  uint64_t epoch = 0;  // the last range epoch given
  // The data stream: the training set's size and the stream's state.
  uint64_t data_samples = 0;
  std::optional<DataStreamRecord> stream;
};

// The record as a MonitorState flatbuffer (format 1).
std::string EncodeMonitorRecord(const MonitorRecord& r);
// DataLoss when `bytes` does not verify or is of another format.
absl::StatusOr<MonitorRecord> DecodeMonitorRecord(std::string_view bytes);

}  // namespace pacer

#endif  // PACER_PS_BASE_MESSAGES_H_
