// The CUDA entry points of worker/builtin/cuda_backend.h for pacer-worker: the
// backend is loaded with dlopen from libpacer_cuda.so when first asked for,
// not linked at start. Linked at start, cuBLAS's thread-local storage
// (libcublasLt.so.13: 94 KB) lands in every thread's static TLS block and
// civetweb, whose threads get fixed ~100 KB stacks, could not start its
// /metrics server ("Cannot create threads"). A module's TLS is allocated
// per thread on first use instead.
//
// The module is looked for at $PACER_CUDA_MODULE, next to the program, where
// the package installs it (../lib/pacer/ from the program's folder) and in
// the build tree (../worker/). `auto` does not
// even look unless the NVIDIA driver is loaded (/proc/driver/nvidia), so
// CPU-only machines never map cuBLAS.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "worker/builtin/cuda_backend.h"

namespace pacer::worker {
namespace {

struct Loaded {
  const CudaApi* api = nullptr;
  std::string why;
};

const Loaded& Load() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("PACER_CUDA_MODULE")) paths.push_back(env);
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      paths.push_back((self.parent_path() / "libpacer_cuda.so").string());
      paths.push_back((self.parent_path() / ".." / "lib" / "pacer" / "libpacer_cuda.so").string());
      paths.push_back((self.parent_path() / ".." / "worker" / "libpacer_cuda.so").string());
    }
    std::string tried;
    for (const auto& path : paths) {
      if (!std::filesystem::exists(path, ec)) {
        tried += " " + path;
        continue;
      }
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        loaded.why = std::string("cannot load the CUDA module: ") + dlerror();
        return;
      }
      using Entry = const CudaApi* (*)();
      auto entry = reinterpret_cast<Entry>(dlsym(handle, "PacerCudaApi"));
      if (entry == nullptr) {
        loaded.why = path + " has no PacerCudaApi";
        return;
      }
      loaded.api = entry();
      return;
    }
    loaded.why = "no CUDA module (libpacer_cuda.so; a build without nvcc has none) at" + tried +
                 "; set PACER_CUDA_MODULE";
  });
  return loaded;
}

bool DriverLoaded() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia", ec);
}

}  // namespace

bool CudaBuilt() { return Load().api != nullptr && Load().api->built(); }

std::vector<CudaDevice> CudaDevices(std::string* why) {
  if (!DriverLoaded()) {
    if (why != nullptr) *why = "no NVIDIA driver loaded (/proc/driver/nvidia is missing)";
    return {};
  }
  const Loaded& l = Load();
  if (l.api == nullptr) {
    if (why != nullptr) *why = l.why;
    return {};
  }
  return l.api->devices(why);
}

std::unique_ptr<ComputeBackend> MakeCudaBackend(const ModelSpec& spec, int device, std::string* why) {
  const Loaded& l = Load();
  if (l.api == nullptr) {
    if (why != nullptr) *why = l.why;
    return nullptr;
  }
  return l.api->make(spec, device, why);
}

uint64_t CudaKernelsRun() {
  const Loaded& l = Load();
  return l.api == nullptr ? 0 : l.api->kernels_run();
}

}  // namespace pacer::worker
