#include "train/observers.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "core/fs.h"
#include "train/weight_versions.h"

namespace mt::train {

Cadence Cadence::from(const TrainConfig& cfg, bool has_eval) {
  return {cfg.steps, cfg.stop_at_step, cfg.eval_every, cfg.save_every, has_eval, !cfg.checkpoint_dir.empty()};
}

// ---- RunLog. ----

RunLog::RunLog(const TrainConfig& cfg, bool lead, int64_t start, const std::string& item_name)
    : progress_(start, cfg.steps, cfg.log_every, cfg.progress && lead, item_name.c_str()),
      items_key_(item_name == "tok" ? "tokens_per_s" : "examples_per_s") {
  // On resume, rows from the resumed step on (written before a crash) are dropped: the file reads as one run.
  if (lead && !cfg.metrics.empty())
    metrics_ = cfg.resume.empty() ? trace::MetricsWriter(cfg.metrics, false)
                                  : trace::MetricsWriter::resume_at(cfg.metrics, start);
}

void RunLog::step(const nlohmann::json& row, int64_t s, double loss, float lr, double items_per_s) {
  try {
    metrics_.write(row);
  } catch (const Error& e) {
    progress_.finish();  // the message on a line of its own
    throw Error(str(e.what(), ", at the row of step ", s, ckpt_ ? "; " + ckpt_->last_checkpoint() : std::string()));
  }
  progress_.step(s, loss, lr, items_per_s);
}

// ---- RowQueue. ----

void RowQueue::merge(int64_t s, const nlohmann::json& part) {
  auto it = rows_.try_emplace(s, nlohmann::json::object()).first;
  it->second.update(part);
  while (!rows_.empty()) {
    const nlohmann::json& row = rows_.begin()->second;
    if (!row.contains("loss") || !row.contains("step")) return;  // a part is still to come
    const double loss = row["loss"].get<double>();
    log_.step(row, rows_.begin()->first, loss, row["lr"].get<float>(), row[log_.items_key()].get<double>());
    sum_.final_loss = loss;
    rows_.erase(rows_.begin());
  }
}

// ---- Evaluator. ----

void Evaluator::operator()(int64_t s, nlohmann::json& row) {
  const parallel::MeshCoord& c = mesh_.coord();
  EvalSums ev = task_.evaluate(batches_, c.dp, mesh_.grid().dp(), hooks_);
  double v[3] = {ev.loss, ev.correct, ev.count};
  mesh_.sum(parallel::MeshGroup::pp, v, 3);  // only the last stage has them
  mesh_.sum(parallel::MeshGroup::dp, v, 3);
  const double vloss = v[0] / v[2];
  row["val_loss"] = vloss;
  char buf[96];
  if (task_.is_classifier()) {
    row["val_accuracy"] = v[1] / v[2];
    std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f, val accuracy %.2f%%", (long long)s + 1, vloss,
                  100 * v[1] / v[2]);
  } else {
    std::snprintf(buf, sizeof buf, "step %lld: val loss %.4f", (long long)s + 1, vloss);
  }
  log_.message(buf);
}

// ---- Checkpointer. ----

Checkpointer::Checkpointer(const TrainConfig& cfg, Consolidation& state, const parallel::Mesh& mesh,
                           std::map<std::string, std::string> metadata, int64_t items_per_step)
    : cfg_(cfg), state_(state), mesh_(mesh), metadata_(std::move(metadata)), items_per_step_(items_per_step) {
  // The inputs' content, read once here (up to 16 MiB each), never in a step.
  if (mesh_.lead() && (!cfg_.checkpoint_dir.empty() || !cfg_.resume.empty())) {
    inputs_["data_fingerprint"] = file_fingerprint(cfg_.data);
    if (!cfg_.labels.empty()) inputs_["labels_fingerprint"] = file_fingerprint(cfg_.labels);
  }
}

nlohmann::json Checkpointer::run_identity() const {
  // Keys are the flags' names with '_' for '-' (warn_if_changed derives the flag). The model's shape is
  // not here: resume takes it from the checkpoint's weights (GptTaskConfig::from). Layout flags (--nproc,
  // --tp, --zero, ...) do not change the math; --steps does, through the learning-rate schedule.
  const TrainConfig& c = cfg_;
  nlohmann::json j = {{"seed", c.seed},
                      {"batch_size", c.batch_size},
                      {"steps", c.steps},
                      {"lr", c.lr},
                      {"min_lr", c.min_lr},
                      {"warmup_steps", c.warmup_steps},
                      {"weight_decay", c.weight_decay},
                      {"grad_clip", c.grad_clip},
                      {"grad_comm_dtype", flag_name(c.grad_comm_dtype)},
                      {"delayed_update", delay_one(c)}};  // the delay-1 rule, by either flag
  if (c.model == ModelKind::gpt) j["seq_len"] = c.seq_len;
  if (c.model == ModelKind::mlp && c.val_data.empty()) j["val_fraction"] = c.val_fraction;  // splits --data
  if (c.optimizer == OptimizerKind::adamw || c.optimizer == OptimizerKind::lamb ||
      c.optimizer == OptimizerKind::onebit_adam) {
    j["beta1"] = c.beta1;
    j["beta2"] = c.beta2;
    j["eps"] = c.eps;
  } else if (c.optimizer == OptimizerKind::sgd) {
    j["momentum"] = c.momentum;
  }
  if (c.optimizer == OptimizerKind::onebit_adam || (c.dgc && c.freeze_step >= 0)) j["freeze_step"] = c.freeze_step;
  if (c.dgc_no_masking) j["dgc_no_masking"] = true;
  if (c.dgc_dense_vectors) j["dgc_dense_vectors"] = true;
  if (c.dgc_global_topk) j["dgc_global_topk"] = true;
  if (c.dgc_split_clip) j["dgc_split_clip"] = true;
  if (c.dgc_lr_scale != 1.0) j["dgc_lr_scale"] = c.dgc_lr_scale;
  if (metadata_.count("moe_every")) {
    j["capacity_factor"] = c.moe.capacity_factor;
    j["moe_group_windows"] = c.moe.group_windows;
    j["moe_second_policy"] = flag_name(c.moe.second_policy);
    j["moe_aux_loss"] = c.moe.aux_loss;
    j["moe_z_loss"] = c.moe.z_loss;
  }
  j.update(inputs_);
  return j;
}

namespace {

size_t total_size(const std::vector<std::vector<float>*>& bufs) {
  size_t n = 0;
  for (const auto* b : bufs) n += b->size();
  return n;
}

std::string exchange_tensor(int rank) { return str("exchange.rank", rank); }

}  // namespace

void Checkpointer::gather_exchange(std::vector<std::vector<float>>& per_rank, std::vector<uint64_t>& sizes) {
  const std::vector<std::vector<float>*> bufs = exchange_->state_buffers();
  std::vector<float> mine;
  mine.reserve(total_size(bufs));
  for (const auto* b : bufs) mine.insert(mine.end(), b->begin(), b->end());
  comm::Communicator* world = mesh_.world();
  const int n = world ? world->size() : 1, me = world ? world->rank() : 0;
  sizes.assign((size_t)n, 0);
  const uint64_t my_size = mine.size();
  if (world && n > 1)
    world->all_gather(&my_size, sizes.data(), sizeof(uint64_t) * (size_t)n, comm::DType::u8);  // 8 bytes a rank
  else
    sizes[0] = my_size;
  per_rank.assign((size_t)n, {});
  MT_ASSERT(!mesh_.lead() || me == 0, "the lead writing checkpoints is world rank 0, not ", me);
  constexpr int kTag = 7207;  // the exchange state's messages to the lead
  if (!mesh_.lead()) {
    if (my_size) world->send(mine.data(), my_size, comm::DType::f32, 0, kTag);
    return;
  }
  per_rank[(size_t)me] = std::move(mine);
  for (int r = 0; r < n; r++) {
    if (r == me || sizes[(size_t)r] == 0) continue;
    per_rank[(size_t)r].resize(sizes[(size_t)r]);
    world->recv(per_rank[(size_t)r].data(), sizes[(size_t)r], comm::DType::f32, r, kTag);
  }
}

int64_t Checkpointer::resume() {
  if (cfg_.resume.empty()) return 0;
  std::string fallback;
  const std::string path = checkpoint::resolve_checkpoint(cfg_.resume, &fallback);
  if (mesh_.lead() && !fallback.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", fallback.c_str());
  // The exchange's state resumes when the checkpoint holds it for this method under the same layout: this
  // rank's buffers are then read from the file with the rest; otherwise they start at zero, and the lead says so.
  std::vector<float> exchange_in;
  std::vector<checkpoint::NamedTensorOut> targets = state_.factored_targets();
  if (exchange_) {
    nlohmann::json st;
    try {
      st = nlohmann::json::parse(read_file(path + "/state.json"));
    } catch (const std::exception&) {  // load_checkpoint names what is wrong with the file
    }
    const nlohmann::json saved = st.is_object() ? st.value("exchange_state", nlohmann::json()) : nlohmann::json();
    comm::Communicator* world = mesh_.world();
    const int n = world ? world->size() : 1, me = world ? world->rank() : 0;
    const size_t mine = total_size(exchange_->state_buffers());
    const bool same = saved.is_object() && saved.value("method", "") == exchange_->state_method() &&
                      saved.value("ranks", 0) == n && saved.contains("sizes") && saved.at("sizes").is_array() &&
                      (int)saved.at("sizes").size() == n && saved.at("sizes").at((size_t)me).is_number_unsigned() &&
                      saved.at("sizes").at((size_t)me).get<uint64_t>() == mine;
    // Every rank must agree (a rank whose sizes differ makes the whole run start over at zero).
    float ok[1] = {same ? 0.0f : 1.0f};
    if (world && n > 1) world->all_reduce(ok, ok, 1, comm::DType::f32, comm::ReduceOp::sum);
    if (ok[0] == 0.0f && mine > 0) {
      exchange_in.resize(mine);
      targets.push_back({exchange_tensor(me), {(int64_t)mine}, exchange_in.data()});
    } else if (ok[0] != 0.0f && mesh_.lead() && st.is_object()) {
      std::fprintf(stderr,
                   "meshtrain: warning: %s holds no exchange state for %s over %d ranks (%s): %s\n",
                   path.c_str(), exchange_->state_method().c_str(), n,
                   saved.is_object() ? str("saved: ", saved.value("method", "?"), " over ", saved.value("ranks", 0),
                                           " ranks").c_str()
                                     : "saved by a run without it",
                   exchange_->state_fallback().c_str());
    }
  }
  if (delay_one(cfg_)) {  // the second weight version must be in the files: say so before reading them
    nlohmann::json st;
    try {
      st = nlohmann::json::parse(read_file(path + "/state.json"));
    } catch (const std::exception&) {  // load_checkpoint names what is wrong with the file
    }
    MT_CHECK_INPUT(!st.is_object() || st.value("weight_versions", 1) == 2, path,
                   " was written by a run without the delay-1 rule (no --delayed-update or --schedule pipedream-2bw):"
                   " it holds no previous weight version W(t-1) for this run to resume the rule with");
  }
  const nn::ParamRegistry& full = state_.layout().full();
  std::vector<float> whole(full.size());
  const std::vector<std::string> names = state_.state_names();
  std::vector<std::vector<float>> states(names.size(), std::vector<float>(full.size()));
  checkpoint::NamedFlatOut outs;
  for (size_t k = 0; k < names.size(); k++) outs.push_back({names[k], states[k].data()});
  nlohmann::json st = checkpoint::load_checkpoint(path, full, whole.data(), outs, targets);
  state_.load(whole.data(), states);
  if (!exchange_in.empty()) {
    size_t at = 0;
    for (std::vector<float>* b : exchange_->state_buffers()) {
      std::copy(exchange_in.begin() + (long)at, exchange_in.begin() + (long)(at + b->size()), b->begin());
      at += b->size();
    }
    exchange_->state_loaded();
  }
  const int64_t start = st["step"].get<int64_t>();
  const std::string model = flag_name(cfg_.model), optimizer = flag_name(cfg_.optimizer);
  MT_CHECK_INPUT(st.value("model", model) == model, path, " holds a ", st.value("model", ""), " model but --model is ",
                 model);
  MT_CHECK_INPUT(st.value("optimizer", optimizer) == optimizer, path, " was trained with ", st.value("optimizer", ""),
                 " but --optimizer is ", optimizer);
  MT_CHECK_INPUT(start <= cfg_.steps, path, " is at step ", start, ", beyond --steps ", cfg_.steps);
  MT_CHECK_INPUT(start >= 0, path, ": state.json has a negative step ", start);
  if (mesh_.lead()) warn_if_changed(path, st);
  written_.push_back({start, path});
  return start;
}

void Checkpointer::warn_if_changed(const std::string& path, const nlohmann::json& st) const {
  // A changed flag or input continues the run, but not as the one saved: say which.
  const nlohmann::json now = run_identity();
  for (const auto& [key, value] : now.items()) {
    if (key.ends_with("_fingerprint") || !st.contains(key) || st[key] == value) continue;
    std::string flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::fprintf(stderr, "meshtrain: warning: %s was saved with %s %s; resuming with %s\n", path.c_str(), flag.c_str(),
                 st[key].dump().c_str(), value.dump().c_str());
  }
  // Inputs by content: the same bytes at another path are the same data; new bytes at the same path are not.
  const std::pair<const char*, const std::string*> inputs[] = {{"data", &cfg_.data}, {"labels", &cfg_.labels}};
  for (const auto& [name, now_path] : inputs) {
    const std::string key = str(name, "_fingerprint");
    const std::string saved = !st.contains(name)     ? "?"
                              : st[name].is_string() ? st[name].get<std::string>()
                                                     : st[name].dump();
    if (st.contains(key) && now.contains(key) && st[key] != now[key])
      std::fprintf(stderr,
                   "meshtrain: warning: %s was saved with --%s %s (content %s); --%s %s holds other content (%s): "
                   "the run continues on different data\n",
                   path.c_str(), name, saved.c_str(), st[key].dump().c_str(), name, now_path->c_str(),
                   now[key].dump().c_str());
    else if (!st.contains(key) && st.contains(name) && saved != *now_path)  // saved before fingerprints
      std::fprintf(stderr, "meshtrain: warning: %s was saved with --%s %s; resuming with %s\n", path.c_str(), name,
                   saved.c_str(), now_path->c_str());
  }
}

std::string Checkpointer::last_checkpoint() const {
  if (!written_.empty())
    return str("the last checkpoint is ", written_.back().second, " (step ", written_.back().first,
               "): continue from it with --resume ", written_.back().second);
  return cfg_.checkpoint_dir.empty() ? "no checkpoint is kept (no --checkpoint-dir)"
                                     : "no checkpoint was written yet (--save-every K writes one every K steps)";
}

void Checkpointer::save(int64_t next_step) {
  state_.gather_params(whole_);
  std::vector<std::pair<std::string, std::vector<float>>> states;
  state_.gather_states(states);
  std::vector<FactoredState> factored;
  state_.gather_factored(factored);
  std::vector<std::vector<float>> exchange;
  std::vector<uint64_t> exchange_sizes;
  if (exchange_) gather_exchange(exchange, exchange_sizes);
  if (!mesh_.lead()) {  // the lead writes; every rank knows what, so all give the same advice on divergence
    written_.push_back(
        {next_step, (std::filesystem::path(cfg_.checkpoint_dir) / checkpoint::step_name(next_step)).string()});
    return;
  }
  checkpoint::NamedFlat named;
  for (auto& [name, buf] : states) named.push_back({name, buf.data()});
  const parallel::MeshGrid& g = mesh_.grid();
  nlohmann::json st = {{"step", next_step},
                       {"model", flag_name(cfg_.model)},
                       {"optimizer", flag_name(cfg_.optimizer)},
                       {"data", cfg_.data},
                       {"data_position", next_step * items_per_step_},
                       {"dp", g.dp()},
                       {"tp", g.tp()},
                       {"pp", g.pp()},
                       {"zero", cfg_.zero},
                       {"rng", {{"seed", cfg_.seed}, {"counter", 0}}},
                       {"weight_versions", delay_one(cfg_) ? 2 : 1}};
  if (!cfg_.labels.empty()) st["labels"] = cfg_.labels;
  st.update(run_identity());
  std::vector<checkpoint::NamedTensor> tensors;
  for (const FactoredState& f : factored) tensors.push_back({f.name, f.shape, f.data.data()});
  if (exchange_) {
    st["exchange_state"] = {{"method", exchange_->state_method()}, {"ranks", exchange_sizes.size()},
                            {"sizes", exchange_sizes}};
    for (size_t r = 0; r < exchange.size(); r++)
      if (!exchange[r].empty()) tensors.push_back({exchange_tensor((int)r), {(int64_t)exchange[r].size()}, exchange[r].data()});
  }
  std::string path = checkpoint::save_checkpoint(cfg_.checkpoint_dir, next_step, state_.layout().full(), whole_.data(),
                                                 named, metadata_, st, cfg_.keep_checkpoints, tensors);
  written_.push_back({next_step, path});
}

void Checkpointer::save_final() {
  if (cfg_.save.empty()) return;
  state_.gather_params(whole_);
  if (!mesh_.lead()) return;
  auto metadata = metadata_;
  metadata["format"] = "pt";
  checkpoint::save_params(cfg_.save, state_.layout().full(), metadata, whole_.data());
}

std::string Checkpointer::diverged_advice(int64_t s) {
  // A checkpoint taken right before this step holds the weights that diverge now: it is not good.
  std::string good;
  for (auto it = written_.rbegin(); it != written_.rend(); ++it) {
    if (it->first < s && std::filesystem::exists(it->second + "/state.json")) {
      good = it->second;
      break;
    }
  }
  if (mesh_.lead() && !cfg_.checkpoint_dir.empty() && !good.empty() && good != written_.back().second)
    checkpoint::set_latest(cfg_.checkpoint_dir, std::filesystem::path(good).filename().string());
  return ". " + (written_.empty() ? std::string("No checkpoint was written")
                 : good.empty()   ? "No good checkpoint exists (" + written_.back().second +
                                      " holds the weights that diverge)"
                                  : "The last good checkpoint is " + good);
}

// ---- Trace. ----

void write_trace(const std::string& path, const trace::ChromeTrace& tracer, const parallel::Mesh& mesh) {
  if (path.empty()) return;
  const int W = mesh.grid().world();
  write_file_atomic(trace::trace_part_path(path, mesh.world_rank()), tracer.events_json());
  if (mesh.world() && W > 1) mesh.world()->barrier();
  if (!mesh.lead()) return;
  std::vector<std::string> bodies;
  for (int r = 0; r < W; r++) {
    const std::string part = trace::trace_part_path(path, r);
    bodies.push_back(read_file(part));
    std::filesystem::remove(part);
  }
  trace::ChromeTrace::write_merged(path, bodies);
}

}  // namespace mt::train
