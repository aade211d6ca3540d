// The optimizer's state behind one interface: buffers declared by name and shape. A flat buffer holds one
// float per parameter element this rank updates, indexed like the gradients (segments' state offsets): what
// ZeRO shards and checkpoints gather into whole tensors. Any other shape (Adafactor's row and column means)
// is a factored buffer, which the optimizer indexes itself and which files hold once, under its declared name and
// shape (train/consolidate.h says which rank's copy). Checkpoints
// (train/consolidate.h), the summary's memory figures and Local SGD's state averaging reach the state
// through the store, never through an optimizer's members; a tier behind it (offload) is the store's
// business.
//
// Memory: a buffer is allocated (zeroed) at its first data(); declaring costs nothing, so a tier attached
// right after the optimizer's constructor means the flat buffers never exist in memory. Under a tier the flat
// buffers live there (StateTier below) and data(k) of a flat buffer is the window the tiled update
// (optim/tiled_optimizer.h) set: a slice of the tier's swap buffer, valid for one tile; outside a tile the
// buffers are reached whole through visit(). Factored buffers always stay in memory (they are small: a row
// and a column per tensor).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/buffer.h"

namespace mt::optim {

// Where a store's flat buffers live when they are not in memory (offload/state_swapper.h: a file under
// --offload-dir). j is the flat buffer's position in StateStore::flat(); elements [0, n) of each. The tier
// starts as zeros, as a freshly declared buffer does.
class StateTier {
 public:
  virtual ~StateTier() = default;
  // Synchronous copies out of and into the tier (checkpoints, resume, Local SGD's averaging); they see every
  // write an earlier tiled update made, and a later tiled update sees what write() put there.
  virtual void read(size_t j, size_t offset, size_t count, float* out) = 0;
  virtual void write(size_t j, size_t offset, size_t count, const float* in) = 0;

  // ---- The tiled update: tile t covers flat elements [t T, min(n, (t+1) T)), T = tile_elems(). ----
  virtual size_t tile_elems() const = 0;
  virtual size_t tiles() const = 0;
  // Called once before the tiles of one update, in order 0, 1, ... (or descending: set_descending): acquire(t)
  // waits for tile t and returns one pointer per flat buffer to its slice (valid until release(t)); release(t)
  // hands the tile back to be written behind. end_update() returns once every tile is in the tier again (or throws the I/O error).
  virtual void begin_update() = 0;
  virtual std::vector<float*> acquire(size_t t) = 0;
  virtual void release(size_t t) = 0;
  virtual void end_update() = 0;
  // The order of the updates' tiles from now on: ascending (0, 1, ..., the default) or descending (tiles() - 1,
  // ..., 0); the update is the same either way (each element's from its own inputs). Called between updates; a
  // tier that reads ahead reads in this order.
  virtual void set_descending(bool) {}
  // A tier that reads the next update's first tiles ahead at end_update() does so only when read_ahead() is
  // called (set_read_ahead_later(true): the parameter store calls it once the forward's own reads are done, so
  // that they do not share the disk with this read-ahead); read_ahead() during an update takes effect at its end.
  virtual void set_read_ahead_later(bool) {}
  virtual void read_ahead() {}

  virtual size_t resident_bytes() const = 0;  // the tier's own buffers in memory
  // The flat buffers stay in memory behind the tier (optim/resident_tier.h): none of them is offloaded.
  virtual bool in_memory() const { return false; }
};

class StateStore {
 public:
  struct Buffer {
    std::string name;
    std::vector<int64_t> shape;  // flat: {n}
    bool flat = true;
    AlignedBuffer data;  // empty until the first data() (and always for a flat buffer under a tier)
    size_t n = 0;        // elements
    float* window = nullptr;  // under a tier: this buffer's slice of the current tile, rebased (see data())
  };
  // A flat buffer of n floats, zeroed; returns its index.
  size_t declare_flat(const std::string& name, size_t n);
  // A factored buffer of the given shape, zeroed; returns its index.
  size_t declare(const std::string& name, std::vector<int64_t> shape);

  size_t count() const { return buffers_.size(); }
  const Buffer& at(size_t k) const { return buffers_[k]; }
  // The buffer's elements. Under a tier, for a flat buffer: the current tile's slice, as a pointer p such that
  // p[i - first] is element i of the tile starting at `first` (the tiled update rebases segments' state
  // offsets to the tile); an error outside a tile.
  float* data(size_t k);
  size_t size(size_t k) const { return buffers_[k].n; }
  // Bytes in memory: the buffers not under a tier (as declared; allocated at their first data()) and the
  // tier's own buffers.
  size_t bytes() const;
  // Bytes held by the tier outside memory (0 without one, or with a tier that keeps them in memory).
  size_t offloaded_bytes() const;
  // The flat buffers' indices in declaration order (what checkpoints hold, and their order in files).
  std::vector<size_t> flat() const;
  // The factored buffers' indices in declaration order. A factored buffer's name says what it holds: ranks that
  // declare the same name hold the same values (whole-tensor statistics, reduced over the groups that split the
  // tensor before the update), so files keep one copy; a per-shard buffer takes a per-shard name.
  std::vector<size_t> factored() const;

  // Calls fn(v, n) with buffer k's whole contents, wherever they live: in memory, v is the buffer itself;
  // under a tier, a copy read from it, written back after fn when `modify`. For checkpoints and averaging,
  // not the update: under a tier this holds one whole buffer in memory for the call.
  void visit(size_t k, bool modify, const std::function<void(float* v, size_t n)>& fn);

  // Moves the flat buffers into `tier` for the rest of the store's life. Only before any flat buffer was
  // reached (the tier starts as zeros, as they would).
  void attach(std::unique_ptr<StateTier> tier);
  StateTier* tier() { return tier_.get(); }
  // The tiled update's window for flat buffer k (see data()); null after the tile.
  void set_window(size_t k, float* p) { buffers_[k].window = p; }

 private:
  std::deque<Buffer> buffers_;  // deque: a buffer stays where it is as more are declared
  std::unique_ptr<StateTier> tier_;
};

}  // namespace mt::optim
