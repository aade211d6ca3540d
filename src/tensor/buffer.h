// AlignedBuffer: an owning, 64-byte aligned, zero-initialized float array. Everything numeric in meshtrain
// (parameters, gradients, optimizer state, activations) lives in one of these; views are plain pointers.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace mt {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { resize(count); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~AlignedBuffer() { std::free(data_); }

  // Reallocates (contents are lost, new contents are zero) unless the size is unchanged.
  void resize(size_t count) {
    if (count == size_) return;
    std::free(data_);
    data_ = nullptr;
    size_ = count;
    if (count == 0) return;
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  void zero() {
    if (size_) std::memset(data_, 0, size_ * sizeof(float));
  }

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(float); }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mt
