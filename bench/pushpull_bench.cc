// Push+pull against a real pacer-server over loopback TCP, against a raw
// ZeroMQ DEALER/ROUTER echo doing the same two round trips with the same
// bytes, measured in the same run.
//
//   pacer-pushpull-bench [--sizes 1024,65536,1048576,16777216] [--seconds S]
//                        [--optimizers sgd,adam] [--reps N]
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
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "ps/base/cli.h"
#include "ps/client.h"
#include "ps/base/rpc.h"
#include "tests/process_util.h"

namespace {

using pacer::test::Process;
using Clock = std::chrono::steady_clock;

// The raw baseline server: a ROUTER that answers a push (N floats in) with a
// small ack and a pull (small request) with N floats from a reused buffer.
int RawEchoServer(size_t floats) {
  pacer::TuneAllocatorForLargeBuffers();
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
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

int Iterations(size_t floats, double budget_s) {
  // Rough cost per op from the reference figures, to bound the run time.
  double est = 250e-6 + floats * 4 / 1.2e9;
  return std::clamp(static_cast<int>(budget_s / est), 5, 5000);
}

double RawRun(const std::string& self, size_t floats, double budget_s, const std::string& dir) {
  // A log name of its own per run: a reused one could still hold the last
  // run's "listening" line when it is read.
  static int run = 0;
  auto server = Process::Start({self, "--raw-echo", std::to_string(floats)}, dir,
                               "raw" + std::to_string(floats) + "-" + std::to_string(++run));
  auto addr = server->WaitForLine("listening ", std::chrono::seconds(10));
  if (!addr) return -1;
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 30000);  // a lost server fails the case, never hangs the bench
  s.connect(*addr);
  std::vector<float> grads(floats, 0.5f), params(floats);
  char header[64] = {};
  const int iters = Iterations(floats, budget_s);
  std::vector<double> samples;
  for (int i = -2; i < iters; ++i) {
    auto t0 = Clock::now();
    // push: envelope + header + payload (zero-copy from a reused buffer)
    s.send(zmq::const_buffer(header, 40), zmq::send_flags::sndmore);
    s.send(zmq::const_buffer(header, 48), zmq::send_flags::sndmore);
    zmq::message_t payload(grads.data(), floats * sizeof(float), nullptr, nullptr);
    s.send(payload, zmq::send_flags::none);
    zmq::message_t ack;
    if (!s.recv(ack)) return -1;
    // pull: envelope + header, then the values into a reused buffer
    s.send(zmq::const_buffer(header, 40), zmq::send_flags::sndmore);
    s.send(zmq::const_buffer(header, 48), zmq::send_flags::none);  // 2 parts: pull
    zmq::message_t reply;
    if (!s.recv(reply)) return -1;
    std::memcpy(params.data(), reply.data(), std::min(reply.size(), floats * sizeof(float)));
    if (i >= 0) samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  s.send(zmq::const_buffer("quit", 4), zmq::send_flags::none);
  server->Wait(std::chrono::seconds(5));
  return Median(samples);
}

double PacerRun(size_t floats, bool apply, bool crc, double budget_s, const std::string& dir,
                const std::string& optimizer = "sgd") {
  static int run = 0;
  const std::string tag = std::to_string(++run);
  auto monitor = Process::Start({PACER_MONITOR_BIN, "--listen", "tcp://127.0.0.1:0", "--mode", "asp",
                                 "--job-id", "7", "--log-level", "warn", "--lease", "60",
                                 "--optimizer", optimizer},
                                dir, "monitor" + tag);
  auto maddr = monitor->WaitForLine("listening ", std::chrono::seconds(10));
  if (!maddr) return -1;
  std::vector<std::string> sargs = {PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0",
                                    "--monitor", *maddr, "--log-level", "warn"};
  if (!apply) sargs.push_back("--no-apply");
  if (!crc) sargs.push_back("--no-crc");
  auto shard = Process::Start(sargs, dir, "shard" + tag);
  if (!shard->WaitForLine("listening ", std::chrono::seconds(10))) return -1;

  pacer::TransportOptions topts;
  auto transport = pacer::MakeZmqTransport(topts);
  pacer::RpcOptions boot;
  boot.check_job = false;
  auto ch = pacer::RpcChannel::Connect(transport.get(), *maddr, boot);
  auto deadline = [&] { return transport->clock()->Now() + std::chrono::seconds(10); };
  flatbuffers::FlatBufferBuilder fbb;
  auto reg = (*ch)->Call(fbb, pacer::wire::CreateRegisterDirect(fbb, pacer::wire::Role::Worker, ""),
                         deadline());
  if (!reg.ok()) return -1;
  uint32_t id = reg->As<pacer::wire::RegisterReply>()->id();
  (*ch)->options().job_id = 7;
  (*ch)->options().sender = id;
  (*ch)->options().check_job = true;
  std::vector<pacer::wire::KeyLen> keys = {pacer::wire::KeyLen(0, floats)};
  flatbuffers::FlatBufferBuilder f2;
  if (!(*ch)->Call(f2, pacer::wire::CreateDeclareModel(f2, f2.CreateVectorOfStructs(keys), 0), deadline()).ok()) {
    return -1;
  }
  pacer::ShardMapInfo map;
  for (int i = 0; i < 200 && map.shards.empty(); ++i) {
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
  if (!client.ok() || !(*client)->Init().ok()) return -1;
  std::fill((*client)->grads().begin(), (*client)->grads().end(), 1e-6f);
  const int iters = Iterations(floats, budget_s);
  std::vector<double> samples;
  for (int i = -2; i < iters; ++i) {
    auto t0 = Clock::now();
    if (!(*client)->Push(static_cast<uint64_t>(i + 2), 1).ok()) return -1;
    if (!(*client)->Pull(static_cast<uint64_t>(i + 3)).ok()) return -1;
    if (i >= 0) samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  monitor->Signal(SIGTERM);
  shard->Signal(SIGTERM);
  monitor->Wait(std::chrono::seconds(5));
  shard->Wait(std::chrono::seconds(5));
  return Median(samples);
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
  app.add_option("--raw-echo", raw_echo, "Internal: run the raw echo server for N floats");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  if (raw_echo > 0) return RawEchoServer(raw_echo);
  pacer::TuneAllocatorForLargeBuffers();

  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  pacer::test::TempDir dir;

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
      row[0].push_back(RawRun(self, floats, budget, dir.path()));
      row[1].push_back(PacerRun(floats, /*apply=*/false, /*crc=*/true, budget, dir.path()));
      for (size_t k = 0; k < kinds.size(); ++k) {
        row[2 + k].push_back(PacerRun(floats, /*apply=*/true, /*crc=*/true, budget, dir.path(), kinds[k]));
      }
      row[cases - 1].push_back(PacerRun(floats, /*apply=*/false, /*crc=*/false, budget, dir.path()));
    }
    if (reps > 1) std::fprintf(stderr, "rep %d of %d done\n", rep + 1, reps);
  }
  // Each cell: the median over the reps; with several reps the range of the
  // reps' ratios (each against the raw echo of its own rep) follows.
  std::printf("| floats | raw ZeroMQ push+pull | Pacer transport-only | ratio |");
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
