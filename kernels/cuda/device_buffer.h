// One cudaMalloc'd allocation, freed on every path (move-only), with the
// synchronous copies that tests, benchmarks and weight uploads need.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"

namespace pdq::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) {
    DeviceBuffer b;
    if (bytes <= 0)
      return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    const cudaError_t err = cudaMalloc(&b.ptr_, (size_t)bytes);
    if (err != cudaSuccess) {
      b.ptr_ = nullptr;
      return CudaStatus(err, absl::StrCat("cudaMalloc of ", bytes, " bytes").c_str());
    }
    b.bytes_ = bytes;
    return b;
  }
  // A buffer holding a copy of `count` values at `host`.
  template <typename T>
  static absl::StatusOr<DeviceBuffer> From(const T* host, int64_t count) {
    auto b = Allocate(count * (int64_t)sizeof(T));
    if (!b.ok()) return b.status();
    if (absl::Status s = b->Upload(host, b->bytes()); !s.ok()) return s;
    return b;
  }
  template <typename T>
  static absl::StatusOr<DeviceBuffer> From(const std::vector<T>& host) {
    return From(host.data(), (int64_t)host.size());
  }
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

  absl::Status Upload(const void* src, int64_t bytes) {
    if (bytes > bytes_) return absl::OutOfRangeError("upload larger than the buffer");
    return CudaStatus(cudaMemcpy(ptr_, src, (size_t)bytes, cudaMemcpyHostToDevice), "upload");
  }
  absl::Status Download(void* dst, int64_t bytes) const {
    if (bytes > bytes_) return absl::OutOfRangeError("download larger than the buffer");
    return CudaStatus(cudaMemcpy(dst, ptr_, (size_t)bytes, cudaMemcpyDeviceToHost), "download");
  }
  template <typename T>
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> out((size_t)bytes_ / sizeof(T));
    if (absl::Status s = Download(out.data(), (int64_t)(out.size() * sizeof(T))); !s.ok()) return s;
    return out;
  }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace pdq::cuda
