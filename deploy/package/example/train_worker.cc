// Joins a running Pacer job as one more training worker, from your own
// program: pacer::worker::Worker registers with the monitor, trains on the
// data partitions the monitor assigns, and calls your hooks. Replace the
// hooks' bodies with your own bookkeeping (logging, early stopping, ...).
//
//   train_worker tcp://MONITOR:PORT
#include <cstdio>
#include <span>

#include "ps/base/transport.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s tcp://MONITOR:PORT\n", argv[0]);
    return 2;
  }
  pacer::worker::WorkerOptions options;
  options.monitor = argv[1];
  options.on_push_acked = [](uint64_t seq, uint64_t clock, std::span<const uint32_t> samples) {
    if (clock % 100 == 0) {
      std::printf("clock %lu: push %lu acknowledged (%zu samples)\n",
                  static_cast<unsigned long>(clock), static_cast<unsigned long>(seq),
                  samples.size());
    }
  };
  auto transport = pacer::MakeZmqTransport(pacer::TransportOptions{});
  pacer::worker::Worker worker(transport.get(), options);
  auto result = worker.Run();
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf("rank %u trained %lu samples in %lu clocks (%s)\n", result->rank,
              static_cast<unsigned long>(result->samples),
              static_cast<unsigned long>(result->clocks), result->stop_reason.c_str());
  return 0;
}
