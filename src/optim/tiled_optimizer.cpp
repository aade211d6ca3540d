#include "optim/tiled_optimizer.h"

#include <algorithm>

#include "core/error.h"

namespace mt::optim {

TiledOptimizer::TiledOptimizer(std::unique_ptr<Optimizer> inner) : inner_(std::move(inner)) {
  MT_ASSERT(inner_->state().tier(), "a tiled optimizer over a store without a tier");
  MT_ASSERT(!inner_->state().flat().empty(), "a tiled optimizer with no flat state");
}

void TiledOptimizer::cut(const std::vector<Segment>& segments, size_t lo, size_t hi, std::vector<Segment>& out) {
  out.clear();
  for (const Segment& s : segments) {
    const size_t a = std::max(s.state, lo), b = std::min(s.state + s.count, hi);
    if (a >= b) continue;
    const size_t d = a - s.state;
    Segment p = s;
    p.param += d;
    p.grad += d;
    p.offset += d;
    p.state = a - lo;
    p.count = b - a;
    out.push_back(p);
  }
}

void TiledOptimizer::step(float* params, const float* grads, const std::vector<Segment>& segments, float lr,
                          int64_t step) {
  run(segments, nullptr, [&](size_t, size_t, size_t) { inner_->step(params, grads, tile_, lr, step); });
}

void TiledOptimizer::step_from(TileSource& src, const std::vector<Segment>& segments, float lr, int64_t step) {
  const bool params_as_state = src.params_as_state();
  for (const Segment& s : segments)
    MT_ASSERT((!params_as_state || s.param == s.state) && s.grad == s.state,
              "a tile source needs segments laid out as the state");
  run(segments, &src, [&](size_t t, size_t lo, size_t hi) {
    const auto [p, g] = src.open(t, lo, hi);
    for (Segment& s : tile_) {  // cut made the state offsets relative to lo (and moved param by as much)
      s.grad = s.state;
      if (params_as_state) s.param = s.state;
    }
    inner_->step(p, g, tile_, lr, step);
    src.close(t, lo, hi);
  });
}

void TiledOptimizer::run(const std::vector<Segment>& segments, TileSource* src,
                         const std::function<void(size_t, size_t, size_t)>& tile_step) {
  StateStore& st = inner_->state();
  StateTier& tier = *st.tier();
  const std::vector<size_t> flat = st.flat();
  const size_t n = st.size(flat[0]), T = tier.tile_elems();
  const float gs = grad_scale_;
  grad_scale_ = 1.0f;
  auto close = [&] {
    for (size_t k : flat) st.set_window(k, nullptr);
  };
  const bool desc = src && src->descending();
  tier.set_descending(desc);
  tier.begin_update();
  if (src) src->begin(T, n);
  try {
    for (size_t k = 0; k < tier.tiles(); k++) {
      const size_t t = desc ? tier.tiles() - 1 - k : k;
      const size_t lo = t * T, hi = std::min(n, lo + T);
      cut(segments, lo, hi, tile_);
      const std::vector<float*> w = tier.acquire(t);
      for (size_t j = 0; j < flat.size(); j++) st.set_window(flat[j], w[j]);
      inner_->scale_next_grads(gs);
      tile_step(t, lo, hi);
      close();
      tier.release(t);
    }
    if (src) src->end();
    tier.end_update();
  } catch (...) {
    close();
    throw;
  }
}

}  // namespace mt::optim
