// The set-up of the exchange tests that drive one method step by step with exact small-integer arithmetic
// (local_sgd_exchange_test.cpp, gossip_exchange_test.cpp): parameters a (3 floats) and b (2 x 2, group 1), all
// starting at 0, under the store and the exchange that SyncOptions o gives on mesh, and SGD without momentum or
// decay. step() runs one step with rank r's gradient of element i = r + 1 + i + s at lr 1/2. What each method's
// parameters must then hold stays with its test.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>

#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "parallel/mesh/mesh.h"
#include "trace/chrome_trace.h"
#include "train/grad_sync.h"

namespace mt::test {

struct SgdExchangeRig {
  nn::ParamRegistry params;
  std::unique_ptr<parallel::DataParallel> store;
  trace::ChromeTrace tracer;
  std::unique_ptr<train::GradSync> sync;
  std::unique_ptr<optim::Sgd> opt;

  SgdExchangeRig(const train::SyncOptions& o, const parallel::Mesh& mesh, const train::StoreGroups& on) {
    params.add("a", {3});
    params.add("b", {2, 2}, {}, 1);
    store = std::make_unique<parallel::DataParallel>(params, on.group, o.engine, on.experts);
    sync = train::make_grad_sync(o, mesh, *store, params, &tracer);
    optim::SgdConfig sgd;
    sgd.momentum = 0.0f;
    opt = std::make_unique<optim::Sgd>(store->state_size(), sgd);
    store->initialize([](nn::Param& p) {
      for (size_t i = 0; i < p.numel; i++) p.data[i] = 0.0f;
    });
  }

  // Step s on rank r: begin, the gradients, reduce, update at lr 1/2; the exchange's fields of the step's row.
  nlohmann::json step(int64_t s, int r) {
    sync->begin_step(s);
    for (nn::Param& p : params.params())
      for (size_t i = 0; i < p.numel; i++) p.grad_acc()[i] = (float)(r + 1 + (int64_t)i + s);
    sync->reduce(s);
    sync->update(*opt, 0.5f, s);
    nlohmann::json row;
    sync->annotate(row);
    return row;
  }
};

}  // namespace mt::test
