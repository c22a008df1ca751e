// The CUDA backend (worker/builtin/cuda_backend.h). Layouts are those of the CPU
// backends (worker/builtin/backend.h): row-major matrices, activations pixel-major
// for the CNN, so the same flat parameter vector means the same model here
// and there. Row-major GEMMs go to cuBLAS (column-major) by the usual
// identity: C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T, i.e.
// cublasSgemm(opB, opA, N, M, K, B, A, C) on the same pointers.
//
// Every kernel's first thread adds one to a device counter (g_kernels_run),
// so a test can prove that the device, not a CPU fallback, did the work.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "worker/builtin/cuda_backend.h"

namespace pacer::worker {
namespace {

__device__ unsigned long long g_kernels_run = 0;

__device__ inline void CountLaunch() {
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&g_kernels_run, 1ULL);
}

constexpr int kThreads = 256;
constexpr int kSide = kCnnImageSide;  // 28
constexpr int kK = kCnnKernel;        // 5
constexpr int kK2 = kK * kK;
constexpr int kPad = kK / 2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// z[r][c] = b[c] (the GEMM then accumulates onto the bias).
__global__ void SetRows(float* z, const float* b, size_t rows, int cols) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < rows * cols) z[i] = b[i % cols];
}

__global__ void Relu(float* z, size_t n) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) z[i] = fmaxf(z[i], 0.0f);
}

// a = a > 0 ? da : 0 (a: a ReLU's output; becomes dLoss/dZ).
__global__ void ReluBack(float* a, const float* da, size_t n) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) a[i] = a[i] > 0.0f ? da[i] : 0.0f;
}

__global__ void Fill(float* p, size_t n, float v) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = v;
}

// One thread per row: the row's cross-entropy into loss[row]; with
// `grad`, the row becomes (softmax - onehot) * inv_batch; else
// correct[row] = (argmax == label).
__global__ void SoftmaxXent(float* logits, const uint8_t* y, int rows, int classes,
                            float inv_batch, int grad, double* loss, int* correct) {
  CountLaunch();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* z = logits + size_t(r) * classes;
  int arg = 0;
  float m = z[0];
  for (int c = 1; c < classes; ++c) {
    if (z[c] > m) {
      m = z[c];
      arg = c;
    }
  }
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += exp(double(z[c] - m));
  const int label = y[r];
  loss[r] = log(sum) - double(z[label] - m);
  if (grad) {
    for (int c = 0; c < classes; ++c) z[c] = float(exp(double(z[c] - m)) / sum) * inv_batch;
    z[label] -= inv_batch;
  } else {
    correct[r] = arg == label ? 1 : 0;
  }
}

// im2col of a 'same' 5x5 convolution over n side x side images with ch
// channels, pixel-major: row (s, y, x), column (c, ky, kx).
__global__ void Im2Col(const float* in, int n, int side, int ch, float* cols) {
  CountLaunch();
  const size_t width = size_t(ch) * kK2;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * side * side * width) return;
  const size_t row = i / width;
  const int col = int(i % width);
  const int c = col / kK2, ky = (col % kK2) / kK, kx = col % kK;
  const int s = int(row / (size_t(side) * side));
  const int pix = int(row % (size_t(side) * side));
  const int iy = pix / side + ky - kPad, ix = pix % side + kx - kPad;
  cols[i] = (iy >= 0 && iy < side && ix >= 0 && ix < side)
                ? in[(size_t(s) * side * side + iy * side + ix) * ch + c]
                : 0.0f;
}

// The transpose of Im2Col, gathered: each input element sums the column
// entries copied from it.
__global__ void Col2Im(const float* cols, int n, int side, int ch, float* din) {
  CountLaunch();
  const size_t width = size_t(ch) * kK2;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * side * side * ch) return;
  const int c = int(i % ch);
  const size_t pixel = i / ch;
  const int s = int(pixel / (size_t(side) * side));
  const int pix = int(pixel % (size_t(side) * side));
  const int iy = pix / side, ix = pix % side;
  float acc = 0;
  for (int ky = 0; ky < kK; ++ky) {
    const int y = iy - ky + kPad;
    if (y < 0 || y >= side) continue;
    for (int kx = 0; kx < kK; ++kx) {
      const int x = ix - kx + kPad;
      if (x < 0 || x >= side) continue;
      acc += cols[(size_t(s) * side * side + y * side + x) * width + c * kK2 + ky * kK + kx];
    }
  }
  din[i] = acc;
}

// 2x2 max pool, stride 2 (first maximum on ties, as on the CPU).
__global__ void MaxPool(const float* in, int n, int side, int ch, float* out, int* arg) {
  CountLaunch();
  const int half = side / 2;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * half * half * ch) return;
  const int c = int(i % ch);
  const size_t pixel = i / ch;
  const int s = int(pixel / (size_t(half) * half));
  const int pix = int(pixel % (size_t(half) * half));
  const int py = pix / half, px = pix % half;
  int best = -1;
  float m = 0;
  for (int dy = 0; dy < 2; ++dy) {
    for (int dx = 0; dx < 2; ++dx) {
      const int j = int((size_t(s) * side * side + (2 * py + dy) * side + 2 * px + dx) * ch + c);
      if (best < 0 || in[j] > m) {
        best = j;
        m = in[j];
      }
    }
  }
  out[i] = m;
  arg[i] = best;
}

// Into a zeroed din: each window's maximum gets the gradient, where it
// passed the ReLU (out > 0). Windows do not overlap: no two threads write
// the same element.
__global__ void PoolBack(const float* dout, const float* out, const int* arg, size_t m, float* din) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < m && out[i] > 0.0f) din[arg[i]] = dout[i];
}

// Pixel-major (n, p, c) <-> channel-major (n, c * p): PyTorch's flatten.
__global__ void Flatten(float* hwc, int n, int p, int ch, float* chw, int back) {
  CountLaunch();
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * p * ch) return;
  const int c = int(i % ch);
  const size_t sp = i / ch;
  const int s = int(sp / p), q = int(sp % p);
  const size_t j = size_t(s) * p * ch + size_t(c) * p + q;
  if (back) {
    hwc[i] = chw[j];
  } else {
    chw[j] = hwc[i];
  }
}

// Device (or, Pinned, page-locked host) memory that frees itself.
template <class T, bool Pinned = false>
struct Buffer {
  T* p = nullptr;
  size_t n = 0;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p(o.p), n(o.n) {
    o.p = nullptr;
    o.n = 0;
  }
  ~Buffer() { Free(); }
  void Free() {
    if (Pinned) {
      cudaFreeHost(p);
    } else {
      cudaFree(p);
    }
    p = nullptr;
    n = 0;
  }
  bool Grow(size_t want) {
    if (want <= n) return true;
    Free();
    void* raw = nullptr;
    const cudaError_t err =
        Pinned ? cudaMallocHost(&raw, want * sizeof(T)) : cudaMalloc(&raw, want * sizeof(T));
    if (err != cudaSuccess) return false;
    p = static_cast<T*>(raw);
    n = want;
    return true;
  }
};
template <class T>
using DeviceBuffer = Buffer<T>;
template <class T>
using PinnedBuffer = Buffer<T, true>;

class CudaBackend final : public ComputeBackend {
 public:
  CudaBackend(const ModelSpec& spec, int device) : spec_(spec), device_(device) {
    tensors_ = ModelTensors(spec);
    for (const TensorSpec& t : tensors_) {
      offsets_.push_back(num_params_);
      num_params_ += t.size;
    }
  }
  ~CudaBackend() override {
    for (cudaEvent_t e : computed_) cudaEventDestroy(e);
    for (cudaEvent_t e : copied_) cudaEventDestroy(e);
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Device, stream, handle and the per-model buffers; false with why.
  bool Init(std::string* why) {
    if (cudaSetDevice(device_) != cudaSuccess) return Fail(why, "cudaSetDevice");
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return Fail(why, "cudaStreamCreate");
    }
    // Gradient copies to the host run on their own stream, each as soon as
    // its layer is computed, while the compute stream goes on.
    if (cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return Fail(why, "cudaStreamCreate");
    }
    stages_ = BackwardStages(tensors_);
    computed_.resize(stages_.size());
    copied_.resize(stages_.size());
    for (size_t i = 0; i < stages_.size(); ++i) {
      if (cudaEventCreateWithFlags(&computed_[i], cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming) != cudaSuccess) {
        return Fail(why, "cudaEventCreate");
      }
    }
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return Fail(why, "cublasCreate");
    cublasSetStream(handle_, stream_);
    if (!params_.Grow(num_params_) || !grad_.Grow(num_params_) || !host_.Grow(num_params_)) {
      return Fail(why, "allocating the model's buffers");
    }
    // A batch runs in one pass up to what 80% of the free memory holds
    // (that is the b_max the worker reports); a larger one in passes of it.
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return Fail(why, "cudaMemGetInfo");
    const double usable = 0.8 * double(free_bytes);
    const double rows = usable / double(CudaBytesPerSample(spec_));
    if (rows < 1) {
      if (why != nullptr) *why = "device " + std::to_string(device_) + " has too little free memory";
      return false;
    }
    chunk_ = int(std::min(rows, 65536.0));
    return true;
  }

  uint32_t max_batch() const override { return uint32_t(chunk_); }
  bool asynchronous() const override { return true; }

  std::string name() const override { return "cuda"; }
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  size_t num_params() const override { return num_params_; }
  void InitParams(uint64_t seed, std::span<float> params) const override {
    InitTensors(tensors_, seed, params);
  }

  using ComputeBackend::ComputeGradient;
  float ComputeGradient(std::span<const float> params, const float* x, const uint8_t* y, int batch,
                        std::span<float> grad, GradientSink* sink) override {
    if (batch <= 0 || x == nullptr || y == nullptr || params.size() != num_params_ ||
        grad.size() != num_params_ || !LabelsValid(y, size_t(batch))) {
      return kNaN;
    }
    cudaSetDevice(device_);
    if (!Upload(params) || !EnsureScratch(std::min(batch, chunk_), size_t(batch))) return kNaN;
    cudaMemsetAsync(grad_.p, 0, num_params_ * sizeof(float), stream_);
    // Each layer's gradient goes straight into `grad` when it is page-locked
    // (AllocateHost), else through the pinned staging buffer.
    out_ = Pinned(grad.data()) ? grad.data() : host_.p;
    // On failure, nothing queued may still read or write the caller's
    // memory after we return.
    auto fail = [this] {
      cudaStreamSynchronize(stream_);
      cudaStreamSynchronize(copy_stream_);
      return kNaN;
    };
    const float inv_batch = 1.0f / float(batch);
    for (int start = 0; start < batch; start += chunk_) {
      const int n = std::min(chunk_, batch - start);
      if (!Forward(x + size_t(start) * Inputs(), y + start, n)) return fail();
      SoftmaxXent<<<Blocks(n), kThreads, 0, stream_>>>(Logits(), y_.p, n, Classes(), inv_batch, 1,
                                                      loss_.p + start, nullptr);
      // Only the last pass finishes each layer's sum and copies it out.
      Backward(n, /*last=*/start + n == batch);
    }
    if (cudaGetLastError() != cudaSuccess) return fail();
    // Everything is queued; the device works through it while the host
    // hands on each layer as its copy lands (the sink may send it).
    for (size_t s = 0; s < stages_.size(); ++s) {
      if (cudaEventSynchronize(copied_[s]) != cudaSuccess) return fail();
      const GradRange r = stages_[s];
      if (out_ != grad.data()) {
        std::memcpy(grad.data() + r.begin, host_.p + r.begin, (r.end - r.begin) * sizeof(float));
      }
      if (sink != nullptr) sink->Ready(s);
    }
    std::vector<double> losses(batch);
    cudaMemcpyAsync(losses.data(), loss_.p, batch * sizeof(double), cudaMemcpyDeviceToHost, stream_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) return fail();
    double total = 0;
    for (double l : losses) total += l;
    return float(total / batch);
  }

  std::shared_ptr<float> AllocateHost(size_t floats) override {
    cudaSetDevice(device_);
    void* raw = nullptr;
    const size_t bytes = std::max<size_t>(1, floats) * sizeof(float);
    if (cudaMallocHost(&raw, bytes) != cudaSuccess) return nullptr;
    std::memset(raw, 0, bytes);
    return std::shared_ptr<float>(static_cast<float*>(raw), [](float* p) { cudaFreeHost(p); });
  }

  EvalResult Evaluate(std::span<const float> params, const float* x, const uint8_t* y,
                      size_t n) override {
    if (n == 0) return {};
    if (x == nullptr || y == nullptr || params.size() != num_params_ || !LabelsValid(y, n)) {
      return {kNaN, kNaN, 0};
    }
    cudaSetDevice(device_);
    const int chunk = int(std::min<size_t>(n, size_t(chunk_)));
    if (!Upload(params) || !EnsureScratch(chunk, size_t(chunk)) || !correct_.Grow(size_t(chunk))) {
      return {kNaN, kNaN, 0};
    }
    double loss = 0;
    size_t right = 0;
    std::vector<double> losses(chunk);
    std::vector<int> correct(chunk);
    for (size_t start = 0; start < n; start += size_t(chunk_)) {
      const int rows = int(std::min<size_t>(size_t(chunk_), n - start));
      if (!Forward(x + start * Inputs(), y + start, rows)) return {kNaN, kNaN, 0};
      SoftmaxXent<<<Blocks(rows), kThreads, 0, stream_>>>(Logits(), y_.p, rows, Classes(), 0.0f, 0,
                                                         loss_.p, correct_.p);
      cudaMemcpyAsync(losses.data(), loss_.p, rows * sizeof(double), cudaMemcpyDeviceToHost, stream_);
      cudaMemcpyAsync(correct.data(), correct_.p, rows * sizeof(int), cudaMemcpyDeviceToHost, stream_);
      if (cudaStreamSynchronize(stream_) != cudaSuccess) return {kNaN, kNaN, 0};
      for (int r = 0; r < rows; ++r) {
        loss += losses[r];
        right += size_t(correct[r]);
      }
    }
    return {double(right) / double(n), loss / double(n), n};
  }

 private:
  static bool Fail(std::string* why, const std::string& what) {
    if (why != nullptr) *why = what + ": " + cudaGetErrorString(cudaGetLastError());
    return false;
  }
  bool Cnn() const { return spec_.kind == ModelSpec::Kind::kCnn; }
  size_t Inputs() const { return size_t(spec_.inputs()); }
  int Classes() const { return spec_.classes(); }
  bool LabelsValid(const uint8_t* y, size_t n) const {
    const int classes = Classes();
    return std::all_of(y, y + n, [classes](uint8_t l) { return l < classes; });
  }
  const float* P(size_t tensor) const { return params_.p + offsets_[tensor]; }
  float* G(size_t tensor) { return grad_.p + offsets_[tensor]; }
  float* Logits() { return acts_.back().p; }

  // Whether p is page-locked host memory (copied by DMA, asynchronously).
  static bool Pinned(const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // clear it
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  }

  // Parameters pulled into page-locked memory (AllocateHost) are copied
  // from there directly; others through the pinned staging buffer.
  bool Upload(std::span<const float> params) {
    const float* from = params.data();
    if (!Pinned(from)) {
      std::memcpy(host_.p, from, num_params_ * sizeof(float));
      from = host_.p;
    }
    return cudaMemcpyAsync(params_.p, from, num_params_ * sizeof(float), cudaMemcpyHostToDevice,
                           stream_) == cudaSuccess;
  }

  // Stage s of the gradient is computed (on the compute stream): its copy
  // to out_ starts on the copy stream once the compute stream gets here.
  void StageDone(size_t s) {
    const GradRange r = stages_[s];
    cudaEventRecord(computed_[s], stream_);
    cudaStreamWaitEvent(copy_stream_, computed_[s], 0);
    cudaMemcpyAsync(out_ + r.begin, grad_.p + r.begin, (r.end - r.begin) * sizeof(float),
                    cudaMemcpyDeviceToHost, copy_stream_);
    cudaEventRecord(copied_[s], copy_stream_);
  }

  // C (M x N) = op(A) op(B) + beta C, all row-major with row strides lda,
  // ldb, ldc.
  void Gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) {
    const float one = 1.0f;
    cublasSgemm(handle_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                &one, b, ldb, a, lda, &beta, c, ldc);
  }
  // gb (cols) += the column sums of dz (rows x cols, row-major).
  void ColSums(const float* dz, int rows, int cols, float* gb) {
    const float one = 1.0f;
    cublasSgemv(handle_, CUBLAS_OP_N, cols, rows, &one, dz, cols, ones_.p, 1, &one, gb, 1);
  }

  // Buffers for `rows` samples per chunk and `batch` per-row losses.
  bool EnsureScratch(int rows, size_t batch) {
    if (!loss_.Grow(std::max(batch, size_t(rows)))) return false;
    if (rows <= scratch_rows_) return true;
    const size_t r = size_t(rows);
    if (!x_.Grow(r * Inputs()) || !y_.Grow(r)) return false;
    if (Cnn()) {
      const size_t c1 = size_t(spec_.cnn.conv1), c2 = size_t(spec_.cnn.conv2);
      const size_t p1 = kSide * kSide, p2 = p1 / 4, p3 = p2 / 4;
      acts_.resize(1);
      if (!cols1_.Grow(r * p1 * kK2) || !z1_.Grow(r * p1 * c1) || !a1_.Grow(r * p2 * c1) ||
          !da1_.Grow(r * p2 * c1) || !arg1_.Grow(r * p2 * c1) || !cols2_.Grow(r * p2 * c1 * kK2) ||
          !z2_.Grow(r * p2 * c2) || !a2_.Grow(r * p3 * c2) || !da2_.Grow(r * p3 * c2) ||
          !arg2_.Grow(r * p3 * c2) || !flat_.Grow(r * p3 * c2) || !dflat_.Grow(r * p3 * c2) ||
          !acts_[0].Grow(r * Classes()) || !ones_.Grow(r * p1)) {
        return false;
      }
    } else {
      const std::vector<int>& l = spec_.mlp.layers;
      acts_.resize(l.size() - 1);
      int widest = 0;
      for (size_t k = 1; k < l.size(); ++k) {
        if (!acts_[k - 1].Grow(r * size_t(l[k]))) return false;
        widest = std::max(widest, l[k]);
      }
      if (!delta_.Grow(r * size_t(std::max(widest, l.front()))) || !ones_.Grow(r)) return false;
    }
    Fill<<<Blocks(ones_.n), kThreads, 0, stream_>>>(ones_.p, ones_.n, 1.0f);
    scratch_rows_ = rows;
    return true;
  }

  // Uploads n samples and runs the forward pass; Logits() holds the output.
  bool Forward(const float* x, const uint8_t* y, int n) {
    if (cudaMemcpyAsync(x_.p, x, size_t(n) * Inputs() * sizeof(float), cudaMemcpyHostToDevice,
                        stream_) != cudaSuccess ||
        cudaMemcpyAsync(y_.p, y, size_t(n), cudaMemcpyHostToDevice, stream_) != cudaSuccess) {
      return false;
    }
    if (Cnn()) {
      ForwardCnn(n);
    } else {
      ForwardMlp(n);
    }
    return cudaGetLastError() == cudaSuccess;
  }

  void ForwardMlp(int n) {
    const std::vector<int>& l = spec_.mlp.layers;
    const float* in = x_.p;
    for (size_t k = 0; k + 1 < l.size(); ++k) {
      const size_t elems = size_t(n) * l[k + 1];
      float* z = acts_[k].p;
      SetRows<<<Blocks(elems), kThreads, 0, stream_>>>(z, P(2 * k + 1), size_t(n), l[k + 1]);
      Gemm(false, true, n, l[k + 1], l[k], in, l[k], P(2 * k), l[k], 1.0f, z, l[k + 1]);
      if (k + 2 < l.size()) Relu<<<Blocks(elems), kThreads, 0, stream_>>>(z, elems);
      in = z;
    }
  }

  void BackwardMlp(int n, bool last) {
    const std::vector<int>& l = spec_.mlp.layers;
    for (size_t k = l.size() - 1; k-- > 0;) {
      const int in = l[k], out = l[k + 1];
      const float* dz = acts_[k].p;
      const float* a_prev = k == 0 ? x_.p : acts_[k - 1].p;
      Gemm(true, false, out, in, n, dz, out, a_prev, in, 1.0f, G(2 * k), in);
      ColSums(dz, n, out, G(2 * k + 1));
      if (last) StageDone(l.size() - 2 - k);  // layer k is stage L-1-k
      if (k == 0) break;
      Gemm(false, false, n, in, out, dz, out, P(2 * k), in, 0.0f, delta_.p, in);
      const size_t elems = size_t(n) * in;
      ReluBack<<<Blocks(elems), kThreads, 0, stream_>>>(acts_[k - 1].p, delta_.p, elems);
    }
  }

  void ForwardCnn(int n) {
    const int c1 = spec_.cnn.conv1, c2 = spec_.cnn.conv2, classes = Classes();
    const int rows1 = n * kSide * kSide, rows2 = rows1 / 4, p3 = kSide * kSide / 16;
    const int flat = c2 * p3;
    Im2Col<<<Blocks(size_t(rows1) * kK2), kThreads, 0, stream_>>>(x_.p, n, kSide, 1, cols1_.p);
    SetRows<<<Blocks(size_t(rows1) * c1), kThreads, 0, stream_>>>(z1_.p, P(1), rows1, c1);
    Gemm(false, true, rows1, c1, kK2, cols1_.p, kK2, P(0), kK2, 1.0f, z1_.p, c1);
    Relu<<<Blocks(size_t(rows1) * c1), kThreads, 0, stream_>>>(z1_.p, size_t(rows1) * c1);
    MaxPool<<<Blocks(size_t(rows2) * c1), kThreads, 0, stream_>>>(z1_.p, n, kSide, c1, a1_.p, arg1_.p);
    Im2Col<<<Blocks(size_t(rows2) * c1 * kK2), kThreads, 0, stream_>>>(a1_.p, n, kSide / 2, c1,
                                                                       cols2_.p);
    SetRows<<<Blocks(size_t(rows2) * c2), kThreads, 0, stream_>>>(z2_.p, P(3), rows2, c2);
    Gemm(false, true, rows2, c2, c1 * kK2, cols2_.p, c1 * kK2, P(2), c1 * kK2, 1.0f, z2_.p, c2);
    Relu<<<Blocks(size_t(rows2) * c2), kThreads, 0, stream_>>>(z2_.p, size_t(rows2) * c2);
    MaxPool<<<Blocks(size_t(n) * flat), kThreads, 0, stream_>>>(z2_.p, n, kSide / 2, c2, a2_.p,
                                                                arg2_.p);
    Flatten<<<Blocks(size_t(n) * flat), kThreads, 0, stream_>>>(a2_.p, n, p3, c2, flat_.p, 0);
    SetRows<<<Blocks(size_t(n) * classes), kThreads, 0, stream_>>>(Logits(), P(5), n, classes);
    Gemm(false, true, n, classes, flat, flat_.p, flat, P(4), flat, 1.0f, Logits(), classes);
  }

  void BackwardCnn(int n, bool last) {
    const int c1 = spec_.cnn.conv1, c2 = spec_.cnn.conv2, classes = Classes();
    const int rows1 = n * kSide * kSide, rows2 = rows1 / 4, p3 = kSide * kSide / 16;
    const int flat = c2 * p3;
    const float* dlogits = Logits();
    Gemm(true, false, classes, flat, n, dlogits, classes, flat_.p, flat, 1.0f, G(4), flat);
    ColSums(dlogits, n, classes, G(5));
    if (last) StageDone(0);
    Gemm(false, false, n, flat, classes, dlogits, classes, P(4), flat, 0.0f, dflat_.p, flat);
    Flatten<<<Blocks(size_t(n) * flat), kThreads, 0, stream_>>>(da2_.p, n, p3, c2, dflat_.p, 1);
    cudaMemsetAsync(z2_.p, 0, size_t(rows2) * c2 * sizeof(float), stream_);
    PoolBack<<<Blocks(size_t(n) * flat), kThreads, 0, stream_>>>(da2_.p, a2_.p, arg2_.p,
                                                                 size_t(n) * flat, z2_.p);
    Gemm(true, false, c2, c1 * kK2, rows2, z2_.p, c2, cols2_.p, c1 * kK2, 1.0f, G(2), c1 * kK2);
    ColSums(z2_.p, rows2, c2, G(3));
    if (last) StageDone(1);
    Gemm(false, false, rows2, c1 * kK2, c2, z2_.p, c2, P(2), c1 * kK2, 0.0f, cols2_.p, c1 * kK2);
    Col2Im<<<Blocks(size_t(rows2) * c1), kThreads, 0, stream_>>>(cols2_.p, n, kSide / 2, c1, da1_.p);
    cudaMemsetAsync(z1_.p, 0, size_t(rows1) * c1 * sizeof(float), stream_);
    PoolBack<<<Blocks(size_t(rows2) * c1), kThreads, 0, stream_>>>(da1_.p, a1_.p, arg1_.p,
                                                                   size_t(rows2) * c1, z1_.p);
    Gemm(true, false, c1, kK2, rows1, z1_.p, c1, cols1_.p, kK2, 1.0f, G(0), kK2);
    ColSums(z1_.p, rows1, c1, G(1));
    if (last) StageDone(2);
  }

  void Backward(int n, bool last) {
    if (Cnn()) {
      BackwardCnn(n, last);
    } else {
      BackwardMlp(n, last);
    }
  }

  const ModelSpec spec_;
  const int device_;
  std::vector<TensorSpec> tensors_;
  std::vector<size_t> offsets_;
  size_t num_params_ = 0;
  int chunk_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::vector<GradRange> stages_;          // BackwardStages(tensors_)
  std::vector<cudaEvent_t> computed_;      // per stage: its gradient computed
  std::vector<cudaEvent_t> copied_;        // per stage: copied to the host
  float* out_ = nullptr;                   // where this call's gradient goes

  DeviceBuffer<float> params_, grad_, x_, ones_, delta_;
  PinnedBuffer<float> host_;  // staging for params in and the gradient out (pageable callers)
  DeviceBuffer<uint8_t> y_;
  DeviceBuffer<double> loss_;
  DeviceBuffer<int> correct_;
  std::vector<DeviceBuffer<float>> acts_;  // MLP: each layer's output; CNN: [0] the logits
  DeviceBuffer<float> cols1_, z1_, a1_, da1_, cols2_, z2_, a2_, da2_, flat_, dflat_;
  DeviceBuffer<int> arg1_, arg2_;
  int scratch_rows_ = 0;
};

}  // namespace

bool CudaBuilt() { return true; }

std::vector<CudaDevice> CudaDevices(std::string* why) {
  std::vector<CudaDevice> devices;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why != nullptr) {
      *why = err != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(err)
                                : "no CUDA device";
    }
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    CudaDevice d;
    d.index = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) d.name = prop.name;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d.free_bytes, &d.total_bytes);
    devices.push_back(d);
  }
  return devices;
}

std::unique_ptr<ComputeBackend> MakeCudaBackend(const ModelSpec& spec, int device,
                                                std::string* why) {
  if (ModelTensors(spec).empty()) {
    if (why != nullptr) *why = "invalid model shape";
    return nullptr;
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || device < 0 || device >= count) {
    if (why != nullptr) {
      *why = "no CUDA device " + std::to_string(device) +
             (err != cudaSuccess ? std::string(": ") + cudaGetErrorString(err)
                                 : " (" + std::to_string(count) + " here)");
    }
    return nullptr;
  }
  auto backend = std::make_unique<CudaBackend>(spec, device);
  if (!backend->Init(why)) return nullptr;
  return backend;
}

uint64_t CudaKernelsRun() {
  unsigned long long n = 0;
  if (cudaMemcpyFromSymbol(&n, g_kernels_run, sizeof(n)) != cudaSuccess) return 0;
  return n;
}

}  // namespace pacer::worker

// For dlopen (worker/builtin/cuda_dl.cc): the entry points above in one table.
extern "C" __attribute__((visibility("default"))) const pacer::worker::CudaApi* PacerCudaApi() {
  static const pacer::worker::CudaApi api = {
      &pacer::worker::CudaBuilt, &pacer::worker::CudaDevices, &pacer::worker::MakeCudaBackend,
      &pacer::worker::CudaKernelsRun};
  return &api;
}
