// Weights as NumPy arrays and meshtrain's own forward pass:
//   load_weights(path)            -> {name: float32 array}, Hugging Face GPT-2 names and layouts as stored
//                                    (Conv1D weights [in, out]): {k: torch.from_numpy(v)} loads into GPT-2
//   read_metadata(path)           -> {key: str} (the model shape: n_layer, n_head, ...)
//   save_weights(path, w, meta)   -> a safetensors file `meshtrain train/sample --init` reads
//   forward(path, tokens)         -> logits [B, T, V] of every position, computed by model::Gpt
#include "checkpoint/weights.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bindings.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/gpt.h"
#include "nn/activation_store.h"
#include "tensor/blas.h"
#include "train/train_config.h"

namespace mt::py {

namespace {

using FloatArray = pb::array_t<float, pb::array::c_style | pb::array::forcecast>;

pb::dict load_weights(const std::string& path) {
  SafetensorsReader file(path);
  pb::dict out;
  for (const TensorInfo& t : file.tensors()) {
    FloatArray a(std::vector<pb::ssize_t>(t.shape.begin(), t.shape.end()));
    file.read_f32(t.name, a.mutable_data(), t.numel());  // F32 as is; BF16, F16, F64 converted; others refused
    out[pb::str(t.name)] = std::move(a);
  }
  return out;
}

std::map<std::string, std::string> read_metadata(const std::string& path) { return SafetensorsReader(path).metadata(); }

// A dict (a torch state_dict, an OrderedDict, too) of name -> array-like (NumPy arrays, CPU torch tensors via
// __array__, nested lists), converted to C-contiguous float32; metadata values may be numbers (written as str()).
void save_weights(const std::string& path, const pb::dict& weights, const pb::object& metadata) {
  SafetensorsWriter w;
  std::vector<FloatArray> keep;  // the writer reads the data at write()
  keep.reserve(weights.size());
  for (auto [k, v] : weights) {
    MT_CHECK_INPUT(pb::isinstance<pb::str>(k), "save_weights(", path, "): tensor names must be strings, got ",
                   std::string(pb::str(pb::repr(k))));
    const std::string name = k.cast<std::string>();
    FloatArray a = FloatArray::ensure(v);  // a null handle (Python error cleared) when not convertible
    if (!a) PyErr_Clear();
    MT_CHECK_INPUT(a, "save_weights(", path, "): tensor ", name, " is a ",
                   std::string(pb::str(v.get_type().attr("__name__"))), ", not convertible to a float32 array");
    keep.push_back(a);
    w.add_f32(name, std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), a.data());
  }
  if (!metadata.is_none()) {
    MT_CHECK_INPUT(pb::isinstance<pb::dict>(metadata), "save_weights(", path, "): metadata must be a dict");
    for (auto [k, v] : metadata.cast<pb::dict>())
      w.set_metadata(pb::str(k).cast<std::string>(), pb::str(v).cast<std::string>());
  }
  w.write(path);
}

// Logits of every position: the model's forward without targets (which stops after the final LayerNorm, "lnf"
// [B*T, C] in the store) and the tied head lnf wte^T, the product logits_last makes for the last position.
FloatArray forward(const std::string& path,
                   const pb::array_t<int64_t, pb::array::c_style | pb::array::forcecast>& tokens, int threads) {
  MT_CHECK_INPUT(tokens.ndim() == 1 || tokens.ndim() == 2, "forward(): tokens must be [T] or [B, T], got ",
                 tokens.ndim(), " dimensions");
  MT_CHECK_INPUT(threads >= 1 && threads <= train::kMaxThreads, "forward(): threads must be in [1, ",
                 train::kMaxThreads, "], got ", threads);
  const int B = tokens.ndim() == 2 ? (int)tokens.shape(0) : 1;
  const int T = (int)tokens.shape(tokens.ndim() - 1);
  SafetensorsReader file(path);
  model::GptConfig zero{0, 0, 0, 0, 0, 0, 0, 0, 0};  // every field from the file
  const model::GptConfig cfg = checkpoint::gpt_config_from_file(file, zero);
  MT_CHECK_INPUT(B >= 1 && T >= 1 && T <= cfg.n_positions, "forward(): ", B, " sequences of ", T,
                 " tokens; need at least one token and at most n_positions = ", cfg.n_positions, " (", path, ")");
  std::vector<int32_t> ids((size_t)B * T);
  const int64_t* src = tokens.data();
  for (size_t i = 0; i < ids.size(); i++) {
    MT_CHECK_INPUT(src[i] >= 0 && src[i] < cfg.vocab_size, "forward(): token ", src[i], " at position ", i,
                   " is outside the vocabulary [0, ", cfg.vocab_size, ") of ", path);
    ids[i] = (int32_t)src[i];
  }
  FloatArray logits(tokens.ndim() == 2 ? std::vector<pb::ssize_t>{B, T, cfg.vocab_size}
                                       : std::vector<pb::ssize_t>{T, cfg.vocab_size});
  float* out = logits.mutable_data();
  pb::gil_scoped_release no_gil;
  set_num_threads(threads);
  nn::ParamRegistry params;
  model::MoeOptions moe;
  moe.capacity_factor = 0;  // dropless, as `meshtrain sample`: a position's logits do not depend on the others'
  model::Gpt gpt(cfg, params, nullptr, {}, moe);
  checkpoint::check_tensors(file, params);
  params.finalize(true, false);
  checkpoint::load_params(file, params);
  nn::ActivationStore store;
  gpt.forward(store, 0, ids.data(), nullptr, B, T, 0.0f);
  const int C = cfg.n_embd, V = cfg.vocab_size;
  const float* lnf = store.get(0, "lnf", (size_t)B * T * C);
  gemm(false, true, B * T, V, C, 1.0f, lnf, C, params.get("wte.weight").data, C, 0.0f, out, V);
  return logits;
}

}  // namespace

void add_weights(pb::module_& m) {
  m.def("load_weights", &load_weights, pb::arg("path"),
        "{name: float32 NumPy array} of a safetensors file, Hugging Face GPT-2 names and layouts as stored, so "
        "{k: torch.from_numpy(v)} is a GPT-2 state dict");
  m.def("read_metadata", &read_metadata, pb::arg("path"), "the file's __metadata__ ({key: str}: the model shape)");
  m.def("save_weights", &save_weights, pb::arg("path"), pb::arg("weights"), pb::arg("metadata") = pb::none(),
        "writes {name: array-like} as float32 safetensors (atomically), with metadata {key: value}; "
        "`meshtrain train --init` reads it (n_head from the metadata or --n-head)");
  m.def("forward", &forward, pb::arg("path"), pb::arg("tokens"), pb::arg("threads") = 1,
        "logits [B, T, V] (or [T, V] for 1-D tokens) of every position, from meshtrain's GPT with the weights in path");
}

}  // namespace mt::py
