#include "model/mlp.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "nn/layers.h"

namespace mt::model {

void MlpConfig::validate() const {
  MT_CHECK_INPUT(n_inputs > 0, "MLP input size must be positive, got ", n_inputs);
  MT_CHECK_INPUT(n_classes > 1, "MLP needs at least 2 classes, got ", n_classes);
  for (int h : hidden) MT_CHECK_INPUT(h > 0, "--hidden sizes must be positive, got ", h);
}

int64_t MlpConfig::num_params() const {
  int64_t n = 0, prev = n_inputs;
  for (int h : hidden) {
    n += prev * h + h;
    prev = h;
  }
  return n + prev * n_classes + n_classes;
}

std::map<std::string, std::string> MlpConfig::to_metadata() const {
  std::string h;
  for (size_t i = 0; i < hidden.size(); i++) h += (i ? "," : "") + std::to_string(hidden[i]);
  return {{"model", "mlp"}, {"n_inputs", std::to_string(n_inputs)}, {"hidden", h},
          {"n_classes", std::to_string(n_classes)}};
}

std::vector<int> Mlp::widths() const {
  std::vector<int> w{cfg_.n_inputs};
  w.insert(w.end(), cfg_.hidden.begin(), cfg_.hidden.end());
  w.push_back(cfg_.n_classes);
  return w;
}

Mlp::Mlp(const MlpConfig& cfg, nn::ParamRegistry& params) : cfg_(cfg), params_(params) {
  cfg_.validate();
  auto w = widths();
  for (size_t i = 0; i + 1 < w.size(); i++) {
    std::string n = "fc" + std::to_string(i);
    w_.push_back(&params.add(n + ".weight", {w[i], w[i + 1]}, {}, (int)i));
    w_.back()->products = true;
    w_.back()->read_f32 = false;
    b_.push_back(&params.add(n + ".bias", {w[i + 1]}, {}, (int)i));
  }
}

void Mlp::init(uint64_t seed) {
  for (nn::Param& p : params_.params()) init_param(p, seed);
}

void Mlp::init_param(nn::Param& p, uint64_t seed) const {
  if (p.decay)
    params_.init_normal(p.name, seed, std::sqrt(2.0f / (float)p.full_shape[0]));
  else
    params_.init_constant(p.name, 0.0f);
}

namespace {
std::string act(size_t i) { return "a" + std::to_string(i); }
}  // namespace

double Mlp::forward(nn::ActivationStore& store, int mb, const float* x, const int32_t* labels, int N, float dscale,
                    nn::ParamHooks* hooks) {
  nn::GroupHooks hk(params_, hooks);
  auto w = widths();
  // a0 = input (copied: backward needs it after the caller's batch buffer is reused), a{i+1} = layer i out.
  float* a = store.get(mb, act(0), (size_t)N * w[0]);
  std::memcpy(a, x, sizeof(float) * N * w[0]);
  for (size_t i = 0; i < w_.size(); i++) {
    float* out = store.get(mb, act(i + 1), (size_t)N * w[i + 1]);
    hk.before_forward((int)i);
    nn::linear_forward(out, a, w_[i]->weight(), b_[i]->data, N, w[i], w[i + 1], nullptr, prec_);
    hk.after_forward((int)i);
    if (i + 1 < w_.size()) nn::relu_forward(out, out, (size_t)N * w[i + 1]);
    a = out;
  }
  if (!labels) return 0.0;
  auto* lab = reinterpret_cast<int32_t*>(store.get(mb, "labels", N));
  std::memcpy(lab, labels, sizeof(int32_t) * N);
  return nn::softmax_cross_entropy(a, labels, N, cfg_.n_classes, dscale, nullptr);
}

void Mlp::backward(nn::ActivationStore& store, int mb, int N, nn::ParamHooks* hooks) {
  nn::GroupHooks hk(params_, hooks);
  auto w = widths();
  const size_t L = w_.size();
  size_t widest = 0;
  for (int x : w) widest = std::max(widest, (size_t)x);
  float* g = store.get(-1, "dmlp_a", (size_t)N * widest);
  float* g2 = store.get(-1, "dmlp_b", (size_t)N * widest);
  std::memcpy(g, store.get(mb, act(L), (size_t)N * w[L]), sizeof(float) * N * w[L]);  // dlogits
  for (size_t i = L; i-- > 0;) {
    const float* in = store.get(mb, act(i), (size_t)N * w[i]);
    hk.before_backward((int)i);
    nn::linear_backward(i > 0 ? g2 : nullptr, w_[i]->grad_out(), b_[i]->grad_out(), g, in, w_[i]->weight(), N, w[i],
                        w[i + 1], false, prec_);
    hk.after_backward((int)i);
    if (i > 0) {
      nn::relu_backward(g2, in, g2, (size_t)N * w[i]);
      std::swap(g, g2);
    }
  }
}

double Mlp::evaluate(nn::ActivationStore& store, const float* x, const int32_t* labels, int N, int64_t* correct,
                     nn::ParamHooks* hooks) {
  const int kEval = -2;
  forward(store, kEval, x, nullptr, N, 0.0f, hooks);
  const float* logits = store.get(kEval, act(w_.size()), (size_t)N * cfg_.n_classes);
  double loss = nn::cross_entropy_loss(logits, labels, N, cfg_.n_classes, correct);
  store.release(kEval);
  return loss;
}

}  // namespace mt::model
