// Hogwild! (Niu et al. 2011): workers of one process run SGD on one shared parameter buffer without locks.
//
// Each worker reads the shared parameters (a snapshot that other workers may be changing element by element
// while it is taken), computes a gradient on its own examples, and writes its SGD update back element by
// element. Reads and writes are relaxed atomic loads and stores (std::atomic_ref): no locks, no read-modify-
// write instructions, so two workers updating one element at the same moment may lose one of the updates,
// which is the method's premise (sparse, rare collisions); the accesses are still data-race free in the C++
// memory model. Momentum and weight decay follow optim::Sgd exactly (the momentum buffer is the worker's own),
// so one worker alone reproduces the plain SGD run bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace mt::parallel {

// local[i] = shared[i], each a relaxed atomic load.
void hogwild_read(const float* shared, float* local, size_t n);

// For each segment (offsets into shared, grads and momentum alike), with p = shared[i] read once:
//   g = grad + wd p;  m = (step == 0 ? g : mu m + g);  shared[i] = p - lr m   (relaxed store)
void hogwild_sgd_step(float* shared, const float* grads, float* momentum, const std::vector<optim::Segment>& segs,
                      const optim::SgdConfig& cfg, float lr, int64_t step);

}  // namespace mt::parallel
