// pacer-compute-bench: training throughput (samples/s of forward + backward)
// of the compute backends, MLP and CNN, at several batch sizes, on real
// Fashion-MNIST batches; with a CUDA device, the device memory the backend
// took. Links only the compute library (no ZeroMQ, RocksDB, ...), so that
// it runs on a bare GPU machine.
//
//   pacer-compute-bench [--device cpu|cuda:N|auto] [--batches 32,128,512]
//                       [--seconds 2] [--models mlp,cnn]
//
// Prints one line per (model, batch): device, samples/s, ms per batch, and
// for CUDA the device memory in use after the run minus before.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "worker/builtin/cuda_backend.h"
#include "worker/builtin/device.h"
#include "worker/builtin/mnist.h"

namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

size_t DeviceUsed(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return 0;
  std::string why;
  const auto devices = pacer::worker::CudaDevices(&why);
  const size_t index = device.size() > 5 ? std::stoul(device.substr(5)) : 0;
  if (index >= devices.size()) return 0;
  return devices[index].total_bytes - devices[index].free_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "auto", batches = "32,128,512", models = "mlp,cnn";
  double seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--device") {
      device = argv[i + 1];
    } else if (flag == "--batches") {
      batches = argv[i + 1];
    } else if (flag == "--seconds") {
      seconds = std::atof(argv[i + 1]);
    } else if (flag == "--models") {
      models = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: pacer-compute-bench [--device D] [--batches B,...] "
                           "[--seconds S] [--models mlp,cnn]\n");
      return 2;
    }
  }
  if (device == "auto") {
    std::string why;
    device = pacer::worker::CudaDevices(&why).empty() ? "cpu" : "cuda:0";
  }
  auto train = pacer::worker::LoadFashionMnist(pacer::worker::kDefaultFashionMnistDir, true);
  if (!train.ok()) {
    std::fprintf(stderr, "%s\n", std::string(train.status().message()).c_str());
    return 1;
  }
  if (device.rfind("cuda", 0) == 0) {
    std::string why;
    for (const auto& d : pacer::worker::CudaDevices(&why)) {
      std::printf("# device cuda:%d %s, %.1f GiB\n", d.index, d.name.c_str(), d.total_bytes / 1073741824.0);
    }
  }
  std::printf("%-5s %-8s %6s %12s %10s %14s\n", "model", "device", "batch", "samples/s", "ms/batch",
              "device MiB");
  for (const std::string& model : Split(models)) {
    pacer::worker::ModelSpec spec;
    if (model == "cnn") spec.kind = pacer::worker::ModelSpec::Kind::kCnn;
    for (const std::string& b : Split(batches)) {
      const int batch = std::stoi(b);
      const size_t before = DeviceUsed(device);
      auto made = pacer::worker::MakeBackend(spec, device);
      if (!made.ok()) {
        std::fprintf(stderr, "%s: %s\n", device.c_str(), std::string(made.status().message()).c_str());
        return 1;
      }
      std::unique_ptr<pacer::worker::ComputeBackend> backend = *std::move(made);
      std::vector<float> params(backend->num_params()), grad(params.size());
      backend->InitParams(1, params);
      const size_t span = train->size() - static_cast<size_t>(batch);
      // One warm-up batch (allocations, cuBLAS handles), then timed ones.
      backend->ComputeGradient(params, train->images.data(), train->labels.data(), batch, grad);
      size_t samples = 0, first = 0;
      int steps = 0;
      const auto t0 = std::chrono::steady_clock::now();
      double elapsed = 0;
      while (elapsed < seconds) {
        first = (first + static_cast<size_t>(batch)) % span;
        backend->ComputeGradient(params, train->images.data() + first * 784,
                                 train->labels.data() + first, batch, grad);
        samples += static_cast<size_t>(batch);
        ++steps;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      const size_t after = DeviceUsed(device);
      std::printf("%-5s %-8s %6d %12.0f %10.3f %14.1f\n", model.c_str(), device.c_str(), batch,
                  samples / elapsed, 1000 * elapsed / steps,
                  after > before ? (after - before) / 1048576.0 : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
