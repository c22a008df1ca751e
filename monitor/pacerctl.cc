// pacerctl: a small CLI that talks to the monitor.
//
//   pacerctl [--monitor ADDR] status [-o table|wide|json] [--watch S]
//   pacerctl [--monitor ADDR] remove-worker ID
//   pacerctl [--monitor ADDR] export-model FILE
//   pacerctl [--monitor ADDR] set-lr GROUP VALUE|clear
//
// --monitor falls back to $PACER_MONITOR. Data on stdout, messages on stderr.
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"
#include "ps/base/cli.h"
#include "ps/client.h"
#include "ps/model_file.h"
#include "ps/base/rpc.h"
#include "ps/base/security.h"
#include "ps/base/transport.h"
#include "spdlog/spdlog.h"

namespace {

// The sender id pacerctl uses: not a member, not the monitor.
constexpr uint32_t kToolSender = 0xFFFFFFFFu;

struct Ctl {
  std::unique_ptr<pacer::Transport> transport;
  std::unique_ptr<pacer::RpcChannel> monitor;
  double timeout_s = 5;
  uint64_t job = 0;

  pacer::TimePoint Deadline() const {
    return transport->clock()->Now() + pacer::FromSeconds(timeout_s);
  }
  absl::Status Connect(const std::string& address, const pacer::SecurityFlags& security) {
    pacer::TransportOptions topts;
    auto keys = pacer::ApplySecurity(security, "pacerctl", nullptr, &topts);
    if (!keys.ok()) return keys.status();
    transport = pacer::MakeZmqTransport(topts);
    transport->SetServerKey(address, keys->monitor_key);
    pacer::RpcOptions ropts;
    ropts.check_job = false;
    ropts.sender = kToolSender;
    auto ch = pacer::RpcChannel::Connect(transport.get(), address, ropts);
    if (!ch.ok()) return ch.status();
    monitor = std::move(*ch);
    return absl::OkStatus();
  }
  // The monitor's status.
  absl::StatusOr<pacer::msg::StatusReply> Status() {
    // A status request is safe to repeat: resend it if it goes missing.
    const pacer::Duration before = monitor->options().resend_after;
    monitor->options().resend_after = std::chrono::seconds(1);
    auto reply = monitor->Call(pacer::msg::StatusRequest{}, Deadline());
    monitor->options().resend_after = before;
    if (!reply.ok()) return reply.status();
    if (reply->type() != pacer::wire::Body::StatusReply) {
      return absl::InternalError(std::string("the monitor answered with ") +
                                 pacer::wire::EnumNameBody(reply->type()));
    }
    job = reply->env.job_id;
    monitor->options().job_id = job;
    return pacer::msg::Read<pacer::msg::StatusReply>(*reply);
  }
};

std::string Lower(const char* name) {
  std::string s = name ? name : "";
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

nlohmann::json StatusJson(uint64_t job, const pacer::msg::StatusReply& r) {
  using nlohmann::json;
  json j;
  j["job_id"] = std::to_string(job);  // 64-bit ids do not survive JSON doubles
  j["state"] = Lower(pacer::wire::EnumNameJobState(r.state));
  j["mode"] = Lower(pacer::wire::EnumNameMode(r.mode));
  // As --policy spells them.
  j["policy"] = r.policy == pacer::wire::Policy::AdaptiveBatch ? "adaptive-batch"
                : r.policy == pacer::wire::Policy::Pacer        ? "pacer"
                                                                : "fixed";
  j["stop_reason"] = r.stop_reason;
  j["seconds_running"] = r.seconds_running >= 0 ? json(r.seconds_running) : json(nullptr);
  j["test_accuracy"] = r.last_accuracy >= 0 ? json(r.last_accuracy) : json(nullptr);
  j["shard_map_version"] = r.shard_map ? r.shard_map->version : 0;
  j["membership_version"] = r.membership_version;
  j["pause_at"] = r.pause_at;
  j["moving"] = r.moving;
  j["replicas"] = r.replicas;
  uint64_t params = 0;
  for (const auto& k : r.model) params += k.length();
  j["model"] = {{"keys", r.model.size()}, {"parameters", params}};
  j["shards"] = json::array();
  for (const auto& s : r.shards) {
    j["shards"].push_back({{"id", s.id},
                           {"address", s.address},
                           {"key_begin", s.key_begin},
                           {"key_end", s.key_end},
                           {"up", s.up},
                           {"applied_clock", s.applied_clock},
                           {"checkpoint_age_seconds", s.checkpoint_age_seconds >= 0
                                                          ? json(s.checkpoint_age_seconds)
                                                          : json(nullptr)},
                           {"restarts", s.restarts},
                           {"node", s.node},
                           {"epoch", s.epoch},
                           {"backups", s.backups},
                           // Its range's replication lag (null: not known).
                           {"lag_records", s.lag_records >= 0 ? json(s.lag_records) : json(nullptr)},
                           {"lag_seconds", s.lag_seconds >= 0 ? json(s.lag_seconds) : json(nullptr)}});
  }
  j["workers"] = json::array();
  for (const auto& w : r.workers) {
    j["workers"].push_back({{"id", w.id},
                            {"rank", w.rank},
                            {"state", w.done ? "done" : (w.alive ? "live" : "dead")},
                            {"batch", w.batch},
                            {"staleness", w.staleness},
                            {"staleness_range", w.staleness_range},
                            {"clock", w.clock},
                            {"samples_per_second", w.samples_per_second},
                            {"partitions", w.partitions},
                            {"paused", w.paused}});
    if (r.data_stream) {
      // The chunks it holds: epoch, [begin, end) and the trained position.
      json chunks = json::array();
      for (const auto& c : w.chunks) {
        chunks.push_back({{"epoch", c.epoch()}, {"begin", c.begin()}, {"end", c.end()},
                          {"position", c.pos()}});
      }
      j["workers"].back()["chunks"] = std::move(chunks);
      j["workers"].back()["epoch_samples"] = w.epoch_samples;
    }
  }
  j["data_stream"] = json(nullptr);  // partitions, or the job not started
  if (r.data_stream) {
    const auto& s = *r.data_stream;
    j["data_stream"] = {{"epoch", s.epoch},           {"epochs", s.epochs},
                        {"progress", s.progress},     {"samples", s.samples},
                        {"handed_out", s.handed_out}, {"taken_over", s.taken_over},
                        {"returned", s.returned}};
  }
  j["partitions"] = json::array();
  for (const auto& p : r.partitions) {
    j["partitions"].push_back({{"index", p.index()}, {"epoch", p.epoch()}, {"offset", p.offset()}});
  }
  return j;
}

void PrintTable(const nlohmann::json& j, bool wide) {
  std::printf("job %s  %s", j["job_id"].get<std::string>().c_str(),
              j["state"].get<std::string>().c_str());
  if (!j["seconds_running"].is_null()) std::printf(" %.1f s", j["seconds_running"].get<double>());
  std::printf("  mode %s  policy %s", j["mode"].get<std::string>().c_str(),
              j["policy"].get<std::string>().c_str());
  if (!j["test_accuracy"].is_null()) std::printf("  accuracy %.4f", j["test_accuracy"].get<double>());
  std::printf("  shard map v%llu  membership v%llu  model %llu parameters\n",
              static_cast<unsigned long long>(j["shard_map_version"].get<uint64_t>()),
              static_cast<unsigned long long>(j["membership_version"].get<uint64_t>()),
              static_cast<unsigned long long>(j["model"]["parameters"].get<uint64_t>()));
  if (j["pause_at"].get<uint64_t>() != 0) {
    std::printf("workers held at clock %llu%s\n",
                static_cast<unsigned long long>(j["pause_at"].get<uint64_t>()),
                j["moving"].get<bool>() ? " (a shard move is in progress)" : "");
  }
  if (!j["stop_reason"].get<std::string>().empty()) {
    std::printf("stop reason: %s\n", j["stop_reason"].get<std::string>().c_str());
  }
  if (const auto& s = j["data_stream"]; !s.is_null()) {
    // Epochs count from 0, as in the monitor's log and the sample logs.
    const uint32_t epochs = s["epochs"].get<uint32_t>(), epoch = s["epoch"].get<uint32_t>();
    const std::string where =
        epochs > 0 && epoch >= epochs
            ? fmt::format("all {} epochs trained", epochs)
            : fmt::format("epoch {} {:.1f}% trained{}", epoch, 100.0 * s["progress"].get<double>(),
                          epochs > 0 ? fmt::format(" (epochs 0 to {})", epochs - 1) : "");
    std::printf("data stream: %llu samples, %s; chunks handed out %llu, tails taken over %llu, "
                "returned %llu\n",
                static_cast<unsigned long long>(s["samples"].get<uint64_t>()), where.c_str(),
                static_cast<unsigned long long>(s["handed_out"].get<uint64_t>()),
                static_cast<unsigned long long>(s["taken_over"].get<uint64_t>()),
                static_cast<unsigned long long>(s["returned"].get<uint64_t>()));
  }
  // With --replicas K: each range's epoch, backups (shard ids) and lag.
  const uint32_t replicas = j["replicas"].get<uint32_t>();
  if (replicas > 0) std::printf("replicas: %u backup(s) per key range\n", replicas);
  std::printf("\n%-6s %-24s %-14s %-4s %-8s %-15s %s", "SHARD", "ADDRESS", "KEYS", "UP", "CLOCK",
              "CHECKPOINT AGE", replicas > 0 ? "RESTARTS  EPOCH  BACKUPS    LAG              NODE" : "RESTARTS");
  std::printf("\n");
  for (const auto& s : j["shards"]) {
    const uint64_t end = s["key_end"].get<uint64_t>();
    const std::string keys =
        end == s["key_begin"].get<uint64_t>()
            ? std::string("idle")
            : "[" + std::to_string(s["key_begin"].get<uint64_t>()) + ", " +
                  (end == UINT64_MAX ? std::string("end") : std::to_string(end)) + ")";
    const std::string age = s["checkpoint_age_seconds"].is_null()
                                ? "-"
                                : fmt::format("{:.1f} s", s["checkpoint_age_seconds"].get<double>());
    std::printf("%-6u %-24s %-14s %-4s %-8lld %-15s %s", s["id"].get<uint32_t>(),
                s["address"].get<std::string>().c_str(), keys.c_str(),
                s["up"].get<bool>() ? "yes" : "no",
                static_cast<long long>(s["applied_clock"].get<int64_t>()), age.c_str(),
                (replicas > 0 ? fmt::format("{:<9}", s["restarts"].get<uint32_t>())
                              : std::to_string(s["restarts"].get<uint32_t>()))
                    .c_str());
    if (replicas > 0) {
      std::string backups;
      for (const auto& b : s["backups"]) {
        backups += (backups.empty() ? "" : ",") + std::to_string(b.get<uint32_t>());
      }
      // An idle shard has no range, so no epoch and no backups of its own.
      const bool idle = end == s["key_begin"].get<uint64_t>();
      // Records its backups have not acknowledged yet, and the age of the
      // oldest ("-": no backups, or no recent report from its primary).
      const std::string lag =
          idle || s["lag_records"].is_null()
              ? std::string("-")
              : fmt::format("{} rec, {:.2f} s", s["lag_records"].get<int64_t>(),
                            s["lag_seconds"].is_null() ? 0.0 : s["lag_seconds"].get<double>());
      std::printf(" %-6s %-10s %-16s %s",
                  idle ? "-" : std::to_string(s["epoch"].get<uint64_t>()).c_str(),
                  idle ? "-" : (backups.empty() ? "none" : backups.c_str()), lag.c_str(),
                  s["node"].get<std::string>().c_str());
    }
    std::printf("\n");
  }
  const bool stream = !j["data_stream"].is_null();
  std::printf("\n%-7s %-5s %-5s %-6s %-10s %-8s %-10s %s\n", "WORKER", "RANK", "STATE", "BATCH",
              "STALENESS", "CLOCK", "SAMPLES/S",
              stream ? "EPOCH SAMPLES  CHUNKS (epoch: trained position in [begin, end))"
                     : "PARTITIONS");
  for (const auto& w : j["workers"]) {
    if (!wide && w["state"] != "live") continue;
    std::string parts;
    for (const auto& p : w["partitions"]) parts += (parts.empty() ? "" : ",") + std::to_string(p.get<uint32_t>());
    if (stream) {
      for (const auto& c : w["chunks"]) {
        parts += fmt::format("{}{}: {} in [{}, {})", parts.empty() ? "" : "; ",
                             c["epoch"].get<uint32_t>(), c["position"].get<uint64_t>(),
                             c["begin"].get<uint64_t>(), c["end"].get<uint64_t>());
      }
      parts = fmt::format("{:<14} {}", w["epoch_samples"].get<uint64_t>(),
                          parts.empty() ? "-" : parts);
    }
    const std::string staleness = std::to_string(w["staleness"].get<uint32_t>()) +
                                  (w["staleness_range"].get<uint32_t>() > 0
                                       ? "+" + std::to_string(w["staleness_range"].get<uint32_t>())
                                       : "");
    std::printf("%-7u %-5u %-5s %-6u %-10s %-8llu %-10.0f %s\n", w["id"].get<uint32_t>(),
                w["rank"].get<uint32_t>(), w["state"].get<std::string>().c_str(),
                w["batch"].get<uint32_t>(), staleness.c_str(),
                static_cast<unsigned long long>(w["clock"].get<uint64_t>()),
                w["samples_per_second"].get<double>(), parts.empty() ? "-" : parts.c_str());
  }
  if (wide) {
    std::printf("\n%-10s %-6s %s\n", "PARTITION", "EPOCH", "OFFSET");
    for (const auto& p : j["partitions"]) {
      std::printf("%-10u %-6u %llu\n", p["index"].get<uint32_t>(), p["epoch"].get<uint32_t>(),
                  static_cast<unsigned long long>(p["offset"].get<uint64_t>()));
    }
  }
}

int StatusCommand(Ctl& ctl, const std::string& output, double watch_s) {
  for (;;) {
    auto r = ctl.Status();
    if (!r.ok()) {
      std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(r.status()).c_str());
      return pacer::kExitFailure;
    }
    const nlohmann::json j = StatusJson(ctl.job, *r);
    if (output == "json") {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      PrintTable(j, output == "wide");
    }
    std::fflush(stdout);
    if (watch_s <= 0) return pacer::kExitOk;
    const pacer::Clock* clock = ctl.transport->clock();
    clock->SleepUntil(clock->Now() + pacer::FromSeconds(watch_s));
    if (output != "json") std::printf("\n");
  }
}

int RemoveWorkerCommand(Ctl& ctl, uint32_t id) {
  if (auto r = ctl.Status(); !r.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(r.status()).c_str());
    return pacer::kExitFailure;
  }
  auto reply = ctl.monitor->Call(pacer::msg::RemoveWorker{id}, ctl.Deadline());
  if (!reply.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(reply.status()).c_str());
    return pacer::kExitFailure;
  }
  std::printf("removed worker %u\n", id);
  return pacer::kExitOk;
}

// pacerctl fault set|clear|list: the monitor's run-time fault table.
int FaultCommand(Ctl& ctl, pacer::wire::FaultOp op, const std::string& target,
                 const std::string& spec) {
  // Setting the same table twice does no harm: resend lost requests (a
  // fault table with message loss also drops pacerctl's own messages).
  ctl.monitor->options().resend_after = std::chrono::seconds(1);
  if (auto st = ctl.Status(); !st.ok()) {  // learns the job id
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(st.status()).c_str());
    return pacer::kExitFailure;
  }
  auto reply = ctl.monitor->Call(pacer::msg::FaultControl{op, target, spec}, ctl.Deadline());
  if (!reply.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(reply.status()).c_str());
    return pacer::kExitFailure;
  }
  if (reply->type() != pacer::wire::Body::FaultControlReply) {
    std::fprintf(stderr, "pacerctl: unexpected answer %s\n", pacer::wire::EnumNameBody(reply->type()));
    return pacer::kExitFailure;
  }
  const auto r = pacer::msg::Read<pacer::msg::FaultControlReply>(*reply);
  std::printf("fault table version %llu\n", static_cast<unsigned long long>(r.version));
  if (r.entries.empty()) {
    std::printf("no faults set\n");
    return pacer::kExitOk;
  }
  std::printf("%-12s %s\n", "TARGET", "FAULTS");
  for (const auto& [target, spec] : r.entries) {
    std::printf("%-12s %s\n", target.c_str(), spec.c_str());
  }
  return pacer::kExitOk;
}

// pacerctl set-lr GROUP VALUE|clear: a group's lr by hand.
int SetLrCommand(Ctl& ctl, const std::string& group, const std::string& value) {
  pacer::msg::SetLr request;
  request.group = group;
  if (value == "clear") {
    request.clear = true;
  } else {
    char* end = nullptr;
    request.lr = std::strtof(value.c_str(), &end);
    if (value.empty() || end == nullptr || *end != '\0' || !std::isfinite(request.lr) ||
        request.lr < 0.0f) {
      std::fprintf(stderr, "pacerctl: set-lr: '%s' is neither a learning rate (>= 0) nor 'clear'\n",
                   value.c_str());
      return pacer::kExitUsage;
    }
  }
  ctl.monitor->options().resend_after = std::chrono::seconds(1);  // setting twice does no harm
  if (auto st = ctl.Status(); !st.ok()) {  // learns the job id
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(st.status()).c_str());
    return pacer::kExitFailure;
  }
  auto reply = ctl.monitor->Call(request, ctl.Deadline());
  if (!reply.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(reply.status()).c_str());
    return pacer::kExitFailure;
  }
  if (reply->type() != pacer::wire::Body::SetLrReply) {
    std::fprintf(stderr, "pacerctl: unexpected answer %s\n", pacer::wire::EnumNameBody(reply->type()));
    return pacer::kExitFailure;
  }
  const auto r = pacer::msg::Read<pacer::msg::SetLrReply>(*reply);
  if (r.overrides.empty()) {
    std::printf("no learning rate set by hand: each group steps at the lr its pushes carry, "
                "else its declared lr\n");
    return pacer::kExitOk;
  }
  std::printf("%-16s %s\n", "GROUP", "LR (set by hand; wins until cleared)");
  for (const auto& [name, lr] : r.overrides) std::printf("%-16s %g\n", name.c_str(), lr);
  return pacer::kExitOk;
}

int ShardControlCommand(Ctl& ctl, pacer::wire::ShardOp op, uint32_t shard) {
  auto r = ctl.Status();
  if (!r.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(r.status()).c_str());
    return pacer::kExitFailure;
  }
  const uint64_t version = r->shard_map ? r->shard_map->version : 0;
  auto reply = ctl.monitor->Call(pacer::msg::ShardControl{op, shard}, ctl.Deadline());
  if (!reply.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(reply.status()).c_str());
    return pacer::kExitFailure;
  }
  if (op == pacer::wire::ShardOp::Pause || op == pacer::wire::ShardOp::Resume) {
    std::printf("%s\n", op == pacer::wire::ShardOp::Pause ? "workers held" : "workers resume");
    return pacer::kExitOk;
  }
  // Wait for the move: a newer shard map, nothing moving.
  const pacer::Clock* clock = ctl.transport->clock();
  const pacer::TimePoint give_up = clock->Now() + pacer::FromSeconds(ctl.timeout_s * 12);
  while (clock->Now() < give_up) {
    auto st = ctl.Status();
    if (st.ok() && !st->moving && st->shard_map && st->shard_map->version > version) {
      std::printf("shard map v%llu: shard %u %s\n",
                  static_cast<unsigned long long>(st->shard_map->version), shard,
                  op == pacer::wire::ShardOp::Add ? "added" : "drained");
      return pacer::kExitOk;
    }
    clock->SleepUntil(clock->Now() + std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "pacerctl: the move did not finish in time (see the monitor's log)\n");
  return pacer::kExitFailure;
}

// Reads the optimizer's state of every key into `m` (format 2): each
// shard's keys in one Pull with_state.
absl::Status ReadOptimizerState(Ctl& ctl, const pacer::ShardMapInfo& map, pacer::ModelFile* m) {
  auto slices = pacer::SplitByShard(m->keys, map);
  if (!slices.ok()) return slices.status();
  const size_t total = m->values.size();
  m->with_state = true;
  m->key_steps.assign(m->keys.size(), 0);
  bool first = true;
  for (const pacer::Slice& sl : *slices) {
    if (sl.num_keys == 0) continue;
    const pacer::ShardEntry& shard = map.shards[sl.shard];
    ctl.transport->SetServerKey(shard.address, shard.public_key);
    pacer::RpcOptions ropts;
    ropts.job_id = ctl.job;
    ropts.sender = kToolSender;
    ropts.resend_after = std::chrono::seconds(1);  // a read: safe to repeat
    auto ch = pacer::RpcChannel::Connect(ctl.transport.get(), shard.address, ropts);
    if (!ch.ok()) return ch.status();
    pacer::msg::Pull pull;
    pull.latest = true;
    pull.with_state = true;
    pull.keys.assign(m->keys.begin() + static_cast<long>(sl.first_key),
                     m->keys.begin() + static_cast<long>(sl.first_key + sl.num_keys));
    auto reply = (*ch)->Call(pull, ctl.Deadline());
    if (!reply.ok()) return reply.status();
    if (reply->type() != pacer::wire::Body::PullReply) {
      return absl::InternalError(std::string("shard answered ") +
                                 pacer::wire::EnumNameBody(reply->type()));
    }
    const auto r = pacer::msg::Read<pacer::msg::PullReply>(*reply);
    if (first) {
      m->optimizer = r.optimizer;
      m->state_slots = r.state_slots;
      m->state.assign(total * r.state_slots, 0.0f);
      first = false;
    } else if (r.optimizer != m->optimizer || r.state_slots != m->state_slots) {
      return absl::FailedPreconditionError("the shards disagree on the optimizer");
    }
    if (r.key_steps.size() != sl.num_keys) return absl::InternalError("no step counts");
    // The payload: the keys' parameters, then each slot's values.
    std::span<const float> v = reply->floats();
    std::copy(v.begin(), v.begin() + static_cast<long>(sl.length),
              m->values.begin() + static_cast<long>(sl.offset));
    for (uint32_t s = 0; s < r.state_slots; ++s) {
      std::copy(v.begin() + static_cast<long>((s + 1) * sl.length),
                v.begin() + static_cast<long>((s + 2) * sl.length),
                m->state.begin() + static_cast<long>(s * total + sl.offset));
    }
    std::copy(r.key_steps.begin(), r.key_steps.end(),
              m->key_steps.begin() + static_cast<long>(sl.first_key));
  }
  return absl::OkStatus();
}

int ExportModelCommand(Ctl& ctl, const std::string& path, bool with_state) {
  auto st = ctl.Status();
  if (!st.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(st.status()).c_str());
    return pacer::kExitFailure;
  }
  if (!st->shard_map || st->model.empty()) {
    std::fprintf(stderr, "pacerctl: the job has no model on the shards yet\n");
    return pacer::kExitFailure;
  }
  pacer::ShardMapInfo map = pacer::ShardMapFromWire(*st->shard_map);
  std::vector<pacer::wire::KeyLen> keys = st->model;
  pacer::ClientOptions copts;
  copts.rpc.job_id = ctl.job;
  copts.rpc.sender = kToolSender;
  copts.request_timeout = pacer::FromSeconds(ctl.timeout_s * 6);
  auto client = pacer::PsClient::Create(ctl.transport.get(), copts, map, keys);
  if (!client.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(client.status()).c_str());
    return pacer::kExitFailure;
  }
  auto pulled = (*client)->Pull(0, /*latest=*/true);
  if (!pulled.ok()) {
    std::fprintf(stderr, "pacerctl: reading the parameters: %s\n", pacer::ErrorText(pulled.status()).c_str());
    return pacer::kExitFailure;
  }
  pacer::ModelFile m;
  m.job_id = ctl.job;
  m.map_version = map.version;
  m.keys = (*client)->keys();
  m.values.assign((*client)->params().begin(), (*client)->params().end());
  if (with_state) {
    // Read again, with the state: parameters and state of one moment per
    // shard (the workers should be held, pacerctl pause, for one moment of
    // the whole model).
    if (absl::Status s = ReadOptimizerState(ctl, map, &m); !s.ok()) {
      std::fprintf(stderr, "pacerctl: reading the optimizer state: %s\n",
                   pacer::ErrorText(s).c_str());
      return pacer::kExitFailure;
    }
  }
  if (absl::Status s = pacer::WriteModelFile(path, m); !s.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(s).c_str());
    return pacer::kExitFailure;
  }
  std::printf("exported %zu parameters (%zu keys, applied clock %lld%s%s) of job %llu to %s\n",
              m.values.size(), m.keys.size(), static_cast<long long>(*pulled),
              with_state ? ", with the state of " : "",
              with_state ? std::string(pacer::OptimizerName(m.optimizer)).c_str() : "",
              static_cast<unsigned long long>(ctl.job), path.c_str());
  return pacer::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::string monitor;
  if (const char* env = std::getenv("PACER_MONITOR")) monitor = env;
  std::string log_level = "warn";
  Ctl ctl;
  CLI::App app{"pacerctl: inspect and steer a running Pacer job through its monitor.", "pacerctl"};
  app.add_option("--monitor", monitor,
                 "The monitor's address, tcp://HOST:PORT (default: $PACER_MONITOR)")
      ->check(pacer::PeerAddress());
  app.add_option("--timeout", ctl.timeout_s, "Seconds to wait for the monitor's answer")
      ->capture_default_str()->check(pacer::Positive());
  pacer::AddLogLevelFlag(app, &log_level);
  pacer::SecurityFlags security;
  pacer::AddSecurityFlags(app, &security);
  app.require_subcommand(0, 1);

  std::string key_prefix, key_name;
  auto* keygen = app.add_subcommand(
      "keygen", "Write a new CURVE keypair for one process (transport security): PREFIX.key "
                "(both keys, mode 0600; give it to that process's --key) and PREFIX.pub (its "
                "public key as an --allowed-keys line); prints the public key. Needs no monitor");
  keygen->add_option("PREFIX", key_prefix, "Path prefix of the two files")->required();
  keygen->add_option("--name", key_name,
                     "The name on the .pub line (the monitor's must be 'monitor')");

  std::string output = "table";
  double watch_s = 0;
  auto* status = app.add_subcommand(
      "status", "A table of the job's shards and workers: key ranges, clocks, checkpoint age, "
                "batch sizes, staleness bounds, data partitions");
  status->add_option("-o,--output", output, "table, wide (adds dead workers and read positions) "
                                            "or json (a stable shape, for scripts)")
      ->capture_default_str()->check(CLI::IsMember({"table", "wide", "json"}));
  status->add_option("--watch", watch_s, "Refresh every S seconds until interrupted")
      ->check(pacer::NonNegative());

  uint32_t worker_id = 0;
  auto* remove = app.add_subcommand(
      "remove-worker", "Take a worker out of the job now, as if its lease had expired; its data "
                       "partitions go to the others");
  remove->add_option("ID", worker_id, "The worker's id (pacerctl status)")->required();

  uint32_t shard_id = 0;
  auto* add = app.add_subcommand(
      "add-shard", "Give an idle shard (one registered after the start) half of the largest key "
                   "range; the workers are held while the keys move. Waits until done");
  add->add_option("ID", shard_id, "The idle shard's id (pacerctl status)")->required();
  auto* drain = app.add_subcommand(
      "drain-shard", "Move a shard's whole key range to a neighbouring shard and stop it; the "
                     "workers are held while the keys move. With --replicas on the monitor, "
                     "the range goes to its backup instead: the shard stops applying, its "
                     "backup takes its last record and serves the range at once, nothing is "
                     "copied. Waits until done");
  drain->add_option("ID", shard_id, "The shard's id (pacerctl status)")->required();
  auto* pause = app.add_subcommand("pause", "Hold every worker at a common clock (no update is "
                                            "applied until resume)");
  auto* resume = app.add_subcommand("resume", "Let the workers go on after pause");

  std::string fault_target, fault_spec;
  auto* fault = app.add_subcommand(
      "fault", "Inject faults at run time: the monitor hands them to the processes with their "
               "next heartbeat reply (see pacer-server --help, --faults, for the rules)");
  fault->require_subcommand(1);
  auto* fault_set = fault->add_subcommand("set", "Set TARGET's faults (replacing what it had)");
  fault_set->add_option("TARGET", fault_target,
                        "all, monitor, server, worker, server:ID or worker:ID (ID: the id the "
                        "monitor assigned, as pacerctl status shows it)")->required();
  fault_set->add_option("SPEC", fault_spec,
                        "Rules, e.g. 'drop:p=0.1;delay:ms=200,jitter=50' or "
                        "'partition:peers=3,for=10'")->required();
  auto* fault_clear = fault->add_subcommand("clear", "Clear TARGET's faults (every target's "
                                                     "when none is given)");
  fault_clear->add_option("TARGET", fault_target, "A target as for set");
  auto* fault_list = fault->add_subcommand("list", "The fault table");

  std::string lr_group, lr_value;
  auto* set_lr = app.add_subcommand(
      "set-lr", "Set a parameter group's learning rate by hand: it wins over the lr that pushes "
                "carry (a worker's scheduler) and the group's declared lr until cleared");
  set_lr->add_option("GROUP", lr_group,
                     "The group's name: 'default', or one the model declares")->required();
  set_lr->add_option("VALUE", lr_value, "The learning rate (>= 0), or 'clear'")->required();

  std::string path;
  auto* exportm = app.add_subcommand(
      "export-model", "Read the current parameters from the shards and write them to FILE "
                      "(format: ps/model_file.h); pacer-worker --evaluate-model FILE evaluates it");
  exportm->add_option("FILE", path, "Output file")->required();
  bool with_state = false;
  exportm->add_flag("--with-state", with_state,
                    "Also the optimizer's state (momentum; Adam's m, v; Adagrad's sum) and each "
                    "key's step count (file format 2); hold the workers first (pacerctl pause) "
                    "for one moment of the whole model");

  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  pacer::SetupLogging("pacerctl", log_level);
  if (*keygen) {
    auto keys = pacer::GenerateKeyPair();
    absl::Status s = keys.ok() ? pacer::WriteKeyFiles(*keys, key_prefix, key_name) : keys.status();
    if (!s.ok()) {
      std::fprintf(stderr, "pacerctl: keygen: %s\n", std::string(s.message()).c_str());
      return pacer::kExitFailure;
    }
    std::printf("%s\n", keys->public_key.c_str());
    std::fprintf(stderr, "wrote %s.key (secret, mode 0600) and %s.pub\n", key_prefix.c_str(),
                 key_prefix.c_str());
    return pacer::kExitOk;
  }
  if (!*status && !*remove && !*exportm && !*add && !*drain && !*pause && !*resume && !*fault &&
      !*set_lr) {
    std::fprintf(stderr, "pacerctl: a command is required: status, remove-worker, export-model, "
                         "add-shard, drain-shard, pause, resume, fault, set-lr or keygen (see "
                         "--help)\n");
    return pacer::kExitUsage;
  }
  if (monitor.empty()) {
    std::fprintf(stderr, "pacerctl: no monitor address: give --monitor or set PACER_MONITOR\n");
    return pacer::kExitUsage;
  }
  if (absl::Status s = ctl.Connect(monitor, security); !s.ok()) {
    std::fprintf(stderr, "pacerctl: %s\n", pacer::ErrorText(s).c_str());
    return pacer::kExitFailure;
  }
  if (*status) return StatusCommand(ctl, output, watch_s);
  if (*remove) return RemoveWorkerCommand(ctl, worker_id);
  if (*add) return ShardControlCommand(ctl, pacer::wire::ShardOp::Add, shard_id);
  if (*drain) return ShardControlCommand(ctl, pacer::wire::ShardOp::Drain, shard_id);
  if (*pause) return ShardControlCommand(ctl, pacer::wire::ShardOp::Pause, 0);
  if (*resume) return ShardControlCommand(ctl, pacer::wire::ShardOp::Resume, 0);
  if (*fault_set) return FaultCommand(ctl, pacer::wire::FaultOp::Set, fault_target, fault_spec);
  if (*fault_clear) return FaultCommand(ctl, pacer::wire::FaultOp::Clear, fault_target, "");
  if (*fault_list) return FaultCommand(ctl, pacer::wire::FaultOp::List, "", "");
  if (*set_lr) return SetLrCommand(ctl, lr_group, lr_value);
  return ExportModelCommand(ctl, path, with_state);
}
