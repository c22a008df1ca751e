// The shard's optimizer apply bandwidth against memcpy of the same bytes.
//   pacer-optimizer-bench [--benchmark_filter=...]
// Bytes counted per element: apply reads w, v, g and writes w, v (20 bytes);
// accumulate reads acc, g and writes acc (12); memcpy reads and writes (8).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "ps/optimizer.h"

namespace {

void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 8));
}

void BM_SgdMomentumApply(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> w(n, 1.0f), v(n, 0.0f), g(n, 1e-6f);
  pacer::SgdOptions opts;
  for (auto _ : state) {
    pacer::SgdMomentumStep(w, v, g, opts, 0.5f);
    benchmark::DoNotOptimize(w.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 20));
}

void BM_Accumulate(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> acc(n, 0.0f), g(n, 1e-6f);
  for (auto _ : state) {
    pacer::Accumulate(acc, g, 0.25f);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 12));
}

BENCHMARK(BM_Memcpy)->Arg(1 << 10)->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24);
BENCHMARK(BM_SgdMomentumApply)->Arg(1 << 10)->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24);
BENCHMARK(BM_Accumulate)->Arg(1 << 10)->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24);

}  // namespace

BENCHMARK_MAIN();
