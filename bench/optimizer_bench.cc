// The shard's optimizer apply bandwidth against memcpy of the same bytes.
//   pacer-optimizer-bench [--benchmark_filter=...]
// Each step runs through the shard's table (ps/table.h) on one key of N
// floats, in place, as a synchronous step does with nobody holding the
// buffers. Bytes counted per element: memcpy reads and writes (8); SGD with
// momentum reads w, v, g and writes w, v (20); Adam and AdamW read w, m, v,
// g and write w, m, v (28), with amsgrad also max v (36); Adagrad reads w,
// sum, g and writes w, sum (20); accumulate reads acc, g and writes acc (12).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "ps/optimizer.h"
#include "ps/table.h"

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

// One table step per iteration with `kind` (and its settings tweaked by
// `tweak`), counting `bytes_per_float`.
template <class Tweak>
void TableStep(benchmark::State& state, pacer::OptimizerKind kind, int bytes_per_float,
               Tweak tweak) {
  const size_t n = static_cast<size_t>(state.range(0));
  pacer::TableConfig config;
  config.kind = kind;
  config.defaults = pacer::DefaultSettings(kind);
  tweak(config.defaults);
  pacer::ParamTable table(config);
  const pacer::TableKey key{0, static_cast<uint32_t>(n), pacer::kDefaultGroup, 0};
  if (!table.Declare({&key, 1}).ok()) {
    state.SkipWithError("declare failed");
    return;
  }
  std::vector<float> g(n, 1e-3f);
  pacer::StepRecord step;
  step.grad = {{}, g, /*at_offsets=*/true};
  step.grad_scale = 0.5f;
  step.lr = {config.defaults.lr};
  for (auto _ : state) {
    table.Step(step);
    benchmark::DoNotOptimize(table.Param(0).data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * bytes_per_float));
}

void Keep(pacer::OptimizerSettings&) {}

void BM_SgdMomentumApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kSgd, 20, Keep);
}
void BM_SgdNesterovWeightDecayApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kSgd, 20, [](pacer::OptimizerSettings& s) {
    s.nesterov = true;
    s.weight_decay = 1e-4f;
  });
}
void BM_AdamApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kAdam, 28, Keep);
}
void BM_AdamWApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kAdamW, 28, Keep);
}
void BM_AdamAmsgradApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kAdam, 36,
            [](pacer::OptimizerSettings& s) { s.amsgrad = true; });
}
void BM_AdagradApply(benchmark::State& state) {
  TableStep(state, pacer::OptimizerKind::kAdagrad, 20, Keep);
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

#define PACER_SIZES ->Arg(1 << 10)->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24)
BENCHMARK(BM_Memcpy) PACER_SIZES;
BENCHMARK(BM_SgdMomentumApply) PACER_SIZES;
BENCHMARK(BM_SgdNesterovWeightDecayApply) PACER_SIZES;
BENCHMARK(BM_AdamApply) PACER_SIZES;
BENCHMARK(BM_AdamWApply) PACER_SIZES;
BENCHMARK(BM_AdamAmsgradApply) PACER_SIZES;
BENCHMARK(BM_AdagradApply) PACER_SIZES;
BENCHMARK(BM_Accumulate) PACER_SIZES;

}  // namespace

BENCHMARK_MAIN();
