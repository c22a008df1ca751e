// The CPU CNN (worker/builtin/cpu_cnn.cc) against an independent double-precision
// reference written from the layout documented in worker/builtin/backend.h: loss and
// gradient (central differences), batches larger than its 64-sample chunk,
// the tensor table and init, and that SGD on it learns Fashion-MNIST.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "worker/builtin/backend.h"
#include "worker/builtin/cpu_backend.h"
#include "worker/builtin/mnist.h"
#include "tests/grad_sink_check.h"

namespace pacer::worker {
namespace {

constexpr int kSide = 28;

// Mean softmax cross-entropy of the CNN with parameters `p`, computed
// naively (no im2col, channel-major, double).
double ReferenceLoss(const CnnSpec& c, const std::vector<double>& p, const std::vector<float>& x,
                     const std::vector<uint8_t>& y) {
  const int c1 = c.conv1, c2 = c.conv2, classes = c.classes;
  const size_t w1 = 0, b1 = w1 + c1 * 25, w2 = b1 + c1, b2 = w2 + size_t(c2) * c1 * 25,
               wf = b2 + c2, flat = size_t(c2) * 49, bf = wf + classes * flat;
  double total = 0;
  for (size_t s = 0; s < y.size(); ++s) {
    auto img = [&](int r, int q) {
      return (r < 0 || r >= kSide || q < 0 || q >= kSide) ? 0.0 : double(x[s * 784 + r * kSide + q]);
    };
    std::vector<double> o1(size_t(c1) * 28 * 28), p1(size_t(c1) * 14 * 14);
    for (int o = 0; o < c1; ++o) {
      for (int r = 0; r < 28; ++r) {
        for (int q = 0; q < 28; ++q) {
          double acc = p[b1 + o];
          for (int ky = 0; ky < 5; ++ky) {
            for (int kx = 0; kx < 5; ++kx) acc += p[w1 + o * 25 + ky * 5 + kx] * img(r + ky - 2, q + kx - 2);
          }
          o1[(o * 28 + r) * 28 + q] = std::max(acc, 0.0);
        }
      }
      for (int r = 0; r < 14; ++r) {
        for (int q = 0; q < 14; ++q) {
          double m = o1[(o * 28 + 2 * r) * 28 + 2 * q];
          for (int d = 1; d < 4; ++d) m = std::max(m, o1[(o * 28 + 2 * r + d / 2) * 28 + 2 * q + d % 2]);
          p1[(o * 14 + r) * 14 + q] = m;
        }
      }
    }
    std::vector<double> f(flat);
    for (int o = 0; o < c2; ++o) {
      std::vector<double> o2(14 * 14);
      for (int r = 0; r < 14; ++r) {
        for (int q = 0; q < 14; ++q) {
          double acc = p[b2 + o];
          for (int i = 0; i < c1; ++i) {
            for (int ky = 0; ky < 5; ++ky) {
              const int rr = r + ky - 2;
              if (rr < 0 || rr >= 14) continue;
              for (int kx = 0; kx < 5; ++kx) {
                const int qq = q + kx - 2;
                if (qq < 0 || qq >= 14) continue;
                acc += p[w2 + ((size_t(o) * c1 + i) * 5 + ky) * 5 + kx] * p1[(i * 14 + rr) * 14 + qq];
              }
            }
          }
          o2[r * 14 + q] = std::max(acc, 0.0);
        }
      }
      for (int r = 0; r < 7; ++r) {
        for (int q = 0; q < 7; ++q) {
          double m = o2[(2 * r) * 14 + 2 * q];
          for (int d = 1; d < 4; ++d) m = std::max(m, o2[(2 * r + d / 2) * 14 + 2 * q + d % 2]);
          f[o * 49 + r * 7 + q] = m;
        }
      }
    }
    std::vector<double> logits(classes);
    for (int k = 0; k < classes; ++k) {
      double acc = p[bf + k];
      for (size_t j = 0; j < flat; ++j) acc += p[wf + k * flat + j] * f[j];
      logits[k] = acc;
    }
    const double m = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double v : logits) sum += std::exp(v - m);
    total += m + std::log(sum) - logits[y[s]];
  }
  return total / double(y.size());
}

void CheckGradient(const CnnSpec& spec, int batch, size_t coords_per_tensor, uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " batch=" + std::to_string(batch));
  auto backend = MakeCpuCnnBackend(spec);
  ASSERT_NE(backend, nullptr);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.3f, 0.3f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(backend->num_params());
  for (float& v : params) v = uniform(rng);
  std::vector<float> x(size_t(batch) * 784);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> y(batch);
  for (uint8_t& v : y) v = static_cast<uint8_t>(rng() % spec.classes);

  std::vector<float> grad(backend->num_params(), 123.0f);  // overwritten, not added to
  const float loss = backend->ComputeGradient(params, x.data(), y.data(), batch, grad);
  std::vector<double> p(params.begin(), params.end());
  const double ref_loss = ReferenceLoss(spec, p, x, y);
  EXPECT_NEAR(loss, ref_loss, 1e-4 * std::max(1.0, ref_loss));

  constexpr double kStep = 1e-4;
  size_t offset = 0, checked = 0;
  for (const TensorSpec& t : backend->tensors()) {
    std::vector<size_t> coords(t.size);
    std::iota(coords.begin(), coords.end(), offset);
    std::shuffle(coords.begin(), coords.end(), rng);
    coords.resize(std::min(coords.size(), coords_per_tensor));
    size_t tensor_nonzero = 0;
    for (size_t i : coords) {
      const double saved = p[i];
      p[i] = saved + kStep;
      const double up = ReferenceLoss(spec, p, x, y);
      p[i] = saved - kStep;
      const double down = ReferenceLoss(spec, p, x, y);
      p[i] = saved;
      const double fd = (up - down) / (2 * kStep);
      EXPECT_LE(std::abs(grad[i] - fd), 2e-2 * std::max({std::abs(double(grad[i])), std::abs(fd), 1e-3}))
          << t.name << " element " << i - offset << ": backend " << grad[i] << " vs finite difference "
          << fd;
      ++checked;
      if (std::abs(fd) > 1e-4) ++tensor_nonzero;
    }
    EXPECT_GT(tensor_nonzero, 0u) << t.name << ": the check would be vacuous";
    offset += t.size;
  }
  EXPECT_EQ(offset, backend->num_params());
  EXPECT_GE(checked, 30u);
}

TEST(CnnBackendTest, GradientMatchesFiniteDifferences) {
  CheckGradient({2, 3, 10}, /*batch=*/3, /*coords_per_tensor=*/12, 20261201);
}

TEST(CnnBackendTest, BatchLargerThanOneChunkIsOneBatchMean) {
  // 70 samples: a 64-sample chunk and a 6-sample one.
  CheckGradient({2, 2, 4}, /*batch=*/70, /*coords_per_tensor=*/8, 7);
}

TEST(CnnBackendTest, EachLayerIsReportedOnceItsGradientIsFinal) {
  // 70 samples: two chunks; only the last one may report.
  auto backend = MakeCpuBackend(ModelSpec{ModelSpec::Kind::kCnn, {}, CnnSpec{4, 8, 10}});
  ASSERT_NE(backend, nullptr);
  std::vector<float> params(backend->num_params()), grad(params.size());
  backend->InitParams(3, params);
  std::mt19937 rng(9);
  std::vector<float> x(70 * 784);
  for (float& v : x) v = static_cast<float>(rng() % 256) / 255.0f;
  std::vector<uint8_t> y(70);
  for (auto& v : y) v = static_cast<uint8_t>(rng() % 10);
  CheckGradientStages(*backend, params, x.data(), y.data(), 70, grad);
}

TEST(CnnBackendTest, TensorTableAndInit) {
  auto backend = MakeCpuBackend(ModelSpec{ModelSpec::Kind::kCnn, {}, CnnSpec{}});
  ASSERT_NE(backend, nullptr);
  const std::vector<std::pair<std::string, size_t>> want = {
      {"conv1.weight", 16 * 25}, {"conv1.bias", 16},      {"conv2.weight", 32 * 16 * 25},
      {"conv2.bias", 32},        {"fc.weight", 10 * 1568}, {"fc.bias", 10}};
  ASSERT_EQ(backend->tensors().size(), want.size());
  size_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(backend->tensors()[i].name, want[i].first);
    EXPECT_EQ(backend->tensors()[i].size, want[i].second);
    total += want[i].second;
  }
  EXPECT_EQ(backend->num_params(), total);
  std::vector<float> a(total), b(total);
  backend->InitParams(5, a);
  backend->InitParams(5, b);
  EXPECT_EQ(a, b);
  // conv1.weight within sqrt(6/25), its bias zero, and not all equal.
  const float bound = std::sqrt(6.0f / 25.0f);
  EXPECT_TRUE(std::all_of(a.begin(), a.begin() + 400, [&](float v) { return std::abs(v) <= bound; }));
  EXPECT_TRUE(std::all_of(a.begin() + 400, a.begin() + 416, [](float v) { return v == 0.0f; }));
  EXPECT_NE(*std::min_element(a.begin(), a.begin() + 400), *std::max_element(a.begin(), a.begin() + 400));
  EXPECT_EQ(MakeCpuCnnBackend(CnnSpec{0, 4, 10}), nullptr);
}

TEST(CnnBackendTest, SgdLearnsFashionMnist) {
  auto train = LoadFashionMnist(kDefaultFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  constexpr int kBatch = 32, kSteps = 150;
  constexpr float kLr = 0.05f;
  auto backend = MakeCpuCnnBackend(CnnSpec{8, 16, 10});
  ASSERT_NE(backend, nullptr);
  std::vector<float> params(backend->num_params()), grad(params.size());
  backend->InitParams(1, params);
  const EvalResult before = backend->Evaluate(params, test->images.data(), test->labels.data(), 1000);
  for (int step = 0; step < kSteps; ++step) {
    const size_t first = size_t(step) * kBatch % 4800;
    const float loss = backend->ComputeGradient(params, train->images.data() + first * 784,
                                                train->labels.data() + first, kBatch, grad);
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    for (size_t i = 0; i < params.size(); ++i) params[i] -= kLr * grad[i];
  }
  const EvalResult after = backend->Evaluate(params, test->images.data(), test->labels.data(), 1000);
  EXPECT_EQ(after.samples, 1000u);
  EXPECT_LT(before.accuracy, 0.3);
  EXPECT_GT(after.accuracy, 0.65) << "loss " << after.loss;
  EXPECT_LT(after.loss, before.loss);
}

}  // namespace
}  // namespace pacer::worker
