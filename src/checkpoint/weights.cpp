#include "checkpoint/weights.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"

namespace mt::checkpoint {

namespace {

std::string strip_prefix(const std::string& name) {
  static const std::string kPrefix = "transformer.";
  return name.rfind(kPrefix, 0) == 0 ? name.substr(kPrefix.size()) : name;
}

bool is_ignored_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

// file tensor (after prefix stripping) by meshtrain name.
std::map<std::string, const TensorInfo*> index_by_name(const SafetensorsReader& file) {
  std::map<std::string, const TensorInfo*> out;
  for (const TensorInfo& t : file.tensors()) {
    std::string n = strip_prefix(t.name);
    MT_CHECK_INPUT(!out.count(n), file.path(), ": tensor ", n, " appears twice (with and without 'transformer.')");
    out[n] = &t;
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

int parse_meta_int(const SafetensorsReader& file, const std::string& key, const std::string& value) {
  int v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  MT_CHECK_INPUT(ec == std::errc() && p == value.data() + value.size() && v > 0, file.path(), ": metadata ", key,
                 "=\"", value, "\" is not a positive decimal integer");
  return v;
}

// Hugging Face GPT-2 files may carry lm_head.weight, the output head this GPT ties to wte.weight (the same
// matrix). Accepted when it is a copy of wte, bit for bit in the file's dtype (or, dtypes differing, as float32);
// any other lm_head is a model this one cannot represent: an InputError naming both tensors.
bool is_tied_head_copy(const SafetensorsReader& file, const std::map<std::string, const TensorInfo*>& tensors,
                       const std::string& name) {
  if (name != "lm_head.weight" || !tensors.count("wte.weight")) return false;
  const TensorInfo& head = *tensors.at(name);
  const TensorInfo& wte = *tensors.at("wte.weight");
  MT_CHECK_INPUT(head.shape == wte.shape, file.path(), ": tensor ", head.name, " has shape ", shape_str(head.shape),
                 " but ", wte.name, " has ", shape_str(wte.shape),
                 "; this GPT ties its output head to the token embedding, so lm_head must be a copy of wte");
  bool same = false;
  if (head.dtype == wte.dtype) {
    same = std::memcmp(file.bytes(head), file.bytes(wte), head.end - head.begin) == 0;
  } else {
    std::vector<float> a((size_t)head.numel()), b((size_t)wte.numel());
    file.read_f32(head.name, a.data(), head.numel());
    file.read_f32(wte.name, b.data(), wte.numel());
    same = a == b;
  }
  MT_CHECK_INPUT(same, file.path(), ": tensor ", head.name, " differs from ", wte.name,
                 "; this GPT ties its output head to the token embedding, so an untied lm_head cannot be loaded");
  return true;
}

}  // namespace

// The MoE shape (moe_every, experts, moe_top_k, expert_hidden): a flag (non-zero) must agree with the file's
// metadata, and both with what the tensors show (which blocks have a router, how many experts, their width).
template <class Index>
void moe_config_from_file(const SafetensorsReader& file, const Index& tensors, const model::GptConfig& flags,
                          model::GptConfig& cfg) {
  int first_router = -1, experts = 0, hidden = 0;
  std::set<int> routers;
  auto ends_with = [](const std::string& n, const char* suffix) {
    const size_t k = std::strlen(suffix);
    return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
  };
  for (auto& [n, t] : tensors) {
    int layer = -1, e = -1;
    if (std::sscanf(n.c_str(), "h.%d.mlp.router.", &layer) == 1 && ends_with(n, ".mlp.router.weight"))
      routers.insert(layer);
    if (std::sscanf(n.c_str(), "h.%d.mlp.experts.%d.", &layer, &e) == 2) {
      experts = std::max(experts, e + 1);
      if (ends_with(n, ".c_fc.weight") && t->shape.size() == 2) hidden = (int)t->shape[1];
    }
  }
  if (!routers.empty()) first_router = *routers.begin();
  const auto& meta = file.metadata();
  struct Field {
    const char* key;
    const char* flag;
    int model::GptConfig::*member;
    int derived;
  };
  const Field fields[] = {{"moe_every", "--moe-every", &model::GptConfig::moe_every, first_router + 1},
                          {"experts", "--experts", &model::GptConfig::experts, experts},
                          {"moe_top_k", "--moe-top-k", &model::GptConfig::moe_top_k, 0},
                          {"expert_hidden", "--expert-hidden", &model::GptConfig::expert_hidden, hidden}};
  // Where each value came from, so that a bad one is reported as the file's key, not a flag never given.
  auto named = [&](const Field& f) {
    return flags.*f.member ? str("flag ", f.flag) : str(file.path(), " metadata ", f.key);
  };
  for (const Field& f : fields) {
    const int from_flag = flags.*f.member;
    auto it = meta.find(f.key);
    const int from_meta = it == meta.end() ? 0 : parse_meta_int(file, f.key, it->second);
    MT_CHECK_INPUT(!from_flag || !from_meta || from_flag == from_meta, "flag ", f.flag, " ", from_flag,
                   " disagrees with ", file.path(), " metadata ", f.key, "=", from_meta);
    const int v = from_flag ? from_flag : from_meta ? from_meta : f.derived;
    MT_CHECK_INPUT(!f.derived || !v || v == f.derived, file.path(), ": ", f.key, " is ", v, " (from ",
                   from_flag ? "flag " : "metadata ", from_flag ? f.flag : "", ") but the tensors give ", f.derived);
    cfg.*f.member = v;
  }
  if (cfg.moe_every > 0) {
    MT_CHECK_INPUT(cfg.moe_top_k <= 2, named(fields[2]), " is ", cfg.moe_top_k, "; experts per token must be 1 or 2");
    MT_CHECK_INPUT(cfg.moe_top_k <= cfg.experts, named(fields[2]), " is ", cfg.moe_top_k, ", more than the ",
                   cfg.experts, " experts (", named(fields[1]), ")");
    MT_CHECK_INPUT(cfg.moe_every <= cfg.n_layer, named(fields[0]), " is ", cfg.moe_every, ", more than the ",
                   cfg.n_layer, " layers: no block would have experts");
  }
  if (cfg.moe_every > 0 && cfg.moe_top_k == 0) cfg.moe_top_k = 1;
  if (cfg.moe_every == 0) cfg.experts = cfg.moe_top_k = cfg.expert_hidden = 0;
}

model::GptConfig gpt_config_from_file(const SafetensorsReader& file, const model::GptConfig& flags) {
  auto tensors = index_by_name(file);
  auto shape_of = [&](const std::string& n) -> const std::vector<int64_t>* {
    auto it = tensors.find(n);
    return it == tensors.end() ? nullptr : &it->second->shape;
  };
  // From the tensors.
  model::GptConfig derived;
  if (auto* s = shape_of("wte.weight"); s && s->size() == 2) {
    derived.vocab_size = (int)(*s)[0];
    derived.n_embd = (int)(*s)[1];
  }
  if (auto* s = shape_of("wpe.weight"); s && s->size() == 2) derived.n_positions = (int)(*s)[0];
  std::set<int> layer_ids;
  for (auto& [n, t] : tensors) {
    if (n.rfind("h.", 0) == 0) {
      size_t dot = n.find('.', 2);
      int id = -1;
      auto [p, ec] = std::from_chars(n.data() + 2, n.data() + (dot == std::string::npos ? n.size() : dot), id);
      MT_CHECK_INPUT(ec == std::errc() && id >= 0, file.path(), ": cannot parse the layer number of tensor ", n);
      layer_ids.insert(id);
    }
  }
  derived.n_layer = (int)layer_ids.size();

  model::GptConfig cfg;
  const auto& meta = file.metadata();
  struct Field {
    const char* key;
    const char* flag;
    int model::GptConfig::*member;
  };
  const Field fields[] = {{"n_layer", "--n-layer", &model::GptConfig::n_layer},
                          {"n_head", "--n-head", &model::GptConfig::n_head},
                          {"n_embd", "--n-embd", &model::GptConfig::n_embd},
                          {"vocab_size", "--vocab-size", &model::GptConfig::vocab_size},
                          {"n_positions", "--n-positions", &model::GptConfig::n_positions}};
  for (const Field& f : fields) {
    int from_flag = flags.*f.member;
    auto it = meta.find(f.key);
    int from_meta = it == meta.end() ? 0 : parse_meta_int(file, f.key, it->second);
    if (from_flag && from_meta) {
      MT_CHECK_INPUT(from_flag == from_meta, "flag ", f.flag, " ", from_flag, " disagrees with ", file.path(),
                     " metadata ", f.key, "=", from_meta);
    }
    int v = from_flag ? from_flag : from_meta ? from_meta : derived.*f.member;
    if (std::string(f.key) == "n_head") {
      MT_CHECK_INPUT(v > 0, file.path(), ": n_head is not in the file's metadata and cannot be derived from the",
                     " tensor shapes; pass --n-head");
    }
    MT_CHECK_INPUT(v > 0, file.path(), ": cannot determine ", f.key, " (no ", f.flag,
                   " flag, no metadata, no tensor that shows it)");
    if (derived.*f.member && v != derived.*f.member) {
      throw InputError(str(file.path(), ": ", f.key, " is ", v, " (from ", from_flag ? "flag" : "metadata",
                           ") but the tensors give ", derived.*f.member,
                           f.member == &model::GptConfig::n_layer ? " (count of h.{i} layers)" : ""));
    }
    cfg.*f.member = v;
  }
  moe_config_from_file(file, tensors, flags, cfg);
  cfg.validate();
  return cfg;
}

void check_tensors(const SafetensorsReader& file, const nn::ParamRegistry& params) {
  auto tensors = index_by_name(file);
  for (auto& [n, t] : tensors) {
    if (is_ignored_buffer(n)) continue;
    bool known = false;
    for (const nn::Param& p : params.params()) known = known || p.name == n;
    if (!known && is_tied_head_copy(file, tensors, n)) continue;
    MT_CHECK_INPUT(known, file.path(), ": unexpected tensor ", t->name,
                   " (not a parameter of this model; wrong --model or shape?)");
  }
  for (const nn::Param& p : params.params()) {
    auto it = tensors.find(p.name);
    MT_CHECK_INPUT(it != tensors.end(), file.path(), ": missing tensor ", p.name);
    const TensorInfo& t = *it->second;
    MT_CHECK_INPUT(t.shape == p.full_shape, file.path(), ": tensor ", t.name, " has shape ", shape_str(t.shape),
                   ", expected ", shape_str(p.full_shape));
  }
}

void load_param(const SafetensorsReader& file, nn::Param& p) {
  const TensorInfo* t = file.find(p.name);
  if (!t) t = file.find("transformer." + p.name);
  MT_CHECK_INPUT(t, file.path(), ": missing tensor ", p.name);
  if (p.shard.axis < 0) {
    file.read_f32(t->name, p.data, (int64_t)p.numel);
  } else {
    std::vector<float> full((size_t)t->numel());
    file.read_f32(t->name, full.data(), t->numel());
    for (size_t i = 0; i < p.numel; i++) p.data[i] = full[(size_t)p.full_index(i)];
  }
}

void load_params(const SafetensorsReader& file, nn::ParamRegistry& params) {
  check_tensors(file, params);
  for (nn::Param& p : params.params()) load_param(file, p);
}

void save_params(const std::string& path, const nn::ParamRegistry& params,
                 const std::map<std::string, std::string>& metadata, const float* flat) {
  SafetensorsWriter w;
  for (auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const nn::Param& p : params.params()) {
    MT_ASSERT(p.shard.axis < 0, "save_params on a sharded registry needs a gather first: ", p.name);
    w.add_f32(p.name, p.full_shape, flat ? flat + p.offset : p.data);
  }
  w.write(path);
}

}  // namespace mt::checkpoint
