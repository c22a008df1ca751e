// Checkpoint and recovery figures (issue 4), for bench/RESULTS.md.
//
//  1. Checkpoint throughput: CheckpointStore::Save of a snapshot of N floats
//     (parameters and momentum), against a baseline measured in the same run:
//     the same bytes written to one file and fdatasync'ed.
//  2. Recovery after kill -9: a pacer-monitor and a pacer-server holding N
//     floats run as processes; this program is the worker. It pushes a step,
//     waits for the shard's checkpoint, kills the shard with SIGKILL, starts
//     it again on the same --data-dir and times restart -> first answered
//     pull, checking that the parameters came back bit for bit. Baseline:
//     the first start of the same shard with no checkpoint (process start,
//     registration and the monitor's declaration, without the load).
//
// Usage: pacer-recovery-bench [--floats N] [--restarts R] [--dir DIR]
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <regex>
#include <thread>

#include "CLI/CLI.hpp"
#include "ps/checkpoint.h"
#include "ps/client.h"
#include "ps/base/rpc.h"
#include "ps/base/transport.h"
#include "tests/process_util.h"

namespace {

using pacer::test::FetchMetrics;
using pacer::test::MetricValue;
using pacer::test::Process;
using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// MB/s of Save for a snapshot of `floats`, and of the raw-file baseline.
void CheckpointThroughput(size_t floats, const std::string& dir, int reps) {
  pacer::ShardSnapshot s;
  s.job_id = 7;
  s.shard_id = 1;
  const uint32_t key_floats = 250000;
  for (size_t k = 0, left = floats; left > 0; ++k) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(key_floats, left));
    s.table.keys.push_back({k, n, pacer::kDefaultGroup, 1});
    left -= n;
  }
  auto params = std::make_shared<std::vector<float>>(floats);
  auto velocity = std::make_shared<std::vector<float>>(floats);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (float& x : *params) x = nd(rng);
  for (float& x : *velocity) x = nd(rng);
  s.table.params = params;
  s.table.state = {velocity};  // SGD with momentum
  const double mb = 2.0 * floats * sizeof(float) / 1e6;

  auto store = pacer::CheckpointStore::Open(dir + "/throughput");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<double> save, raw, load;
  for (int r = 0; r < reps; ++r) {
    s.applied_clock = r;
    auto t0 = SteadyClock::now();
    auto bytes = (*store)->Save(s);
    save.push_back(Since(t0));
    if (!bytes.ok()) std::exit(1);
    t0 = SteadyClock::now();
    auto got = (*store)->Load();
    load.push_back(Since(t0));
    if (!got.ok() || !got->has_value() || !(**got == s)) {
      std::fprintf(stderr, "load did not give the snapshot back\n");
      std::exit(1);
    }
    // Baseline: the same bytes to a plain file, synced.
    const std::string path = dir + "/raw.bin";
    t0 = SteadyClock::now();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) std::exit(1);
    for (const auto* v : {params.get(), velocity.get()}) {
      const char* p = reinterpret_cast<const char*>(v->data());
      size_t left = v->size() * sizeof(float);
      while (left > 0) {
        ssize_t w = ::write(fd, p, left);
        if (w <= 0) std::exit(1);
        p += w;
        left -= static_cast<size_t>(w);
      }
    }
    ::fdatasync(fd);
    ::close(fd);
    raw.push_back(Since(t0));
  }
  std::printf("checkpoint of %zu floats (%.1f MB of parameters and momentum), median of %d:\n",
              floats, mb, reps);
  std::printf("  save (synced WriteBatch): %.3f s = %.0f MB/s\n", Median(save), mb / Median(save));
  std::printf("  baseline write+fdatasync: %.3f s = %.0f MB/s\n", Median(raw), mb / Median(raw));
  std::printf("  save / baseline time:     %.2fx\n", Median(save) / Median(raw));
  std::printf("  load (read + CRC check):  %.3f s = %.0f MB/s\n", Median(load), mb / Median(load));
}

struct FakeWorker {
  std::unique_ptr<pacer::Transport> transport;
  std::unique_ptr<pacer::RpcChannel> monitor;
  std::unique_ptr<pacer::PsClient> client;
  std::vector<pacer::wire::KeyLen> keys;
  uint32_t id = 0;
  uint64_t job = 0;

  pacer::TimePoint Deadline(double s) {
    return transport->clock()->Now() + pacer::FromSeconds(s);
  }
  // The current shard map from a heartbeat (version 0 when none yet).
  pacer::ShardMapInfo Map() {
    flatbuffers::FlatBufferBuilder fbb;
    auto hb = monitor->Call(fbb, pacer::wire::CreateHeartbeat(fbb, pacer::wire::Role::Worker, 0, 0),
                            Deadline(2));
    if (hb.ok() && hb->type() == pacer::wire::Body::HeartbeatReply &&
        hb->As<pacer::wire::HeartbeatReply>()->shard_map() != nullptr) {
      return pacer::ShardMapFromWire(hb->As<pacer::wire::HeartbeatReply>()->shard_map());
    }
    return {};
  }
  bool Start(const std::string& monitor_address, size_t floats) {
    transport = pacer::MakeZmqTransport(pacer::TransportOptions{});
    pacer::RpcOptions boot;
    boot.check_job = false;
    auto ch = pacer::RpcChannel::Connect(transport.get(), monitor_address, boot);
    if (!ch.ok()) return false;
    monitor = std::move(*ch);
    flatbuffers::FlatBufferBuilder fbb;
    auto reg = monitor->Call(fbb, pacer::wire::CreateRegisterDirect(fbb, pacer::wire::Role::Worker, "bench"),
                             Deadline(10));
    if (!reg.ok()) return false;
    id = reg->As<pacer::wire::RegisterReply>()->id();
    job = reg->env.job_id;
    monitor->options().job_id = job;
    monitor->options().sender = id;
    monitor->options().check_job = true;
    for (size_t k = 0, left = floats; left > 0; ++k) {
      const size_t n = std::min<size_t>(250000, left);
      keys.emplace_back(k, n);
      left -= n;
    }
    flatbuffers::FlatBufferBuilder f2;
    if (!monitor->Call(f2, pacer::wire::CreateDeclareModel(f2, f2.CreateVectorOfStructs(keys), 0), Deadline(10)).ok()) {
      return false;
    }
    pacer::ShardMapInfo map;
    for (int i = 0; i < 500 && map.shards.empty(); ++i) {
      map = Map();
      if (map.shards.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (map.shards.empty()) return false;
    pacer::ClientOptions copts;
    copts.rpc.job_id = job;
    copts.rpc.sender = id;
    copts.request_timeout = std::chrono::seconds(30);
    copts.resend_after = std::chrono::milliseconds(100);
    auto c = pacer::PsClient::Create(transport.get(), copts, map, keys);
    if (!c.ok()) return false;
    client = std::move(*c);
    std::mt19937 rng(2);
    std::normal_distribution<float> nd;
    for (float& x : client->params()) x = nd(rng);
    return client->Init().ok();
  }
};

std::string Checksum(std::span<const float> v) {
  uint32_t crc = 0;
  crc = pacer::Crc32(crc, v.data(), v.size() * sizeof(float));
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

int Recovery(size_t floats, int restarts, const std::string& dir) {
  auto monitor = Process::Start({PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--mode", "bsp",
                                 "--lease", "3600", "--log-level", "warn"},
                                dir, "monitor");
  auto maddr = monitor->WaitForLine("listening ", std::chrono::seconds(10));
  if (!maddr) return 1;
  const std::vector<std::string> shard_args = {
      PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0", "--monitor", *maddr, "--metrics-addr",
      "127.0.0.1:0", "--data-dir", dir + "/shard", "--checkpoint-interval", "0.2"};
  auto t_first = SteadyClock::now();
  auto shard = Process::Start(shard_args, dir, "shard");
  auto metrics = shard->WaitForLine("metrics ", std::chrono::seconds(10));
  if (!metrics || !shard->WaitForLine("listening ", std::chrono::seconds(10))) return 1;
  FakeWorker w;
  if (!w.Start(*maddr, floats)) {
    std::fprintf(stderr, "worker could not start: %s\n", shard->Stderr().c_str());
    return 1;
  }
  const double first_start = Since(t_first);
  // One step, so that momentum is non-zero and the clock moved.
  std::fill(w.client->grads().begin(), w.client->grads().end(), 0.01f);
  if (!w.client->Push(0, 1).ok() || !w.client->Pull(1).ok()) return 1;
  const std::string expected = Checksum(w.client->params());
  std::vector<double> recovery, load;
  for (int r = 0; r < restarts; ++r) {
    // Wait for a checkpoint taken after the step.
    const auto since = SteadyClock::now();
    double ok = 0;
    while (Since(since) < 30) {
      ok = MetricValue(FetchMetrics(*metrics), "pacer_shard_checkpoints_total", {"result=\"ok\""}).value_or(0);
      if (ok >= (r == 0 ? 2 : 1)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string m = FetchMetrics(*metrics);
    if (r == 0) {
      const double sum = MetricValue(m, "pacer_shard_checkpoint_duration_seconds_sum").value_or(0);
      const double count = MetricValue(m, "pacer_shard_checkpoint_duration_seconds_count").value_or(0);
      const double bytes = MetricValue(m, "pacer_shard_checkpoint_size_bytes").value_or(0);
      std::printf("in the shard: %.0f checkpoint(s), mean %.3f s, %.1f MB each\n", count,
                  count > 0 ? sum / count : 0, bytes / 1e6);
    }
    const uint64_t before_kill = w.client->map_version();
    shard->Signal(SIGKILL);
    shard->Wait(std::chrono::seconds(5));
    const auto t0 = SteadyClock::now();
    shard = Process::Start(shard_args, dir, "shard-restart" + std::to_string(r));
    metrics = shard->WaitForLine("metrics ", std::chrono::seconds(30));
    if (!metrics) {
      std::fprintf(stderr, "the restarted shard did not start:\n%s\n", shard->Stderr().c_str());
      return 1;
    }
    // Serving: a pull answered with the restored values, at the new address.
    bool served = false;
    while (Since(t0) < 30 && !served) {
      pacer::ShardMapInfo map = w.Map();
      if (map.version > w.client->map_version() && !w.client->SetMap(map).ok()) return 1;
      // Until the monitor publishes the shard's new address (a newer map),
      // there is nobody to ask.
      if (map.version > before_kill && map.version == w.client->map_version() &&
          w.client->Pull(0, /*latest=*/true).ok()) {
        served = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    const double took = Since(t0);
    if (!served) {
      std::fprintf(stderr, "the restarted shard did not serve within 30 s:\n%s\n%s\n",
                   shard->Stderr().c_str(), monitor->Stderr().c_str());
      return 1;
    }
    const std::string got = Checksum(w.client->params());
    std::smatch lm;
    const std::string err = shard->Stderr();
    if (std::regex_search(err, lm, std::regex("from \\S+ in ([0-9.]+) s"))) load.push_back(std::stod(lm[1]));
    std::printf("restart %d: serving %.3f s after the restart (checksum %s, %s)\n", r + 1, took,
                got.c_str(), got == expected ? "same as before the kill" : "DIFFERENT");
    if (got != expected) return 1;
    recovery.push_back(took);
  }
  std::printf("recovery of a shard holding %zu floats after kill -9, median of %d: %.3f s "
              "(of which loading the checkpoint %.3f s)\n",
              floats, restarts, Median(recovery), Median(load));
  std::printf("baseline, the first start of the same shard without a checkpoint (to initialised): "
              "%.3f s; ratio %.2fx\n",
              first_start, Median(recovery) / first_start);
  monitor->Signal(SIGTERM);
  shard->Signal(SIGTERM);
  shard->Wait(std::chrono::seconds(10));
  monitor->Wait(std::chrono::seconds(10));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t floats = 10'000'000;
  int restarts = 3;
  std::string dir;
  CLI::App app{"pacer-recovery-bench: checkpoint throughput and shard recovery time"};
  app.add_option("--floats", floats, "Parameters the shard holds")->capture_default_str();
  app.add_option("--restarts", restarts, "kill -9 and restart this many times")->capture_default_str();
  app.add_option("--dir", dir, "Scratch directory (default: a new one under /tmp)");
  CLI11_PARSE(app, argc, argv);
  if (dir.empty()) {
    char tmpl[] = "/tmp/pacer-recovery-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    dir = tmpl;
  }
  std::filesystem::create_directories(dir);
  CheckpointThroughput(floats, dir, 3);
  const int rc = Recovery(floats, restarts, dir);
  std::filesystem::remove_all(dir);
  return rc;
}
