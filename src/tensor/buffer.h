// AlignedBuffer: an owning, 64-byte aligned, zero-initialized float array. Everything numeric in meshtrain
// (parameters, gradients, optimizer state, activations) lives in one of these; views are plain pointers.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "core/shared_heap.h"

namespace mt {

// A failed allocation that says its size: "cannot allocate 3.7 GB (...)". Still a std::bad_alloc.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(size_t bytes)
      : bytes_(bytes),
        msg_("cannot allocate " + std::to_string(bytes) + " bytes (" + std::to_string(bytes >> 20) +
             " MiB) for one buffer: out of memory; reduce the model shape (--n-layer, --n-embd, --vocab-size, "
             "--n-positions, --hidden), --batch-size or --seq-len") {}
  size_t bytes() const { return bytes_; }
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  size_t bytes_;
  std::string msg_;
};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { resize(count); }
  // A buffer in the job's shared heap (core/shared_heap.h) when there is one and it has room, else private
  // memory: for the send buffers of collectives, which peers then read with ordinary loads. Stays shared
  // across resize(). Everything else about it is as above.
  static AlignedBuffer shared(size_t count) {
    AlignedBuffer b;
    b.shared_ = true;
    b.resize(count);
    return b;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), shared_(o.shared_) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(shared_, o.shared_);
    return *this;
  }
  ~AlignedBuffer() { free_data(); }

  // Reallocates (contents are lost, new contents are zero) unless the size is unchanged.
  void resize(size_t count) {
    if (count == size_) return;
    free_data();
    data_ = nullptr;
    size_ = count;
    if (count == 0) return;
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    if (shared_) data_ = static_cast<float*>(shared_heap::allocate(bytes));
    if (!data_) data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!data_) throw OutOfMemory(std::exchange(size_, 0) * sizeof(float));
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
  // True when the data lies in the shared heap (a shared() buffer that found room there).
  bool in_shared_heap() const { return data_ && shared_heap::contains(data_, size_ * sizeof(float)); }

 private:
  void free_data() {
    if (data_ && !(shared_ && shared_heap::release(data_))) std::free(data_);
  }
  float* data_ = nullptr;
  size_t size_ = 0;
  bool shared_ = false;
};

}  // namespace mt
