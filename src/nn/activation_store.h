// The activation store: buffers that forward writes and backward reads, keyed by (micro-batch, name).
// Layers own none of these, so a pipeline stage can hold several micro-batches in flight and free each one
// after its backward. Buffers of a released micro-batch are kept in a free list and reused by the next
// request of the same size, so steady-state training allocates nothing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/buffer.h"

namespace mt::offload {
class ShardFile;
}

namespace mt::nn {

class ActivationStore {
 public:
  // A buffer of `count` floats for (mb, name); created zeroed on first request, same buffer afterwards
  // (contents kept) as long as the count is unchanged.
  float* get(int mb, const std::string& name, size_t count);
  // A buffer of `count` bfloat16 values (an input that only products read in backward, kept rounded under
  // --precision bf16: half the bytes), on the same terms as get; counted in the byte figures.
  uint16_t* get_bf16(int mb, const std::string& name, size_t count) {
    return reinterpret_cast<uint16_t*>(get(mb, name, (count + 1) / 2));
  }
  // A non-float object a layer keeps for backward (an MoE layer's routing), default-constructed on first
  // request, dropped by release(mb). One type per name. Not counted in the byte figures (small: O(N E)).
  template <class T>
  T& object(int mb, const std::string& name) {
    std::shared_ptr<void>& slot = objects_[{mb, name}];
    if (!slot) slot = std::make_shared<T>();
    return *static_cast<T*>(slot.get());
  }
  // Returns every buffer of micro-batch mb to the free list.
  void release(int mb);
  // Bytes currently held for live micro-batches.
  size_t live_bytes() const;
  // Bytes ever allocated (live + free list).
  size_t total_bytes() const;
  // The most bytes live at once: the measured activation memory (a pipeline stage's peak grows with the
  // micro-batches it holds in flight).
  size_t peak_live_bytes() const { return peak_; }
  // The most micro-batch keys (mb >= 0: the step's micro-batches, one key per (micro-batch, chunk) under a
  // pipeline; the shared scratch slot and evaluation keys are negative) holding buffers at once, and the most
  // bytes one such key held: a schedule's activations in flight as the store saw them.
  int peak_live_keys() const { return peak_keys_; }
  size_t peak_key_bytes() const { return peak_key_bytes_; }

  // ---- --offload-activations: a block's buffers spilled to a file between its forward and its backward. ----
  // The model marks where blocks end; without a tier these are no-ops. A block is every buffer of micro-batch
  // mb whose name starts with `prefix` (GPT: "h3.").
  // The store owns the tier (offload/shard_file.h, grown as buffers are first spilled; each (mb, name) keeps its
  // place in the file).
  void set_tier(std::unique_ptr<offload::ShardFile> tier);
  offload::ShardFile* tier() const { return tier_.get(); }
  // After the block's forward (and after the next block's, which reads its output): queue a write of each of
  // its buffers; a buffer returns to the free list once written.
  void spill(int mb, const std::string& prefix);
  // Ahead of the block's backward: queue reads of its spilled buffers; get() of one waits for its read.
  void fetch(int mb, const std::string& prefix);
  // After the block's whole backward: its buffers return to the free list (the next forward rewrites them).
  void drop(int mb, const std::string& prefix);
  ActivationStore();
  ~ActivationStore();

 private:
  struct Spilled {
    AlignedBuffer buf;  // while writing (the data being written) or reading (its destination)
    size_t off = 0;
    uint64_t ticket = 0;
    bool reading = false;
  };
  void reclaim();  // buffers whose write finished go to the free list
  AlignedBuffer take_free(size_t count);
  std::map<std::pair<int, std::string>, Spilled> spilled_;
  std::map<std::pair<int, std::string>, std::pair<size_t, size_t>> places_;  // (offset, count) in the file
  size_t file_end_ = 0;
  std::map<std::pair<int, std::string>, AlignedBuffer> live_;
  std::multimap<size_t, AlignedBuffer> free_;
  std::map<std::pair<int, std::string>, std::shared_ptr<void>> objects_;
  size_t live_count_ = 0, peak_ = 0;  // bytes
  std::map<int, size_t> key_bytes_;    // live bytes per micro-batch key >= 0
  int peak_keys_ = 0;
  size_t peak_key_bytes_ = 0;
  std::unique_ptr<offload::ShardFile> tier_;  // last: its I/O thread stops before the buffers go
};

}  // namespace mt::nn
