// --offload params below ZeRO 3: the full float32 parameters of a replicated stage (0, 1, 2) in a file under
// --offload-dir, brought in group by group around each use, and the update's tiles streamed from it.
//
// What lives where (n = the registry's flat size, G groups):
//   file    n floats in the registry's flat order (element i at byte 4 i): what stages 0-2 keep in memory
//   memory  a group's parameters while the model uses it (bound to its tensors' data), the next group's read
//           ahead in flight; under --precision bf16 the mirror stays whole in memory (2 bytes per element of the
//           product tensors), refreshed from the file after every change of the parameters
// Forward of group g: g waited for and bound, g + 1 read ahead; backward: g, then g - 1 ahead. Buffers are
// slots of the largest group's size, allocated once and reused (at most 3: GPT's tied embedding stays bound
// through the whole backward beside the group in use and the one read ahead); initialization and the mirror's
// refresh use them too, so no buffer of the parameters' size is ever allocated. The values a layer reads are the file's, which are the
// values the resident buffer would hold: the same bits as in memory.
//
// StreamedTiles is the tiled update's source (optim/tiled_optimizer.h) for a stage whose state is laid out
// apart from its parameters or gradients: element s of the state is parameter seg.param + (s - seg.state) and
// gradient seg.grad + (s - seg.state) of the segment holding s; runs of consecutive elements move in one read
// or write.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "offload/shard_file.h"
#include "optim/tiled_optimizer.h"
#include "parallel/data/buckets.h"

namespace mt::parallel {

// A flat float32 array of n elements in a file under the options' --offload-dir (offload/shard_file.h).
std::unique_ptr<offload::ShardFile> make_shard_file(const DataParallelOptions& o, const char* kind, size_t n);

class StreamedTiles final : public optim::TileSource {
 public:
  // Parameters from pf (file offsets seg.param) or, when pf is null, left in memory at pmem (the update reaches
  // them at the segments' own param offsets: params_as_state() false); gradients from gf (file offsets
  // seg.grad) or, when gf is null, copied from gmem (memory at seg.grad). The segments cover state elements
  // [0, n) of the update.
  StreamedTiles(offload::ShardFile* pf, float* pmem, offload::ShardFile* gf, const float* gmem,
                const std::vector<optim::Segment>& segments);
  // Waits for the reads and writes still queued into or from its buffers (an update that threw leaves some).
  ~StreamedTiles() override;
  bool params_as_state() const override { return pf_ != nullptr; }
  void begin(size_t tile_elems, size_t n) override;
  std::pair<float*, const float*> open(size_t t, size_t lo, size_t hi) override;
  void close(size_t t, size_t lo, size_t hi) override;
  void end() override;

 private:
  struct Run {
    size_t state, at, count;  // state elements [state, state + count) are file/memory elements [at, at + count)
  };
  static std::vector<Run> runs(const std::vector<optim::Segment>& segs, bool params);
  // fn(run's file/memory offset, count, tile-relative offset) for the pieces of runs inside [lo, hi).
  static void pieces(const std::vector<Run>& rs, size_t lo, size_t hi,
                     const std::function<void(size_t, size_t, size_t)>& fn);
  void queue(size_t t);
  offload::ShardFile* pf_;
  float* pmem_;
  offload::ShardFile* gf_;
  const float* gmem_;
  std::vector<Run> prun_, grun_;
  size_t T_ = 0, n_ = 0;
  AlignedBuffer p_[2], g_[2];
  offload::ShardFile::Ticket pt_[2] = {0, 0}, gt_[2] = {0, 0};
};

// Each group's flat range (groups are contiguous in the registry's flat buffers; an empty group: count 0).
std::vector<FlatRange> group_ranges(const nn::ParamRegistry& reg);

class FullParamFile {
 public:
  // Creates the file (reserved whole) under b.opt.offload_dir: throws InputError naming the directory.
  explicit FullParamFile(BucketSet& b);
  ~FullParamFile();  // waits for the reads in flight before their buffers go

  // Initialization: fill(p) writes p's full tensor into p.data, group by group, into the file.
  void initialize(const std::function<void(nn::Param&)>& fill);
  // Group g bound for use (waiting for its read), and the read of `ahead` (>= 0, another group) queued.
  void use(int g, int ahead);
  void done(int g);       // g's buffer unbound and given back
  void release_all();     // every read waited for, every group unbound (before the file is rewritten)
  // Rounds the parameters into the registry's bf16 mirror, group by group from the file.
  void refresh_mirror();
  // The parameters whole (checkpoints: one copy in memory for the call).
  void read_all(float* out);
  void write_all(const float* in);
  // ZeRO 1 and 2 after the update: each bucket's slices all-gathered, from this rank's slice in the file, and
  // written back whole.
  void all_gather_buckets();

  offload::ShardFile& file() { return *f_; }
  // The slots' bytes once all are allocated: 3 of the largest group's size (fewer when fewer groups hold
  // parameters; at least the one initialization takes). 3 is reached by GPT (its embeddings bound through the
  // forward beside the layer in use and the next one read ahead); a model that keeps no group open needs 2.
  size_t slot_bytes() const;

 private:
  struct Group {
    size_t begin = 0, count = 0;  // flat range
    AlignedBuffer buf;
    offload::ShardFile::Ticket ticket = 0;
    bool queued = false, bound = false;
  };
  void queue(Group& gr);
  void bind(int g, float* base);
  AlignedBuffer take();               // a free slot (allocated when none is)
  void give(AlignedBuffer& buf);      // back to the free slots
  BucketSet& b_;
  std::vector<Group> groups_;
  size_t slot_ = 0;                   // the largest group's elements
  std::vector<AlignedBuffer> free_;
  std::unique_ptr<offload::ShardFile> f_;
};

}  // namespace mt::parallel
