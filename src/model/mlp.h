// A multilayer perceptron classifier: fc0 .. fc{n} Linear layers (Conv1D layout, weight [in, out]) with
// ReLU between them and softmax cross-entropy on the last. Legend: N examples, D input features, K classes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/activation_store.h"
#include "nn/param_hooks.h"
#include "nn/params.h"
#include "tensor/blas.h"

namespace mt::model {

struct MlpConfig {
  int n_inputs = 0;
  std::vector<int> hidden;
  int n_classes = 0;

  void validate() const;
  int64_t num_params() const;
  std::map<std::string, std::string> to_metadata() const;
};

class Mlp {
 public:
  Mlp(const MlpConfig& cfg, nn::ParamRegistry& params);
  const MlpConfig& config() const { return cfg_; }
  // The precision of the layers' products, forward and backward (tensor/blas.h; --precision).
  void set_precision(Precision p) { prec_ = p; }

  // Weights normal(0, sqrt(2 / fan_in)) (He, for ReLU), biases 0; counter-based.
  void init(uint64_t seed);
  void init_param(nn::Param& p, uint64_t seed) const;

  // Parameter groups (nn/param_hooks.h): group i = layer fc{i}.
  // x[N,D] -> with labels: summed loss, dlogits * dscale left for backward.
  double forward(nn::ActivationStore& store, int mb, const float* x, const int32_t* labels, int N, float dscale,
                 nn::ParamHooks* hooks = nullptr);
  void backward(nn::ActivationStore& store, int mb, int N, nn::ParamHooks* hooks = nullptr);
  // Evaluation: summed loss and number of correct argmax predictions.
  double evaluate(nn::ActivationStore& store, const float* x, const int32_t* labels, int N, int64_t* correct,
                  nn::ParamHooks* hooks = nullptr);

 private:
  std::vector<int> widths() const;  // D, hidden..., K
  MlpConfig cfg_;
  nn::ParamRegistry& params_;
  std::vector<nn::Param*> w_, b_;
  Precision prec_ = Precision::fp32;
};

}  // namespace mt::model
