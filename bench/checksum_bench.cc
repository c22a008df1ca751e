// Payload-check candidates (issue 22) against memcpy of the same bytes.
//   pacer-checksum-bench [--benchmark_filter=...] [--benchmark_repetitions=5]
// Sizes are a push of 1K, 1M and 16M floats (4 KiB, 4 MiB, 64 MiB). Every
// figure counts payload bytes, so the columns compare directly: a check at
// the memcpy figure costs what one copy of the payload costs.
//   memcpy            the copy the worker makes of every pull reply anyway
//   read              a plain summing read: the memory's read bandwidth
//   zlib_crc32        zlib 1.2.13 crc32() (protocol 1 and 2's check, before ISA-L)
//   isal_crc32_gzip   ISA-L crc32_gzip_refl: the same CRC-32 (protocol 2)
//   isal_crc32c       ISA-L crc32_iscsi: CRC32C
//   isal_crc32_gzip_by8  the same CRC-32 with 128-bit PCLMUL only: what ISA-L
//                     runs on a CPU without VPCLMULQDQ (AVX2 machines)
//   isal_crc32_gzip_base  ISA-L's table code: a CPU without PCLMUL
//   isal_crc32c_sse42 ISA-L crc32_iscsi_01: CRC32C with the SSE4.2 crc32
//                     instruction over three interleaved streams
//   xxh3              libxxhash XXH3_64bits (Debian's build: SSE2 only)
//   xxh3_dispatch     libxxhash XXH3_64bits_dispatch (AVX2/AVX-512 at run time)
//   xxh3_avx2, xxh3_sse2, xxh3_scalar  XXH3 compiled for that instruction set
//                     (bench/checksum_bench_isa.cc)
//   blocks_*          the payload cut into blocks of `range(1)` bytes with one
//                     XXH3 (dispatched) per block, as protocol 3 checks it
//   copy_blocks_*     the same, each block checked and then copied while it is
//                     in cache: the worker's checked copy of a pull reply
//   *_2threads        the blocks split over this thread and one helper
#include <benchmark/benchmark.h>
#include <isa-l/crc.h>
#include <xxh_x86dispatch.h>
#include <xxhash.h>
#include <zlib.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

// ISA-L's per-instruction-set kernels (exported by libisal, not declared in
// its headers; the public functions dispatch to them).
extern "C" uint32_t crc32_gzip_refl_by8(uint32_t crc, const unsigned char* buf, uint64_t len);
extern "C" unsigned int crc32_iscsi_01(unsigned char* buf, int len, unsigned int crc);
// bench/checksum_bench_isa.cc
uint64_t Xxh3_avx2(const void* data, size_t size);
uint64_t Xxh3_sse2(const void* data, size_t size);
uint64_t Xxh3_scalar(const void* data, size_t size);

namespace {

constexpr int64_t kSizes[] = {4 << 10, 4 << 20, 64 << 20};

std::vector<uint8_t> Buffer(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  return b;
}

template <class F>
void Run(benchmark::State& state, F f) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> a = Buffer(n);
  for (auto _ : state) {
    benchmark::DoNotOptimize(f(a.data(), n));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}

void BM_memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> a = Buffer(n), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}

void BM_read(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) {
    const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
      s0 += w[i];
      s1 += w[i + 1];
      s2 += w[i + 2];
      s3 += w[i + 3];
    }
    return s0 ^ s1 ^ s2 ^ s3;
  });
}

void BM_zlib_crc32(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return crc32(0, p, static_cast<uInt>(n)); });
}
void BM_isal_crc32_gzip(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return crc32_gzip_refl(0, p, n); });
}
void BM_isal_crc32c(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return crc32_iscsi(const_cast<uint8_t*>(p), static_cast<int>(n), 0); });
}
void BM_isal_crc32_gzip_by8(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return crc32_gzip_refl_by8(0, p, n); });
}
void BM_isal_crc32_gzip_base(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return crc32_gzip_refl_base(0, const_cast<uint8_t*>(p), n); });
}
void BM_isal_crc32c_sse42(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) {
    return crc32_iscsi_01(const_cast<uint8_t*>(p), static_cast<int>(n), 0);
  });
}
void BM_xxh3_avx2(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return Xxh3_avx2(p, n); });
}
void BM_xxh3_sse2(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return Xxh3_sse2(p, n); });
}
void BM_xxh3_scalar(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return Xxh3_scalar(p, n); });
}
void BM_xxh3(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return XXH3_64bits(p, n); });
}
void BM_xxh3_dispatch(benchmark::State& state) {
  Run(state, [](const uint8_t* p, size_t n) { return XXH3_64bits_dispatch(p, n); });
}

// Per-block checks into `out`, blocks [first, last).
void HashBlocks(const uint8_t* p, size_t n, size_t block, size_t first, size_t last, uint64_t* out) {
  for (size_t b = first; b < last; ++b) {
    const size_t off = b * block;
    out[b] = XXH3_64bits_dispatch(p + off, std::min(block, n - off));
  }
}
void CopyBlocks(uint8_t* dst, const uint8_t* p, size_t n, size_t block, size_t first, size_t last,
                uint64_t* out) {
  for (size_t b = first; b < last; ++b) {
    const size_t off = b * block, len = std::min(block, n - off);
    out[b] = XXH3_64bits_dispatch(p + off, len);
    std::memcpy(dst + off, p + off, len);
  }
}

void BM_blocks(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)), block = static_cast<size_t>(state.range(1));
  std::vector<uint8_t> a = Buffer(n);
  std::vector<uint64_t> sums((n + block - 1) / block);
  for (auto _ : state) {
    HashBlocks(a.data(), n, block, 0, sums.size(), sums.data());
    benchmark::DoNotOptimize(XXH3_64bits_dispatch(sums.data(), sums.size() * 8));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}

void BM_copy_blocks(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)), block = static_cast<size_t>(state.range(1));
  std::vector<uint8_t> a = Buffer(n), d(n);
  std::vector<uint64_t> sums((n + block - 1) / block);
  for (auto _ : state) {
    CopyBlocks(d.data(), a.data(), n, block, 0, sums.size(), sums.data());
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}

// One helper thread, spinning on a generation counter: the handoff a
// persistent pool would make, without a thread start per call.
class Helper {
 public:
  template <class F>
  explicit Helper(F f) : thread_([this, f] {
      uint64_t seen = 0;
      for (;;) {
        uint64_t g;
        while ((g = go_.load(std::memory_order_acquire)) == seen) std::this_thread::yield();
        if (g == ~uint64_t{0}) return;
        seen = g;
        f();
        done_.store(g, std::memory_order_release);
      }
    }) {}
  ~Helper() {
    go_.store(~uint64_t{0}, std::memory_order_release);
    thread_.join();
  }
  void Start() { go_.store(++gen_, std::memory_order_release); }
  void Wait() {
    while (done_.load(std::memory_order_acquire) != gen_) std::this_thread::yield();
  }

 private:
  std::atomic<uint64_t> go_{0}, done_{0};
  uint64_t gen_ = 0;
  std::thread thread_;
};

template <bool kCopy>
void TwoThreads(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)), block = static_cast<size_t>(state.range(1));
  std::vector<uint8_t> a = Buffer(n), d(n);
  std::vector<uint64_t> sums((n + block - 1) / block);
  const size_t half = sums.size() / 2;
  auto work = [&](size_t first, size_t last) {
    if (kCopy) {
      CopyBlocks(d.data(), a.data(), n, block, first, last, sums.data());
    } else {
      HashBlocks(a.data(), n, block, first, last, sums.data());
    }
  };
  Helper helper([&] { work(half, sums.size()); });
  for (auto _ : state) {
    helper.Start();
    work(0, half);
    helper.Wait();
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}
void BM_blocks_2threads(benchmark::State& state) { TwoThreads<false>(state); }
void BM_copy_blocks_2threads(benchmark::State& state) { TwoThreads<true>(state); }

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : kSizes) b->Arg(n);
}
void BlockSizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : kSizes) {
    for (int64_t block : {64 << 10, 256 << 10, 1 << 20}) b->Args({n, block});
  }
}

BENCHMARK(BM_memcpy)->Apply(Sizes);
BENCHMARK(BM_read)->Apply(Sizes);
BENCHMARK(BM_zlib_crc32)->Apply(Sizes);
BENCHMARK(BM_isal_crc32_gzip)->Apply(Sizes);
BENCHMARK(BM_isal_crc32c)->Apply(Sizes);
BENCHMARK(BM_isal_crc32_gzip_by8)->Apply(Sizes);
BENCHMARK(BM_isal_crc32_gzip_base)->Apply(Sizes);
BENCHMARK(BM_isal_crc32c_sse42)->Apply(Sizes);
BENCHMARK(BM_xxh3_avx2)->Apply(Sizes);
BENCHMARK(BM_xxh3_sse2)->Apply(Sizes);
BENCHMARK(BM_xxh3_scalar)->Apply(Sizes);
BENCHMARK(BM_xxh3)->Apply(Sizes);
BENCHMARK(BM_xxh3_dispatch)->Apply(Sizes);
BENCHMARK(BM_blocks)->Apply(BlockSizes);
BENCHMARK(BM_copy_blocks)->Apply(BlockSizes);
BENCHMARK(BM_blocks_2threads)->Apply(BlockSizes)->UseRealTime();
BENCHMARK(BM_copy_blocks_2threads)->Apply(BlockSizes)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
