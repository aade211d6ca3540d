// A ZeRO stage that already has every segment's gradient norm (parallel/data/zero_stage.cpp's stages 2 and 3 with
// --offload grads computes them as it writes each bucket's gradient shard to the file), so that the global norm
// (DataParallel::grad_sq) need not read the gradient shard back. A separate interface so that a stage opts in
// without a change to ZeroStage's.
#pragma once

#include <vector>

namespace mt::parallel {

class SegmentNorms {
 public:
  virtual ~SegmentNorms() = default;
  // norms[i] = optim::global_norm of segment i's reduced gradient (the same bits as computed from
  // ZeroStage::visit_grad_segments' pointer); false when the stage does not hold them all (nothing written then).
  virtual bool grad_segment_norms(std::vector<double>& norms) = 0;
};

}  // namespace mt::parallel
