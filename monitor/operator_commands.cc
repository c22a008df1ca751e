// pacerctl's commands to the monitor: status, remove-worker, pause, resume,
// add-shard, drain-shard, fault and set-lr. Each reads or asks the manager
// that owns what it names; commands that change the job were checked
// against the operator keys in MonitorCore::Handle.
#include <string>

#include "monitor/monitor.h"
#include "ps/base/messages.h"
#include "spdlog/spdlog.h"

namespace pacer {

void MonitorCore::OnStatus(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  msg::StatusReply r;
  r.state = job_.state();
  r.mode = options_.mode;
  r.policy = WirePolicy();
  r.stop_reason = job_.stop_reason();
  r.seconds_running = job_.seconds_running().value_or(-1);
  r.last_accuracy = job_.last_accuracy() ? static_cast<float>(*job_.last_accuracy()) : -1.0f;
  if (ranges_.built()) r.shard_map = Map();
  r.membership_version = membership_.version();
  r.model = model_.keys();
  const TimePoint now = clock_->Now();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardProcess& sh = shards_[i];
    const RangeState& range = ranges_[i];
    // The lag while its primary's report is recent, of this epoch, with backups.
    const bool lag_known = !range.backups.empty() && range.lag_at != TimePoint{} &&
                           range.lag.epoch == range.epoch &&
                           now - range.lag_at <= Replication::kLagReportAge;
    r.shards.push_back({sh.id, sh.address, range.begin, range.end, !sh.down, sh.applied_clock,
                        sh.checkpoint_age, sh.restarts, range.backups, range.epoch,
                        shards_.HostOf(i),
                        lag_known ? static_cast<int64_t>(range.lag.records) : -1,
                        lag_known ? range.lag.seconds : -1.0f});
  }
  for (const auto& [id, w] : membership_.workers()) {
    r.workers.push_back({w.id, w.rank, w.batch, w.staleness, w.staleness_range, w.clock, w.alive,
                         w.done, w.samples_per_second, {}, w.paused, {}, 0});
  }
  data_.FillStatus(&r, options_.epochs, model_.data_samples());
  r.pause_at = membership_.pause_at();
  r.moving = moves_.moving();
  r.replicas = options_.replicas;
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), r)});
}

void MonitorCore::OnRemoveWorker(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const uint32_t id = msg::Read<msg::RemoveWorker>(d).id;
  if (!membership_.Remove(id)) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "worker " + std::to_string(id) + " is not a live member", out);
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void MonitorCore::OnShardControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::ShardControl c = msg::Read<msg::ShardControl>(d);
  if (!job_.running()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "the job is not running", out);
  }
  switch (c.op) {
    case wire::ShardOp::Pause:
      membership_.set_operator_pause(true);
      membership_.Hold();
      spdlog::info("workers held at clock {} (pacerctl pause)", membership_.pause_at());
      break;
    case wire::ShardOp::Resume:
      membership_.set_operator_pause(false);
      if (!moves_.key_move()) membership_.Release();
      spdlog::info("workers resume{}", moves_.key_move() ? " after the move in progress" : "");
      break;
    default:
      if (auto refused = moves_.Request(c.op, c.shard_id)) {
        return ReplyError(peer, d.env, wire::ErrorCode::Refused, *refused, out);
      }
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void MonitorCore::OnFaultControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::FaultControl c = msg::Read<msg::FaultControl>(d);
  absl::Status st;
  if (c.op == wire::FaultOp::Set) {
    st = faults_.Set(c.target, c.spec, membership_.KnownIds(), shards_.Ids());
  }
  if (c.op == wire::FaultOp::Clear) st = faults_.Clear(c.target);
  if (!st.ok()) return ReplyError(peer, d.env, wire::ErrorCode::Refused, std::string(st.message()), out);
  if (c.op != wire::FaultOp::List && options_.faults) {
    // The monitor's own share, applied at once.
    auto own = ParseFaults(faults_.For("monitor", 0));
    std::vector<FaultRule> rules = options_.base_faults;
    if (own.ok()) rules.insert(rules.end(), own->begin(), own->end());
    options_.faults->SetRules(std::move(rules));
  }
  msg::FaultControlReply reply;
  reply.version = faults_.version();
  reply.entries.assign(faults_.entries().begin(), faults_.entries().end());
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), reply)});
}

void MonitorCore::OnSetLr(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (auto refused = model_.SetLr(msg::Read<msg::SetLr>(d))) {
    return ReplyError(peer, d.env, refused->code, refused->reason, out);
  }
  msg::SetLrReply reply;
  reply.overrides.assign(model_.lr_overrides().begin(), model_.lr_overrides().end());
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), reply)});
}

}  // namespace pacer
