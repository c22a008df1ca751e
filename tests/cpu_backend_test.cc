#include "worker/builtin/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/builtin/backend.h"
#include "worker/builtin/mnist.h"
#include "tests/grad_sink_check.h"

namespace pacer::worker {
namespace {

std::unique_ptr<ComputeBackend> MustMake(const std::vector<int>& layers) {
  MlpSpec spec;
  spec.layers = layers;
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(spec);
  EXPECT_NE(backend, nullptr);
  return backend;
}

// Independent double-precision forward pass over the documented layout
// (fcK.weight out x in row-major, then fcK.bias), returning the mean
// softmax cross-entropy loss.
double ReferenceLoss(const std::vector<int>& layers,
                     const std::vector<double>& p, const std::vector<float>& x,
                     const std::vector<uint8_t>& y) {
  const size_t batch = y.size();
  double total = 0;
  for (size_t s = 0; s < batch; ++s) {
    std::vector<double> a(x.begin() + s * layers[0],
                          x.begin() + (s + 1) * layers[0]);
    size_t offset = 0;
    for (size_t k = 1; k < layers.size(); ++k) {
      const size_t in = layers[k - 1], out = layers[k];
      std::vector<double> z(out);
      for (size_t o = 0; o < out; ++o) {
        double acc = p[offset + out * in + o];  // Bias.
        for (size_t i = 0; i < in; ++i) acc += p[offset + o * in + i] * a[i];
        z[o] = (k + 1 < layers.size()) ? std::max(acc, 0.0) : acc;
      }
      offset += out * in + out;
      a = std::move(z);
    }
    const double m = *std::max_element(a.begin(), a.end());
    double sum = 0;
    for (double v : a) sum += std::exp(v - m);
    total += m + std::log(sum) - a[y[s]];
  }
  return total / static_cast<double>(batch);
}

// Checks the backend's gradient against central differences of
// ReferenceLoss at `coords_per_tensor` random coordinates of every tensor (all
// of them when the tensor is smaller).
void CheckGradient(const std::vector<int>& layers, int batch,
                   size_t coords_per_tensor, uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::unique_ptr<ComputeBackend> backend = MustMake(layers);
  ASSERT_NE(backend, nullptr);
  std::mt19937_64 rng(seed);
  // Random everything (biases too, so their gradients flow through ReLUs that
  // are on and off).
  std::uniform_real_distribution<float> uniform(-0.7f, 0.7f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(backend->num_params());
  for (float& v : params) v = uniform(rng);
  std::vector<float> x(size_t(batch) * layers[0]);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> y(batch);
  for (uint8_t& v : y) v = static_cast<uint8_t>(rng() % layers.back());

  std::vector<float> grad(backend->num_params(), 0.0f);
  const float loss =
      backend->ComputeGradient(params, x.data(), y.data(), batch, grad);

  std::vector<double> p(params.begin(), params.end());
  const double ref_loss = ReferenceLoss(layers, p, x, y);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::max(1.0, ref_loss));

  constexpr double kStep = 1e-5;
  size_t offset = 0, checked = 0, nonzero = 0;
  for (const TensorSpec& t : backend->tensors()) {
    std::vector<size_t> coords(t.size);
    std::iota(coords.begin(), coords.end(), offset);
    std::shuffle(coords.begin(), coords.end(), rng);
    coords.resize(std::min(coords.size(), coords_per_tensor));
    size_t tensor_nonzero = 0;
    for (size_t i : coords) {
      const double saved = p[i];
      p[i] = saved + kStep;
      const double up = ReferenceLoss(layers, p, x, y);
      p[i] = saved - kStep;
      const double down = ReferenceLoss(layers, p, x, y);
      p[i] = saved;
      const double fd = (up - down) / (2 * kStep);
      const double g = grad[i];
      EXPECT_LE(std::abs(g - fd),
                1e-2 * std::max({std::abs(g), std::abs(fd), 1e-3}))
          << t.name << " element " << i - offset << ": backend " << g
          << " vs finite difference " << fd;
      ++checked;
      if (std::abs(fd) > 1e-3) ++tensor_nonzero;
    }
    // A tensor whose sampled gradients are all ~0 would make the check vacuous.
    EXPECT_GT(tensor_nonzero, 0u) << t.name;
    nonzero += tensor_nonzero;
    offset += t.size;
  }
  EXPECT_EQ(offset, backend->num_params());
  EXPECT_GE(checked, 30u);
  EXPECT_GE(nonzero, checked / 2);
}

TEST(CpuBackendTest, GradientMatchesFiniteDifferencesTiny) {
  // 74 parameters: every coordinate is checked.
  CheckGradient({6, 5, 4, 3}, /*batch=*/4, /*coords_per_tensor=*/1000,
                20240601);
}

TEST(CpuBackendTest, GradientMatchesFiniteDifferencesWider) {
  // Big enough that Eigen takes its GEMM (BLAS) path, not the small-product
  // one.
  CheckGradient({40, 32, 24, 10}, /*batch=*/16, /*coords_per_tensor=*/8, 77);
}

TEST(CpuBackendTest, GradientIsBatchMeanAndOverwritesOutput) {
  std::unique_ptr<ComputeBackend> backend = MustMake({6, 5, 4, 3});
  std::vector<float> params(backend->num_params());
  backend->InitParams(3, params);
  const std::vector<float> one = {0.1f, -0.4f, 0.9f, 0.3f, -0.2f, 0.5f};
  std::vector<float> two = one;
  two.insert(two.end(), one.begin(), one.end());
  const std::vector<uint8_t> y = {2, 2};

  std::vector<float> g1(backend->num_params(), 123.0f);
  std::vector<float> g2(backend->num_params(), -7.0f);
  const float l1 =
      backend->ComputeGradient(params, one.data(), y.data(), 1, g1);
  const float l2 =
      backend->ComputeGradient(params, two.data(), y.data(), 2, g2);
  EXPECT_NEAR(l1, l2, 1e-6);
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_NEAR(g1[i], g2[i], 1e-6 + 1e-5 * std::abs(g1[i])) << i;
  }
  // Calling again (scratch now warm and larger than needed) gives the same.
  std::vector<float> g3(backend->num_params(), 99.0f);
  EXPECT_EQ(backend->ComputeGradient(params, one.data(), y.data(), 1, g3), l1);
  EXPECT_EQ(g3, g1);
}

TEST(CpuBackendTest, EachLayerIsReportedOnceItsGradientIsFinal) {
  MlpSpec spec;
  spec.layers = {20, 16, 12, 5};
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(spec);
  ASSERT_NE(backend, nullptr);
  std::vector<float> params(backend->num_params()), grad(params.size());
  backend->InitParams(4, params);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(9 * 20);
  for (float& v : x) v = u(rng);
  std::vector<uint8_t> y(9);
  for (auto& v : y) v = static_cast<uint8_t>(rng() % 5);
  CheckGradientStages(*backend, params, x.data(), y.data(), 9, grad);
}

TEST(CpuBackendTest, InstancesOnSeparateThreadsAgreeWithSequential) {
  constexpr int kBatch = 64, kThreads = 2, kCalls = 10;
  const MlpSpec spec;
  std::unique_ptr<ComputeBackend> reference = MakeCpuBackend(spec);
  ASSERT_NE(reference, nullptr);
  std::vector<float> params(reference->num_params());
  reference->InitParams(11, params);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(size_t(kThreads) * kBatch * 784);
  for (float& v : x) v = pixel(rng);
  std::vector<uint8_t> y(size_t(kThreads) * kBatch);
  for (uint8_t& v : y) v = static_cast<uint8_t>(rng() % 10);

  std::vector<std::vector<float>> want(kThreads,
                                       std::vector<float>(params.size()));
  for (int t = 0; t < kThreads; ++t) {
    reference->ComputeGradient(params, x.data() + t * kBatch * 784,
                               y.data() + t * kBatch, kBatch, want[t]);
  }
  std::vector<std::vector<float>> got(kThreads,
                                      std::vector<float>(params.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(spec);
      for (int i = 0; i < kCalls; ++i) {
        backend->ComputeGradient(params, x.data() + t * kBatch * 784,
                                 y.data() + t * kBatch, kBatch, got[t]);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], want[t]) << t;
}

TEST(CpuBackendTest, BadArgumentsGiveNaNNotCrash) {
  std::unique_ptr<ComputeBackend> backend = MustMake({6, 5, 4, 3});
  std::vector<float> params(backend->num_params(), 0.1f);
  std::vector<float> grad(backend->num_params());
  std::vector<float> x(12, 0.5f);
  std::vector<uint8_t> y = {0, 1};
  std::vector<uint8_t> bad_y = {0, 3};
  EXPECT_FALSE(std::isnan(
      backend->ComputeGradient(params, x.data(), y.data(), 2, grad)));
  EXPECT_TRUE(std::isnan(
      backend->ComputeGradient(params, x.data(), y.data(), 0, grad)));
  EXPECT_TRUE(std::isnan(
      backend->ComputeGradient(params, x.data(), bad_y.data(), 2, grad)));
  EXPECT_TRUE(std::isnan(backend->ComputeGradient(
      std::span<const float>(params).first(10), x.data(), y.data(), 2, grad)));
  EXPECT_TRUE(std::isnan(backend->ComputeGradient(
      params, x.data(), y.data(), 2, std::span<float>(grad).first(10))));
  EXPECT_TRUE(
      std::isnan(backend->ComputeGradient(params, nullptr, y.data(), 2, grad)));

  EvalResult bad = backend->Evaluate(params, x.data(), bad_y.data(), 2);
  EXPECT_TRUE(std::isnan(bad.accuracy));
  EXPECT_TRUE(std::isnan(bad.loss));
  EXPECT_EQ(bad.samples, 0u);
  EvalResult empty = backend->Evaluate(params, nullptr, nullptr, 0);
  EXPECT_EQ(empty.samples, 0u);
  EXPECT_EQ(empty.accuracy, 0.0);

  std::vector<float> short_params(10, 1.0f);
  backend->InitParams(1, short_params);
  for (float v : short_params) EXPECT_TRUE(std::isnan(v));
}

TEST(CpuBackendTest, RejectsInvalidSpecs) {
  for (const std::vector<int>& layers :
       std::vector<std::vector<int>>{{}, {784}, {784, 0, 10}, {784, -3, 10}}) {
    MlpSpec spec;
    spec.layers = layers;
    EXPECT_EQ(MakeCpuBackend(spec), nullptr) << layers.size();
  }
}

TEST(CpuBackendTest, DefaultSpecTensorTable) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(MlpSpec{});
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cpu");
  const std::vector<TensorSpec>& t = backend->tensors();
  ASSERT_EQ(t.size(), 6u);
  const std::vector<std::pair<std::string, size_t>> want = {
      {"fc1.weight", 256 * 784}, {"fc1.bias", 256},
      {"fc2.weight", 128 * 256}, {"fc2.bias", 128},
      {"fc3.weight", 10 * 128},  {"fc3.bias", 10}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(t[i].name, want[i].first);
    EXPECT_EQ(t[i].size, want[i].second);
  }
  EXPECT_EQ(backend->num_params(), 235146u);
}

// splitmix64, as the init is specified in backend.h / cpu_backend.cc.
uint64_t SplitMix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

TEST(CpuBackendTest, InitIsDeterministicPerSeed) {
  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(MlpSpec{});
  ASSERT_NE(backend, nullptr);
  const size_t n = backend->num_params();
  std::vector<float> a(n), b(n, 5.0f), c(n);
  backend->InitParams(42, a);
  backend->InitParams(42, b);
  backend->InitParams(43, c);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);

  // A fresh instance gives the same bytes too: no hidden state.
  std::vector<float> d(n);
  MakeCpuBackend(MlpSpec{})->InitParams(42, d);
  EXPECT_EQ(std::memcmp(a.data(), d.data(), n * sizeof(float)), 0);

  // The stream is pinned: element 0 and the first fc2.weight element.
  auto expected = [](uint64_t seed, size_t i, int fan_in) {
    const double u =
        static_cast<double>(SplitMix64(seed, i) >> 40) * 0x1p-23 - 1.0;
    return static_cast<float>(u * std::sqrt(6.0 / fan_in));
  };
  EXPECT_EQ(a[0], expected(42, 0, 784));
  EXPECT_EQ(a[256 * 784 + 256], expected(42, 256 * 784 + 256, 256));

  size_t offset = 0, differ = 0, weights = 0;
  for (size_t k = 0; k < backend->tensors().size(); ++k) {
    const TensorSpec& t = backend->tensors()[k];
    std::span<const float> ta(a.data() + offset, t.size);
    if (k % 2 == 1) {  // Bias.
      for (float v : ta) EXPECT_EQ(v, 0.0f) << t.name;
    } else {
      const int fan_in = MlpSpec{}.layers[k / 2];
      const double bound = std::sqrt(6.0 / fan_in);
      double sum = 0, sum_sq = 0;
      for (size_t i = 0; i < t.size; ++i) {
        ASSERT_LE(std::abs(ta[i]), bound) << t.name;
        sum += ta[i];
        sum_sq += double(ta[i]) * ta[i];
        differ += a[offset + i] != c[offset + i] ? 1 : 0;
      }
      weights += t.size;
      const double mean = sum / t.size, var = sum_sq / t.size - mean * mean;
      EXPECT_NEAR(mean, 0.0, 0.05 * bound) << t.name;
      EXPECT_NEAR(var, bound * bound / 3, 0.1 * bound * bound / 3) << t.name;
    }
    offset += t.size;
  }
  EXPECT_GT(differ, weights * 99 / 100);
}

TEST(CpuBackendTest, EvaluateOnKnownLogits) {
  // A single linear layer with identity weights: logits = x + bias.
  std::unique_ptr<ComputeBackend> backend = MustMake({3, 3});
  const std::vector<float> bias = {0.5f, -0.25f, 0.0f};
  std::vector<float> params = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  params.insert(params.end(), bias.begin(), bias.end());

  // Hand case: argmaxes 0, 1, 2, 2 against labels 0, 1, 0, 1 -> 2 of 4.
  const std::vector<float> x = {2, 0, 0, 0, 3, 0, 0, 0, 1, -1, -1, 4};
  const std::vector<uint8_t> y = {0, 1, 0, 1};
  EvalResult r = backend->Evaluate(params, x.data(), y.data(), 4);
  EXPECT_EQ(r.samples, 4u);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.5);
  double want_loss = 0;
  for (size_t s = 0; s < 4; ++s) {
    double z[3], sum = 0;
    for (int j = 0; j < 3; ++j) sum += std::exp(z[j] = x[3 * s + j] + bias[j]);
    want_loss += std::log(sum) - z[y[s]];
  }
  EXPECT_NEAR(r.loss, want_loss / 4, 1e-6);

  // Many chunks (n > the 1000-sample chunk, not a multiple of it).
  constexpr size_t kN = 2503;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> big_x(kN * 3);
  std::vector<uint8_t> big_y(kN);
  size_t correct = 0;
  want_loss = 0;
  for (size_t s = 0; s < kN; ++s) {
    double z[3], sum = 0;
    for (int j = 0; j < 3; ++j) {
      big_x[3 * s + j] = normal(rng);
      z[j] = double(big_x[3 * s + j] + bias[j]);
      sum += std::exp(z[j]);
    }
    big_y[s] = static_cast<uint8_t>(rng() % 3);
    correct += (std::max_element(z, z + 3) - z) == big_y[s] ? 1 : 0;
    want_loss += std::log(sum) - z[big_y[s]];
  }
  r = backend->Evaluate(params, big_x.data(), big_y.data(), kN);
  EXPECT_EQ(r.samples, kN);
  EXPECT_DOUBLE_EQ(r.accuracy, double(correct) / kN);
  EXPECT_NEAR(r.loss, want_loss / kN, 1e-5);
}

TEST(CpuBackendTest, SgdLearnsFashionMnist) {
  absl::StatusOr<Dataset> train =
      LoadFashionMnist(kDefaultFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  absl::StatusOr<Dataset> test =
      LoadFashionMnist(kDefaultFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  constexpr size_t kTrain = 5000, kTest = 2000;
  constexpr int kBatch = 64, kSteps = 300;
  constexpr float kLr = 0.1f;
  constexpr uint64_t kSeed = 1;
  SCOPED_TRACE("seed=" + std::to_string(kSeed));

  std::unique_ptr<ComputeBackend> backend = MakeCpuBackend(MlpSpec{});
  ASSERT_NE(backend, nullptr);
  const size_t in = train->features();
  std::vector<float> params(backend->num_params()), grad(backend->num_params());
  backend->InitParams(kSeed, params);
  const std::vector<float> initial = params;
  const EvalResult before = backend->Evaluate(params, test->images.data(),
                                              test->labels.data(), kTest);
  EXPECT_LT(before.accuracy, 0.3);

  std::mt19937_64 rng(kSeed);
  std::vector<size_t> order(kTrain);
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> bx(kBatch * in);
  std::vector<uint8_t> by(kBatch);
  size_t cursor = kTrain;
  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      if (cursor == kTrain) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      const size_t s = order[cursor++];
      std::copy_n(train->images.begin() + s * in, in, bx.begin() + b * in);
      by[b] = train->labels[s];
    }
    const float loss =
        backend->ComputeGradient(params, bx.data(), by.data(), kBatch, grad);
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    if (step == 0) first_loss = loss;
    last_loss = loss;
    for (size_t i = 0; i < params.size(); ++i) params[i] -= kLr * grad[i];
  }
  const EvalResult after = backend->Evaluate(params, test->images.data(),
                                             test->labels.data(), kTest);
  std::printf(
      "test accuracy %.4f -> %.4f, test loss %.4f -> %.4f, batch loss %.4f -> "
      "%.4f\n",
      before.accuracy, after.accuracy, before.loss, after.loss, first_loss,
      last_loss);
  // Calibration (this seed and 5 others, seeds 1..6): correct backprop gives
  // 0.78-0.83 (0.829 for seed 1); training only fc3 (hidden layers get no
  // gradient) gives 0.69-0.73, fc2+fc3 only 0.76-0.78. 0.75 rejects the
  // former; the per-tensor movement check below and the finite-difference
  // tests catch the latter.
  EXPECT_GE(after.accuracy, 0.75);
  EXPECT_LT(after.loss, 0.75 * before.loss);
  EXPECT_EQ(after.samples, kTest);

  // Every weight tensor must have learned, not just the output layer.
  size_t offset = 0;
  for (const TensorSpec& t : backend->tensors()) {
    double moved = 0, norm = 0;
    for (size_t i = offset; i < offset + t.size; ++i) {
      moved += double(params[i] - initial[i]) * (params[i] - initial[i]);
      norm += double(initial[i]) * initial[i];
    }
    if (t.name.ends_with(".weight")) {
      EXPECT_GT(std::sqrt(moved / norm), 0.01) << t.name;
    } else {
      EXPECT_GT(moved, 0.0) << t.name;
    }
    offset += t.size;
  }
}

}  // namespace
}  // namespace pacer::worker
