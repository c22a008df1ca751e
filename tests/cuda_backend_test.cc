// The CUDA backend (worker/builtin/cuda_backend.h) and --device selection.
//
// Parity and training need a GPU: without one (or in a build without CUDA)
// they skip, saying why. Both check the device's own kernel counter, so a
// "CUDA" backend that quietly ran on the CPU fails them. Device selection
// and the memory model run everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "worker/builtin/cpu_backend.h"
#include "worker/builtin/cuda_backend.h"
#include "worker/builtin/device.h"
#include "worker/builtin/mnist.h"
#include "tests/grad_sink_check.h"

namespace pacer::worker {
namespace {

ModelSpec Cnn(int c1 = 16, int c2 = 32) {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kCnn;
  s.cnn = {c1, c2, 10};
  return s;
}

// Skips the test without a usable CUDA device.
#define REQUIRE_GPU()                                                              \
  do {                                                                             \
    std::string why;                                                               \
    if (CudaDevices(&why).empty()) GTEST_SKIP() << "no GPU test here: " << why;    \
  } while (0)

void CheckParity(const ModelSpec& spec, int batch) {
  SCOPED_TRACE(spec.name() + " batch " + std::to_string(batch));
  std::string why;
  auto gpu = MakeCudaBackend(spec, 0, &why);
  ASSERT_NE(gpu, nullptr) << why;
  auto cpu = MakeCpuBackend(spec);
  ASSERT_NE(cpu, nullptr);
  ASSERT_EQ(gpu->name(), "cuda");
  ASSERT_EQ(gpu->num_params(), cpu->num_params());
  std::vector<float> params(cpu->num_params());
  cpu->InitParams(11, params);
  std::vector<float> gpu_init(params.size());
  gpu->InitParams(11, gpu_init);
  EXPECT_EQ(gpu_init, params);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(size_t(batch) * spec.inputs());
  for (float& v : x) v = pixel(rng);
  std::vector<uint8_t> y(batch);
  for (auto& v : y) v = uint8_t(rng() % 10);
  std::vector<float> g_cpu(params.size()), g_gpu(params.size());
  const uint64_t before = CudaKernelsRun();
  const float l_gpu = gpu->ComputeGradient(params, x.data(), y.data(), batch, g_gpu);
  const uint64_t after = CudaKernelsRun();
  const float l_cpu = cpu->ComputeGradient(params, x.data(), y.data(), batch, g_cpu);
  EXPECT_GE(after - before, 3u) << "the device counted no kernels: not run on the GPU";
  EXPECT_NEAR(l_gpu, l_cpu, 1e-4 * std::max(1.0f, std::abs(l_cpu)));
  // Per tensor: |g_gpu - g_cpu| / |g_cpu| (L2) within 1e-4.
  size_t offset = 0;
  for (const TensorSpec& t : cpu->tensors()) {
    double diff = 0, norm = 0;
    for (size_t i = offset; i < offset + t.size; ++i) {
      diff += double(g_gpu[i] - g_cpu[i]) * (g_gpu[i] - g_cpu[i]);
      norm += double(g_cpu[i]) * g_cpu[i];
    }
    EXPECT_GT(norm, 0) << t.name;
    EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << t.name;
    offset += t.size;
  }
}

TEST(CudaBackendTest, GradientsMatchTheCpuMlp) {
  REQUIRE_GPU();
  CheckParity(ModelSpec{}, 64);
}

TEST(CudaBackendTest, GradientsMatchTheCpuCnn) {
  REQUIRE_GPU();
  CheckParity(Cnn(), 64);
  CheckParity(Cnn(4, 8), 300);  // more than one 256-sample chunk
}

TEST(CudaBackendTest, EachLayerIsCopiedOutAndReportedOnceFinal) {
  // Into ordinary memory (through the staging buffer) and into the
  // backend's page-locked memory (copied there directly), for both models.
  REQUIRE_GPU();
  for (const ModelSpec& spec : {ModelSpec{}, Cnn()}) {
    SCOPED_TRACE(spec.name());
    std::string why;
    auto gpu = MakeCudaBackend(spec, 0, &why);
    ASSERT_NE(gpu, nullptr) << why;
    std::vector<float> params(gpu->num_params());
    gpu->InitParams(7, params);
    std::mt19937 rng(3);
    std::vector<float> x(size_t(96) * spec.inputs());
    for (float& v : x) v = float(rng() % 256) / 255.0f;
    std::vector<uint8_t> y(96);
    for (auto& v : y) v = uint8_t(rng() % 10);
    std::vector<float> pageable(params.size());
    const uint64_t before = CudaKernelsRun();
    CheckGradientStages(*gpu, params, x.data(), y.data(), 96, pageable);
    std::shared_ptr<float> pinned = gpu->AllocateHost(params.size());
    ASSERT_NE(pinned, nullptr);
    std::shared_ptr<float> pinned_params = gpu->AllocateHost(params.size());
    ASSERT_NE(pinned_params, nullptr);
    std::copy(params.begin(), params.end(), pinned_params.get());
    CheckGradientStages(*gpu, {pinned_params.get(), params.size()}, x.data(), y.data(), 96,
                        {pinned.get(), params.size()});
    EXPECT_GE(CudaKernelsRun() - before, 4u * 5) << "the device counted too few kernels";
  }
}

TEST(CudaBackendTest, TrainsTheCnnOnTheGpu) {
  REQUIRE_GPU();
  auto train = LoadFashionMnist(kDefaultFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status();
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  std::string why;
  auto gpu = MakeCudaBackend(Cnn(), 0, &why);
  ASSERT_NE(gpu, nullptr) << why;
  std::vector<float> params(gpu->num_params()), grad(params.size());
  gpu->InitParams(1, params);
  const uint64_t before = CudaKernelsRun();
  constexpr int kBatch = 128;
  for (int step = 0; step < 600; ++step) {
    const size_t first = size_t(step) * kBatch % (train->size() - kBatch);
    const float loss = gpu->ComputeGradient(params, train->images.data() + first * 784,
                                            train->labels.data() + first, kBatch, grad);
    ASSERT_TRUE(std::isfinite(loss)) << step;
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * grad[i];
  }
  const EvalResult r = gpu->Evaluate(params, test->images.data(), test->labels.data(), test->size());
  EXPECT_GE(CudaKernelsRun() - before, 600u * 10) << "the device counted too few kernels";
  EXPECT_GE(r.accuracy, 0.8) << "loss " << r.loss;
}

TEST(DeviceTest, SelectionByName) {
  auto cpu = MakeBackend(ModelSpec{}, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  auto automatic = MakeBackend(Cnn(), "auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  std::string none;
  EXPECT_EQ((*automatic)->name(), CudaDevices(&none).empty() ? "cpu" : "cuda");
  auto gpu = MakeBackend(ModelSpec{}, "gpu");
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu.status().message().find("not cpu, cuda, cuda:N or auto"), std::string::npos)
      << gpu.status();
  EXPECT_EQ(MakeBackend(ModelSpec{}, "cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
  // A device that is not there is an error, never a quiet CPU fallback.
  auto absent = MakeBackend(ModelSpec{}, "cuda:99");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(absent.status().message().empty());
}

TEST(DeviceTest, MemoryModel) {
  const size_t mlp = CudaBytesPerSample(ModelSpec{});
  const size_t cnn = CudaBytesPerSample(Cnn());
  // The MLP keeps its input and three layer outputs (+ a delta): ~1.5k floats.
  EXPECT_GT(mlp, 784u * 4);
  EXPECT_LT(mlp, 20000u);
  // The CNN's im2col columns dominate: 196 x 16 x 25 floats for conv2 alone.
  EXPECT_GT(cnn, 196u * 16 * 25 * 4);
  EXPECT_GT(CudaBytesPerModel(ModelSpec{}), 2 * 235146u * 4 - 1);
}

}  // namespace
}  // namespace pacer::worker
