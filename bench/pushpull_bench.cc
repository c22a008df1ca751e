// Push+pull against a real pacer-server over loopback TCP, against a raw
// ZeroMQ DEALER/ROUTER echo doing the same two round trips with the same
// bytes, measured in the same run.
//
//   pacer-pushpull-bench [--sizes 1024,65536,1048576,16777216] [--seconds S]
//                        [--optimizers sgd,adam] [--reps N] [--curve]
//   pacer-pushpull-bench --aggregate [--sizes ...] [--window S] [--reps N] [--curve]
//   pacer-pushpull-bench --replicas [--sizes 1048576] [--seconds S] [--reps N]
//
// For each size it starts, as child processes, a pacer-monitor (ASP, one
// shard, one worker) and a pacer-server, applying updates once per
// optimizer of --optimizers (pacer-monitor --optimizer) and once with
// --no-apply (transport only), once with no checks (--no-crc), plus a raw
// echo server (this binary with --raw-echo). With --reps N every case runs N
// times, interleaved. It prints one table row per size as Markdown.
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "ps/base/cli.h"
#include "ps/client.h"
#include "ps/base/rpc.h"
#include "ps/base/security.h"
#include "tests/process_util.h"

namespace {

using pacer::test::Process;
using Clock = std::chrono::steady_clock;

// --curve: every process of every case runs under CURVE with keys made for
// the run (the raw echo's server takes its key file with --raw-key).
struct Curve {
  std::string dir;                          // key files: NAME.key, allowed
  std::map<std::string, pacer::CurveKeyPair> keys;  // monitor, shard, worker
  bool on() const { return !keys.empty(); }
  std::string Key(const std::string& name) const { return dir + "/" + name + ".key"; }
  std::vector<std::string> Flags(const std::string& name) const {
    if (!on()) return {};
    return {"--key", Key(name), "--allowed-keys", dir + "/allowed"};
  }
};

bool MakeCurve(const std::string& dir, Curve* curve) {
  curve->dir = dir;
  std::ofstream allowed(dir + "/allowed");
  for (const char* name : {"monitor", "shard", "worker"}) {
    auto k = pacer::GenerateKeyPair();
    if (!k.ok() || !pacer::WriteKeyFiles(*k, dir + "/" + name, name).ok()) {
      std::fprintf(stderr, "cannot make CURVE keys: %s\n",
                   k.ok() ? "writing them failed" : std::string(k.status().message()).c_str());
      return false;
    }
    curve->keys[name] = *k;
    allowed << name << " " << k->public_key << "\n";
  }
  return static_cast<bool>(allowed);
}

// The raw baseline server: a ROUTER that answers a push (N floats in) with a
// small ack and a pull (small request) with N floats from a reused buffer.
// With `key_file`, under CURVE as the server (any client key: no ZAP).
int RawEchoServer(size_t floats, const std::string& key_file) {
  pacer::TuneAllocatorForLargeBuffers();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  if (!key_file.empty()) {
    auto keys = pacer::ReadKeyFile(key_file);
    if (!keys.ok()) {
      std::fprintf(stderr, "%s\n", std::string(keys.status().message()).c_str());
      return 1;
    }
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, keys->secret_key);
  }
  s.bind("tcp://127.0.0.1:*");
  std::printf("listening %s\n", s.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  std::vector<float> values(floats, 1.0f);
  char ack[40] = {};
  for (;;) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(s, std::back_inserter(parts))) continue;
    if (parts.size() < 2) continue;
    if (parts[1].size() == 4 && std::memcmp(parts[1].data(), "quit", 4) == 0) return 0;
    s.send(parts[0], zmq::send_flags::sndmore);
    if (parts.size() >= 4) {  // push (id, envelope, header, payload): an envelope-sized ack
      s.send(zmq::const_buffer(ack, sizeof(ack)), zmq::send_flags::none);
    } else {  // pull: the values, zero-copy from the reused buffer
      zmq::message_t m(values.data(), values.size() * sizeof(float), nullptr, nullptr);
      s.send(m, zmq::send_flags::none);
    }
  }
}

struct Row {
  std::string name;
  double seconds_per_op;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Iterations(size_t floats, double budget_s, bool curve) {
  // Rough cost per op from the reference figures, to bound the run time
  // (CURVE: about 5x slower per byte).
  double est = 250e-6 + floats * 4 / (curve ? 0.25e9 : 1.2e9);
  return std::clamp(static_cast<int>(budget_s / est), 5, 5000);
}

// A raw client's DEALER to a raw echo server at `addr` (under CURVE with
// the run's keys); a lost server fails the case after 30 s, never hangs it.
zmq::socket_t RawClient(zmq::context_t& ctx, const std::string& addr, const Curve& curve) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 30000);
  if (curve.on()) {
    s.set(zmq::sockopt::curve_serverkey, curve.keys.at("shard").public_key);
    s.set(zmq::sockopt::curve_publickey, curve.keys.at("worker").public_key);
    s.set(zmq::sockopt::curve_secretkey, curve.keys.at("worker").secret_key);
  }
  s.connect(addr);
  return s;
}

// The raw protocol's messages, the sizes of Pacer's: a push is an
// envelope, a header and the payload (zero-copy from the caller's buffer);
// a pull is an envelope and a header.
const char kRawHeader[64] = {};
void SendRawPush(zmq::socket_t& s, const float* values, size_t floats) {
  s.send(zmq::const_buffer(kRawHeader, 40), zmq::send_flags::sndmore);
  s.send(zmq::const_buffer(kRawHeader, 48), zmq::send_flags::sndmore);
  zmq::message_t payload(const_cast<float*>(values), floats * sizeof(float), nullptr, nullptr);
  s.send(payload, zmq::send_flags::none);
}
void SendRawPull(zmq::socket_t& s) {
  s.send(zmq::const_buffer(kRawHeader, 40), zmq::send_flags::sndmore);
  s.send(zmq::const_buffer(kRawHeader, 48), zmq::send_flags::none);
}

double RawRun(const std::string& self, size_t floats, double budget_s, const std::string& dir,
              const Curve& curve) {
  // A log name of its own per run: a reused one could still hold the last
  // run's "listening" line when it is read.
  static int run = 0;
  std::vector<std::string> args = {self, "--raw-echo", std::to_string(floats)};
  if (curve.on()) {
    args.push_back("--raw-key");
    args.push_back(curve.Key("shard"));
  }
  auto server = Process::Start(args, dir, "raw" + std::to_string(floats) + "-" + std::to_string(++run));
  auto addr = server->WaitForLine("listening ", std::chrono::seconds(10));
  if (!addr) return -1;
  zmq::context_t ctx(1);
  zmq::socket_t s = RawClient(ctx, *addr, curve);
  std::vector<float> grads(floats, 0.5f), params(floats);
  const int iters = Iterations(floats, budget_s, curve.on());
  std::vector<double> samples;
  for (int i = -2; i < iters; ++i) {
    auto t0 = Clock::now();
    SendRawPush(s, grads.data(), floats);
    zmq::message_t ack;
    if (!s.recv(ack)) return -1;
    SendRawPull(s);  // the values come into a reused buffer
    zmq::message_t reply;
    if (!s.recv(reply)) return -1;
    std::memcpy(params.data(), reply.data(), std::min(reply.size(), floats * sizeof(float)));
    if (i >= 0) samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  s.send(zmq::const_buffer("quit", 4), zmq::send_flags::none);
  server->Wait(std::chrono::seconds(5));
  return Median(samples);
}

// --io-threads, which reaches every process of a case through
// PACER_IO_THREADS (0: the default, one per two cores, at most 4).
int BenchIoThreads() {
  const char* v = std::getenv("PACER_IO_THREADS");
  return v != nullptr ? std::atoi(v) : 0;
}

// A worker of a running job: registered with the monitor at `maddr`, its
// model (`keys`) declared, the shard map taken and the parameters sent
// (Init; the first worker's win).
struct Worker {
  std::unique_ptr<pacer::Transport> transport;
  std::unique_ptr<pacer::RpcChannel> monitor;
  std::unique_ptr<pacer::PsClient> client;  // destroyed before the transport
  ~Worker() {
    client.reset();
    monitor.reset();
  }
};

bool ConnectWorker(const std::string& maddr, std::vector<pacer::wire::KeyLen> keys, bool crc,
                   const Curve& curve, Worker* w, bool want_backups = false) {
  pacer::TransportOptions topts;
  topts.io_threads = BenchIoThreads();
  if (curve.on()) {
    topts.curve.keys = curve.keys.at("worker");
    for (const auto& [name, k] : curve.keys) topts.curve.allowed.push_back(k.public_key);
  }
  w->transport = pacer::MakeZmqTransport(topts);
  auto& transport = w->transport;
  if (curve.on()) transport->SetServerKey(maddr, curve.keys.at("monitor").public_key);
  pacer::RpcOptions boot;
  boot.check_job = false;
  auto ch = pacer::RpcChannel::Connect(transport.get(), maddr, boot);
  if (!ch.ok()) return false;
  auto deadline = [&] { return transport->clock()->Now() + std::chrono::seconds(10); };
  flatbuffers::FlatBufferBuilder fbb;
  auto reg = (*ch)->Call(fbb, pacer::wire::CreateRegisterDirect(fbb, pacer::wire::Role::Worker, ""),
                         deadline());
  if (!reg.ok()) return false;
  uint32_t id = reg->As<pacer::wire::RegisterReply>()->id();
  (*ch)->options().job_id = 7;
  (*ch)->options().sender = id;
  (*ch)->options().check_job = true;
  flatbuffers::FlatBufferBuilder f2;
  if (!(*ch)->Call(f2, pacer::wire::CreateDeclareModel(f2, f2.CreateVectorOfStructs(keys), 0), deadline()).ok()) {
    return false;
  }
  pacer::ShardMapInfo map;
  // --replicas: until every range of the map has its backup.
  const auto ready = [&] {
    if (map.shards.empty()) return false;
    if (!want_backups) return true;
    return std::all_of(map.shards.begin(), map.shards.end(),
                       [](const pacer::ShardEntry& e) { return !e.backups.empty(); });
  };
  for (int i = 0; i < 1000 && !ready(); ++i) {  // up to 20 s: all workers
    flatbuffers::FlatBufferBuilder f3;
    auto hb = (*ch)->Call(f3, pacer::wire::CreateHeartbeat(f3, pacer::wire::Role::Worker, 0, 0, false),
                          deadline());
    if (hb.ok() && hb->As<pacer::wire::HeartbeatReply>()->shard_map()) {
      map = pacer::ShardMapFromWire(hb->As<pacer::wire::HeartbeatReply>()->shard_map());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  pacer::ClientOptions copts;
  copts.rpc.job_id = 7;
  copts.rpc.sender = id;
  copts.rpc.check_crc = crc;
  auto client = pacer::PsClient::Create(transport.get(), copts, map, keys);
  if (!client.ok() || !(*client)->Init().ok()) return false;
  w->client = std::move(*client);
  w->monitor = std::move(*ch);
  return true;
}

double PacerRun(size_t floats, bool apply, bool crc, double budget_s, const std::string& dir,
                const Curve& curve, const std::string& optimizer = "sgd") {
  static int run = 0;
  const std::string tag = std::to_string(++run);
  std::vector<std::string> margs = {PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--mode",
                                    "asp", "--job-id", "7", "--log-level", "warn", "--lease", "60",
                                    "--optimizer", optimizer};
  for (const std::string& f : curve.Flags("monitor")) margs.push_back(f);
  auto monitor = Process::Start(margs, dir, "monitor" + tag);
  auto maddr = monitor->WaitForLine("listening ", std::chrono::seconds(10));
  if (!maddr) return -1;
  std::vector<std::string> sargs = {PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0",
                                    "--monitor", *maddr, "--log-level", "warn"};
  if (!apply) sargs.push_back("--no-apply");
  if (!crc) sargs.push_back("--no-crc");
  for (const std::string& f : curve.Flags("shard")) sargs.push_back(f);
  auto shard = Process::Start(sargs, dir, "shard" + tag);
  if (!shard->WaitForLine("listening ", std::chrono::seconds(10))) return -1;

  Worker worker;
  if (!ConnectWorker(*maddr, {pacer::wire::KeyLen(0, floats)}, crc, curve, &worker)) return -1;
  pacer::PsClient* client = worker.client.get();
  std::fill(client->grads().begin(), client->grads().end(), 1e-6f);
  const int iters = Iterations(floats, budget_s, curve.on());
  std::vector<double> samples;
  for (int i = -2; i < iters; ++i) {
    auto t0 = Clock::now();
    if (!client->Push(static_cast<uint64_t>(i + 2), 1).ok()) return -1;
    if (!client->Pull(static_cast<uint64_t>(i + 3)).ok()) return -1;
    if (i >= 0) samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  monitor->Signal(SIGTERM);
  shard->Signal(SIGTERM);
  monitor->Wait(std::chrono::seconds(5));
  shard->Wait(std::chrono::seconds(5));
  return Median(samples);
}

// --replicas: push+pull in BSP against 2 shards, the model cut in two keys
// across them, with pacer-monitor --replicas R (1: each shard also backs up
// the other's range; every step goes to the backup as a record, and the
// worker keeps each push until it is durable). The median seconds; in
// `push_s` the median of the push alone (the push's replies; the rest is
// the pull).
double ReplicaRun(size_t floats, int replicas, double budget_s, const std::string& dir,
                  double* push_s) {
  static int run = 0;
  const std::string tag = "r" + std::to_string(replicas) + "-" + std::to_string(++run);
  std::vector<std::string> margs = {PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--mode",
                                    "bsp", "--job-id", "7", "--log-level", "warn", "--lease", "60",
                                    "--optimizer", "sgd", "--min-shards", "2", "--replicas",
                                    std::to_string(replicas), "--shard-lease", "1"};
  auto monitor = Process::Start(margs, dir, "monitor-" + tag);
  auto maddr = monitor->WaitForLine("listening ", std::chrono::seconds(10));
  if (!maddr) return -1;
  std::vector<std::unique_ptr<Process>> shards;
  for (int i = 0; i < 2; ++i) {
    shards.push_back(Process::Start({PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0", "--monitor",
                                     *maddr, "--log-level", "warn"},
                                    dir, "shard" + std::to_string(i) + "-" + tag));
    if (!shards.back()->WaitForLine("listening ", std::chrono::seconds(10))) return -1;
  }
  Worker worker;
  if (!ConnectWorker(*maddr, {pacer::wire::KeyLen(0, floats / 2), pacer::wire::KeyLen(1, floats - floats / 2)},
                     true, Curve{}, &worker, replicas > 0)) {
    return -1;
  }
  pacer::PsClient* client = worker.client.get();
  std::fill(client->grads().begin(), client->grads().end(), 1e-6f);
  const int iters = Iterations(floats, budget_s, false);
  std::vector<double> samples, pushes;
  for (int i = -2; i < iters; ++i) {
    const uint64_t clock = static_cast<uint64_t>(i + 2);
    auto t0 = Clock::now();
    if (!client->Push(clock, 1).ok()) return -1;
    auto t1 = Clock::now();
    if (!client->Pull(clock + 1).ok()) return -1;  // waits for the step of `clock`
    if (i >= 0) {
      samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      pushes.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
  }
  *push_s = Median(pushes);
  if (replicas > 0 && client->held_pushes() > 2) {
    std::fprintf(stderr, "%s: %zu pushes still not durable at the end\n", tag.c_str(),
                 client->held_pushes());
  }
  monitor->Signal(SIGTERM);
  for (auto& sh : shards) sh->Signal(SIGTERM);
  monitor->Wait(std::chrono::seconds(5));
  for (auto& sh : shards) sh->Wait(std::chrono::seconds(10));
  return Median(samples);
}

// --aggregate: one model of N floats, cut in two keys across 2 shards, pushed
// and pulled by 3 worker processes at once; the raw baseline runs the same
// way (2 raw echo servers of N/2 floats, 3 client processes pushing and
// pulling both halves at once). Each worker counts the push+pulls it
// completes from a shared start time (CLOCK_MONOTONIC is the machine's)
// until `window` has passed, and prints "ops N seconds T".
int agg_workers = 3;  // --workers

std::vector<pacer::wire::KeyLen> AggKeys(size_t floats) {
  return {pacer::wire::KeyLen(0, floats / 2), pacer::wire::KeyLen(1, floats - floats / 2)};
}

Clock::time_point FromNs(int64_t ns) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

// Runs `op` from the start time until `window_s` has passed; prints the count
// and the time from this worker's start to the end of its last op.
template <class Op>
int CountOps(int64_t start_ns, double window_s, Op op) {
  std::this_thread::sleep_until(FromNs(start_ns));
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  int ops = 0;
  auto last = t0;
  while (last < end) {
    if (!op()) {
      std::fprintf(stderr, "worker: push+pull failed\n");
      return 1;
    }
    ++ops;
    last = Clock::now();
  }
  std::printf("ops %d seconds %.6f\n", ops, std::chrono::duration<double>(last - t0).count());
  std::fflush(stdout);
  return 0;
}

int AggPacerWorker(const std::string& maddr, size_t floats, int64_t start_ns, double window_s,
                   bool crc, const Curve& curve) {
  Worker w;
  if (!ConnectWorker(maddr, AggKeys(floats), crc, curve, &w)) {
    std::fprintf(stderr, "worker: could not join the job at %s\n", maddr.c_str());
    return 1;
  }
  std::fill(w.client->grads().begin(), w.client->grads().end(), 1e-6f);
  uint64_t clock = 0;
  return CountOps(start_ns, window_s, [&] {
    ++clock;
    return w.client->Push(clock, 1).ok() && w.client->Pull(clock + 1).ok();
  });
}

int AggRawWorker(const std::vector<std::string>& addrs, size_t floats, int64_t start_ns,
                 double window_s, const Curve& curve) {
  pacer::TransportOptions io;
  io.io_threads = BenchIoThreads();
  zmq::context_t ctx(pacer::IoThreads(io));
  std::vector<zmq::socket_t> socks;
  const size_t half[2] = {floats / 2, floats - floats / 2};
  for (const std::string& a : addrs) socks.push_back(RawClient(ctx, a, curve));
  std::vector<float> grads(floats, 0.5f), params(floats);
  return CountOps(start_ns, window_s, [&] {
    // Both pushes out, then both acks; both pulls out, then both replies.
    for (size_t i = 0; i < 2; ++i) SendRawPush(socks[i], grads.data() + i * half[0], half[i]);
    for (size_t i = 0; i < 2; ++i) {
      zmq::message_t ack;
      if (!socks[i].recv(ack)) return false;
    }
    for (size_t i = 0; i < 2; ++i) SendRawPull(socks[i]);
    for (size_t i = 0; i < 2; ++i) {
      zmq::message_t reply;
      if (!socks[i].recv(reply)) return false;
      std::memcpy(params.data() + i * half[0], reply.data(),
                  std::min(reply.size(), half[i] * sizeof(float)));
    }
    return true;
  });
}

// One aggregate case: MB/s (pushed + pulled) of each worker; empty on a
// failure (the reason is on stderr).
std::vector<double> AggregateRun(const std::string& self, size_t floats, bool raw, bool apply,
                                 double window_s, const std::string& dir, const Curve& curve) {
  static int run = 0;
  const std::string tag = "agg" + std::to_string(++run);
  std::vector<std::unique_ptr<Process>> servers;
  std::vector<std::string> worker_args = {self, "--floats", std::to_string(floats), "--window",
                                          std::to_string(window_s)};
  if (curve.on()) {
    worker_args.push_back("--curve-dir");
    worker_args.push_back(curve.dir);
  }
  if (raw) {
    std::string addrs;
    for (size_t i = 0; i < 2; ++i) {
      std::vector<std::string> args = {self, "--raw-echo",
                                       std::to_string(i == 0 ? floats / 2 : floats - floats / 2)};
      if (curve.on()) {
        args.push_back("--raw-key");
        args.push_back(curve.Key("shard"));
      }
      servers.push_back(Process::Start(args, dir, tag + "-raw" + std::to_string(i)));
      auto addr = servers.back()->WaitForLine("listening ", std::chrono::seconds(10));
      if (!addr) return {};
      addrs += (i ? "," : "") + *addr;
    }
    worker_args.push_back("--agg-raw");
    worker_args.push_back(addrs);
  } else {
    std::vector<std::string> margs = {PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--mode",
                                      "asp", "--job-id", "7", "--log-level", "warn", "--lease", "60",
                                      "--optimizer", "sgd", "--min-shards", "2", "--min-workers",
                                      std::to_string(agg_workers)};
    for (const std::string& f : curve.Flags("monitor")) margs.push_back(f);
    servers.push_back(Process::Start(margs, dir, tag + "-monitor"));
    auto maddr = servers.back()->WaitForLine("listening ", std::chrono::seconds(10));
    if (!maddr) return {};
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> sargs = {PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0", "--monitor",
                                        *maddr, "--log-level", "warn"};
      if (!apply) sargs.push_back("--no-apply");
      for (const std::string& f : curve.Flags("shard")) sargs.push_back(f);
      servers.push_back(Process::Start(sargs, dir, tag + "-shard" + std::to_string(i)));
      if (!servers.back()->WaitForLine("listening ", std::chrono::seconds(10))) return {};
    }
    worker_args.push_back("--agg-pacer");
    worker_args.push_back(*maddr);
  }
  // Time for 3 processes to start, join and take the shard map.
  const int64_t start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               (Clock::now() + std::chrono::seconds(raw ? 2 : 6)).time_since_epoch())
                               .count();
  worker_args.push_back("--start-ns");
  worker_args.push_back(std::to_string(start_ns));
  std::vector<std::unique_ptr<Process>> workers;
  for (int i = 0; i < agg_workers; ++i) {
    workers.push_back(Process::Start(worker_args, dir, tag + "-worker" + std::to_string(i)));
  }
  std::vector<double> mbps;
  const auto wait = std::chrono::seconds(static_cast<int>(window_s) + 60);
  for (auto& w : workers) {
    auto line = w->WaitForLine("ops ", wait);
    if (!line) {
      std::fprintf(stderr, "%s: a worker reported nothing (logs in %s)\n", tag.c_str(), dir.c_str());
      return {};
    }
    int ops = 0;
    double seconds = 0;
    if (std::sscanf(line->c_str(), "%d seconds %lf", &ops, &seconds) != 2 || seconds <= 0) return {};
    mbps.push_back(ops * 2.0 * static_cast<double>(floats) * sizeof(float) / seconds / 1e6);
  }
  for (auto& w : workers) w->Wait(std::chrono::seconds(10));
  for (auto& p : servers) p->Signal(SIGTERM);
  for (auto& p : servers) p->Wait(std::chrono::seconds(10));
  return mbps;
}

// The --aggregate table: per size, the raw echo, Pacer transport-only and
// Pacer + apply (SGD), each the median MB/s per worker over every worker of
// every rep, with the range of all of them.
void AggregateTable(const std::string& self, const std::vector<size_t>& floats_list, int reps,
                    double window_s, const std::string& dir, const Curve& curve) {
  // mbps[size][case]: raw, transport-only, + apply; ratio[size][case]: each
  // rep's median against the raw median of the same rep.
  std::vector<std::vector<std::vector<double>>> mbps(floats_list.size(),
                                                     std::vector<std::vector<double>>(3));
  std::vector<std::vector<std::vector<double>>> ratio = mbps;
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t s = 0; s < floats_list.size(); ++s) {
      double raw_median = 0;
      for (int c = 0; c < 3; ++c) {
        std::vector<double> got =
            AggregateRun(self, floats_list[s], c == 0, c == 2, window_s, dir, curve);
        if (got.empty()) continue;
        mbps[s][c].insert(mbps[s][c].end(), got.begin(), got.end());
        if (c == 0) raw_median = Median(got);
        if (c > 0 && raw_median > 0) ratio[s][c].push_back(Median(got) / raw_median);
      }
    }
    if (reps > 1) std::fprintf(stderr, "aggregate rep %d of %d done\n", rep + 1, reps);
  }
  std::printf("%d worker(s), 2 shards%s; MB/s per worker (pushed + pulled), median of every worker "
              "of every rep (range)\n\n",
              agg_workers, curve.on() ? ", all under CURVE" : "");
  std::printf("| floats | raw ZeroMQ%s | Pacer transport-only | ratio | Pacer + apply (sgd) | ratio |\n"
              "|---:|---:|---:|---:|---:|---:|\n",
              curve.on() ? " CURVE" : "");
  auto cell = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("failed");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.0f (%.0f–%.0f)", Median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  auto rcell = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("–");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.2f× (%.2f–%.2f)", Median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  for (size_t s = 0; s < floats_list.size(); ++s) {
    std::printf("| %zu | %s | %s | %s | %s | %s |\n", floats_list[s], cell(mbps[s][0]).c_str(),
                cell(mbps[s][1]).c_str(), rcell(ratio[s][1]).c_str(), cell(mbps[s][2]).c_str(),
                rcell(ratio[s][2]).c_str());
  }
  std::fflush(stdout);
}

std::string Human(double s) {
  char buf[32];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.0f µs", s * 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f ms", s * 1e3);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "1024,65536,1048576,16777216";
  double budget = 3.0;
  size_t raw_echo = 0;
  CLI::App app{"Push+pull against pacer-server vs a raw ZeroMQ echo", "pacer-pushpull-bench"};
  app.add_option("--sizes", sizes, "Tensor sizes in floats, comma-separated")->capture_default_str();
  app.add_option("--seconds", budget, "Rough time budget per case")->capture_default_str();
  std::string optimizers = "sgd,adam";
  app.add_option("--optimizers", optimizers,
                 "The optimizers of the '+ apply' columns (pacer-monitor --optimizer), "
                 "comma-separated")
      ->capture_default_str();
  int reps = 1;
  app.add_option("--reps", reps,
                 "Runs of every case, interleaved (each rep runs every case of every size "
                 "in turn); medians, and the range of the reps' ratios")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bool use_curve = false;
  app.add_flag("--curve", use_curve,
               "Every case under CURVE (keys made for the run): Pacer with --key and "
               "--allowed-keys, against a raw ZeroMQ CURVE echo");
  app.add_option("--raw-echo", raw_echo, "Internal: run the raw echo server for N floats");
  std::string raw_key;
  app.add_option("--raw-key", raw_key, "Internal: the raw echo server's CURVE key file");
  bool aggregate = false;
  bool replicas_mode = false;
  app.add_flag("--replicas", replicas_mode,
               "Push+pull in BSP against 2 shards with pacer-monitor --replicas 0 and 1 in "
               "turn (--reps times), their medians and ratio");
  app.add_flag("--aggregate", aggregate,
               "Instead: 2 shards and 3 worker processes push and pull one model cut across "
               "the shards, against 2 raw echo servers and 3 clients run the same way; MB/s "
               "per worker");
  int io_threads = -1;
  app.add_option("--io-threads", io_threads,
                 "ZeroMQ I/O threads of every process of every case (PACER_IO_THREADS; "
                 "default: each process's own default)")
      ->check(CLI::Range(0, 64));
  app.add_option("--workers", agg_workers, "--aggregate: worker processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  double window = 10;
  app.add_option("--window", window, "--aggregate: seconds each worker pushes and pulls")
      ->capture_default_str();
  // Internal: one worker process of --aggregate.
  std::string agg_pacer, agg_raw, curve_dir;
  size_t agg_floats = 0;
  int64_t start_ns = 0;
  app.add_option("--agg-pacer", agg_pacer, "Internal: an aggregate worker of the job at ADDR");
  app.add_option("--agg-raw", agg_raw, "Internal: an aggregate raw client of ADDR,ADDR");
  app.add_option("--floats", agg_floats, "Internal: the aggregate model's floats");
  app.add_option("--start-ns", start_ns, "Internal: the aggregate start (steady clock, ns)");
  app.add_option("--curve-dir", curve_dir, "Internal: the run's CURVE key files");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  if (io_threads >= 0) setenv("PACER_IO_THREADS", std::to_string(io_threads).c_str(), 1);
  if (raw_echo > 0) return RawEchoServer(raw_echo, raw_key);
  if (!agg_pacer.empty() || !agg_raw.empty()) {
    Curve curve;
    if (!curve_dir.empty()) {
      curve.dir = curve_dir;
      for (const char* name : {"monitor", "shard", "worker"}) {
        auto k = pacer::ReadKeyFile(curve.Key(name));
        if (!k.ok()) {
          std::fprintf(stderr, "%s\n", std::string(k.status().message()).c_str());
          return 1;
        }
        curve.keys[name] = *k;
      }
    }
    if (!agg_pacer.empty()) return AggPacerWorker(agg_pacer, agg_floats, start_ns, window, true, curve);
    const size_t comma = agg_raw.find(',');
    return AggRawWorker({agg_raw.substr(0, comma), agg_raw.substr(comma + 1)}, agg_floats, start_ns,
                        window, curve);
  }
  pacer::TuneAllocatorForLargeBuffers();

  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  pacer::test::TempDir dir;
  Curve curve;
  if (use_curve) {
    if (!pacer::CurveAvailable()) {
      std::fprintf(stderr, "--curve: this libzmq has no CURVE\n");
      return 1;
    }
    if (!MakeCurve(dir.path(), &curve)) return 1;
  }

  std::vector<std::string> kinds;
  {
    std::stringstream os(optimizers);
    for (std::string k; std::getline(os, k, ',');) kinds.push_back(k);
  }
  std::vector<size_t> floats_list;
  {
    std::stringstream ss(sizes);
    for (std::string item; std::getline(ss, item, ',');) floats_list.push_back(std::stoull(item));
  }
  if (aggregate) {
    AggregateTable(self, floats_list, reps, window, dir.path(), curve);
    return 0;
  }
  if (replicas_mode) {
    // Reps alternate --replicas 0 and 1 so that the machine's slow spells
    // hit both alike; the ratio of each rep against its own baseline.
    std::printf("| floats | replicas 0 (median) | replicas 1 (median) | ratio (median) | ratio range |\n");
    std::printf("|---|---|---|---|---|\n");
    for (size_t floats : floats_list) {
      std::vector<double> r0, r1, ratios;
      for (int rep = 0; rep < reps; ++rep) {
        double push0 = 0, push1 = 0;
        r0.push_back(ReplicaRun(floats, 0, budget, dir.path(), &push0));
        r1.push_back(ReplicaRun(floats, 1, budget, dir.path(), &push1));
        if (r0.back() <= 0 || r1.back() <= 0) {
          std::fprintf(stderr, "a run failed (logs in %s)\n", dir.path().c_str());
          return 1;
        }
        ratios.push_back(r1.back() / r0.back());
        // The push (to its replies) and the rest (the pull) apart: where
        // the replicas' extra time falls.
        std::fprintf(stderr,
                     "floats %zu rep %d: replicas 0 %s (push %s), replicas 1 %s (push %s), "
                     "ratio %.2f\n",
                     floats, rep + 1, Human(r0.back()).c_str(), Human(push0).c_str(),
                     Human(r1.back()).c_str(), Human(push1).c_str(), ratios.back());
      }
      std::printf("| %zu | %s | %s | %.2f | %.2f-%.2f |\n", floats, Human(Median(r0)).c_str(),
                  Human(Median(r1)).c_str(), Median(ratios),
                  *std::min_element(ratios.begin(), ratios.end()),
                  *std::max_element(ratios.begin(), ratios.end()));
    }
    return 0;
  }
  // Cases per size: raw, transport-only, one per optimizer, no checks.
  const size_t cases = 3 + kinds.size();
  // seconds[size][case][rep]: every rep runs every case of every size, in
  // turn, so that the machine's slow spells hit all cases alike.
  std::vector<std::vector<std::vector<double>>> seconds(
      floats_list.size(), std::vector<std::vector<double>>(cases));
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t s = 0; s < floats_list.size(); ++s) {
      const size_t floats = floats_list[s];
      auto& row = seconds[s];
      row[0].push_back(RawRun(self, floats, budget, dir.path(), curve));
      row[1].push_back(PacerRun(floats, /*apply=*/false, /*crc=*/true, budget, dir.path(), curve));
      for (size_t k = 0; k < kinds.size(); ++k) {
        row[2 + k].push_back(
            PacerRun(floats, /*apply=*/true, /*crc=*/true, budget, dir.path(), curve, kinds[k]));
      }
      row[cases - 1].push_back(
          PacerRun(floats, /*apply=*/false, /*crc=*/false, budget, dir.path(), curve));
    }
    if (reps > 1) std::fprintf(stderr, "rep %d of %d done\n", rep + 1, reps);
  }
  // Each cell: the median over the reps; with several reps the range of the
  // reps' ratios (each against the raw echo of its own rep) follows.
  if (curve.on()) std::printf("All cases under CURVE.\n\n");
  std::printf("| floats | raw ZeroMQ%s push+pull | Pacer transport-only | ratio |",
              curve.on() ? " CURVE" : "");
  for (const std::string& k : kinds) std::printf(" Pacer + apply (%s) | ratio |", k.c_str());
  std::printf(" transport-only, no checks | ratio |\n|---:|---:|---:|---:|");
  for (size_t i = 0; i < kinds.size(); ++i) std::printf("---:|---:|");
  std::printf("---:|---:|\n");
  for (size_t s = 0; s < floats_list.size(); ++s) {
    const auto& row = seconds[s];
    std::printf("| %zu | %s |", floats_list[s], Human(Median(row[0])).c_str());
    for (size_t c = 1; c < cases; ++c) {
      std::vector<double> ratios;
      bool failed = false;
      for (int r = 0; r < reps; ++r) {
        failed = failed || row[c][r] <= 0 || row[0][r] <= 0;
        ratios.push_back(row[0][r] / row[c][r]);
      }
      if (failed) {
        std::printf(" failed | |");
        continue;
      }
      std::printf(" %s | %.2f×", Human(Median(row[c])).c_str(), Median(ratios));
      if (reps > 1) {
        std::printf(" (%.2f–%.2f)", *std::min_element(ratios.begin(), ratios.end()),
                    *std::max_element(ratios.begin(), ratios.end()));
      }
      std::printf(" |");
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  return 0;
}
