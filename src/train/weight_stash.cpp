#include "train/weight_stash.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"

namespace mt::train {

WeightStash::WeightStash(MicroUpdates mode, int m, std::vector<int> vsync)
    : mode_(mode), m_(m), vsync_(std::move(vsync)), fwd_((size_t)m, -1), bwd_((size_t)m, -1) {
  MT_ASSERT(mode != MicroUpdates::none, "a weight stash for a schedule without per-micro-batch updates");
  MT_ASSERT(vsync_.empty() || (int)vsync_.size() == m, "vertical-sync versions for ", vsync_.size(),
            " micro-batches, m = ", m);
}

void WeightStash::bind(float* resident, size_t n) {
  MT_ASSERT(resident || n == 0, "no resident parameters to keep versions of");
  a_ = resident;
  n_ = n;
}

void WeightStash::before_forward() {
  if (!windowed_) reset();
}

void WeightStash::begin_window(const pipeline::Schedule& window, int n) {
  MT_ASSERT(n >= 1, "a window of ", n, " micro-batches");
  const bool vsync = !vsync_.empty();
  reset();
  windowed_ = true;
  m_ = n;
  fwd_.assign((size_t)n, -1);
  bwd_.assign((size_t)n, -1);
  if (vsync) vsync_ = vertical_sync_versions(window, n);
}

void WeightStash::reset() {
  for (int i = 0; i < m_; i++)
    MT_ASSERT(fwd_[i] < 0 || bwd_[i] >= 0, "micro-batch ", i, " of the last step has not run its backward");
  MT_ASSERT(loaded_ == newest_, "resident holds version ", loaded_, " between steps, not the newest ", newest_);
  std::fill(fwd_.begin(), fwd_.end(), -1);
  std::fill(bwd_.begin(), bwd_.end(), -1);
  saved_.clear();
  newest_ = loaded_ = 0;
}

// A micro-batch in flight will read v: its forward read it and its backward (stashed) has not run, or (vertical
// sync) its forward or backward is still to read it.
bool WeightStash::needed(int v) const {
  for (int i = 0; i < m_; i++) {
    if (bwd_[i] >= 0) continue;
    if (mode_ == MicroUpdates::stashed && fwd_[i] == v) return true;
    if (!vsync_.empty() && vsync_[i] == v) return true;
  }
  return false;
}

void WeightStash::save_newest() {
  if (loaded_ != newest_ || saved_.count(newest_)) return;
  AlignedBuffer& b = saved_[newest_];
  b.resize(n_);
  if (n_) std::memcpy(b.data(), a_, n_ * sizeof(float));
  peak_saved_ = std::max(peak_saved_, saved_.size());
}

void WeightStash::load(int v) {
  MT_ASSERT(v >= 0 && v <= newest_, "version ", v, " asked for, the newest is ", newest_);
  if (v == loaded_) return;
  save_newest();  // A is about to change: keep the newest (an older version in A is saved already)
  auto it = saved_.find(v);
  MT_ASSERT(it != saved_.end(), "version ", v, " is not kept (newest ", newest_, ", in A ", loaded_, ")");
  if (n_) std::memcpy(a_, it->second.data(), n_ * sizeof(float));
  loaded_ = v;
}

void WeightStash::prune() {
  for (auto it = saved_.begin(); it != saved_.end();)
    it = it->first != newest_ && !needed(it->first) ? saved_.erase(it) : std::next(it);
}

void WeightStash::count_live() {
  std::set<int> live{newest_};
  for (int i = 0; i < m_; i++) {
    if (bwd_[i] >= 0) continue;
    if (mode_ == MicroUpdates::stashed && fwd_[i] >= 0) live.insert(fwd_[i]);
    if (!vsync_.empty() && fwd_[i] >= 0) live.insert(vsync_[i]);
  }
  peak_ = std::max(peak_, (int)live.size());
}

void WeightStash::before_micro_forward(int i) {
  MT_ASSERT(i >= 0 && i < m_ && fwd_[i] < 0, "forward of micro-batch ", i, " twice or out of range");
  const int v = vsync_.empty() ? newest_ : vsync_[i];
  load(v);
  fwd_[i] = v;
  count_live();
}

void WeightStash::before_micro_backward(int i) {
  MT_ASSERT(i >= 0 && i < m_ && fwd_[i] >= 0 && bwd_[i] < 0, "backward of micro-batch ", i,
            " before its forward or twice");
  const int v = mode_ == MicroUpdates::stashed ? fwd_[i] : newest_;
  load(v);
  count_live();  // micro-batch i is in flight until its backward has read its version
  bwd_[i] = v;
  prune();
}

void WeightStash::before_update() {
  load(newest_);
  // The update overwrites A: keep the newest if a micro-batch in flight still reads it.
  if (needed(newest_)) save_newest();
}

void WeightStash::after_update() {
  newest_++;
  loaded_ = newest_;
  prune();
  count_live();
}

std::vector<int> gather_stash_peaks(const parallel::Mesh& mesh, parallel::ParamVersions* v) {
  const auto* stash = dynamic_cast<const WeightStash*>(v);
  const parallel::MeshGrid& g = mesh.grid();
  std::vector<float> mine{stash ? (float)stash->peak() : 0.0f}, all((size_t)g.world());
  mesh.world()->all_gather(mine.data(), all.data(), all.size(), comm::DType::f32);
  std::vector<int> out;
  for (int j = 0; j < g.pp(); j++) out.push_back((int)all[(size_t)g.world_rank({0, 0, j})]);
  return out;
}

std::vector<int> vertical_sync_versions(const pipeline::Schedule& schedule, int m) {
  const pipeline::Slot& first = schedule.placement.slot(0, 0);
  std::vector<int> v((size_t)m, -1);
  int updates = 0;
  for (const pipeline::Action& a : schedule[(size_t)first.rank]) {
    if (a.kind == pipeline::ActionKind::optimizer_step) updates++;
    if (a.kind == pipeline::ActionKind::forward && a.chunk == first.chunk) v.at(a.micro_batch) = updates;
  }
  for (int i = 0; i < m; i++) MT_ASSERT(v[i] >= 0, "micro-batch ", i, " has no forward on stage 0");
  return v;
}

}  // namespace mt::train
