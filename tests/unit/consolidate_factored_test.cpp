// Factored optimizer state in checkpoints (train/consolidate.h stage 3, checkpoint/checkpoint.h): a small test
// optimizer declares, beside a flat buffer, a row and a column buffer per matrix (Adafactor's shape of state);
// a checkpoint saves each as one tensor of the optimizer file under its declared name and shape, and a resume
// into a fresh optimizer restores every buffer bit for bit. A file without one, or with another shape, is an
// error naming the tensor. The multi-rank union (one copy of a buffer several ranks hold) is in
// tests/multirank/union_factored_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "train/consolidate.h"

namespace {

// State: "fac.m" flat; for each matrix R x C, "fac.row/<tensor>" {R} and "fac.col/<tensor>" {C} (or {C + 1}
// when wrong_shape, to build a mismatch).
class Factored : public mt::optim::Optimizer {
 public:
  Factored(const mt::nn::ParamRegistry& reg, bool wrong_shape = false) {
    state_.declare_flat("fac.m", reg.size());
    for (const mt::nn::Param& p : reg.params()) {
      if (p.full_shape.size() != 2) continue;
      state_.declare("fac.row/" + p.name, {p.full_shape[0]});
      state_.declare("fac.col/" + p.name, {p.full_shape[1] + (wrong_shape ? 1 : 0)});
    }
  }
  void step(float*, const float*, const std::vector<mt::optim::Segment>&, float, int64_t) override {}
};

// One rank holding everything: the flat buffer is the registry's.
class Whole : public mt::train::FlatSource {
 public:
  explicit Whole(size_t n) : n_(n) {}
  void gather_params(std::vector<float>& flat) override { flat.assign(params_, params_ + n_); }
  void gather_state(const float* shard, std::vector<float>& flat) override { flat.assign(shard, shard + n_); }
  void load_params(const float*) override {}
  void load_state(const float* flat, float* shard) override { std::copy(flat, flat + n_, shard); }
  const float* params_ = nullptr;

 private:
  size_t n_;
};

void declare(mt::nn::ParamRegistry& reg) {
  reg.add("w", {3, 4});
  reg.add("bias", {5});
  reg.add("v", {2, 6});
  reg.finalize();
}

class FactoredCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("mt_factored_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Saves reg's parameters and opt's state (values: buffer k, element i -> 100 k + i + 0.5) as step 3.
  std::string save(mt::nn::ParamRegistry& reg, Factored& opt) {
    for (size_t k = 0; k < opt.state().count(); k++)
      for (size_t i = 0; i < opt.state().size(k); i++) opt.state().data(k)[i] = 100.0f * k + i + 0.5f;
    for (size_t i = 0; i < reg.size(); i++) reg.data()[i] = (float)i;
    Whole src(reg.size());
    src.params_ = reg.data();
    mt::train::Consolidation c(mt::train::StateConsolidator(reg, reg, {}, nullptr), src, opt);
    std::vector<float> whole;
    c.gather_params(whole);
    std::vector<std::pair<std::string, std::vector<float>>> states;
    c.gather_states(states);
    std::vector<mt::train::FactoredState> factored;
    c.gather_factored(factored);
    mt::checkpoint::NamedFlat named;
    for (auto& [n, b] : states) named.push_back({n, b.data()});
    std::vector<mt::checkpoint::NamedTensor> tensors;
    for (const auto& f : factored) tensors.push_back({f.name, f.shape, f.data.data()});
    return mt::checkpoint::save_checkpoint(dir_.string(), 3, reg, whole.data(), named, {}, {{"step", 3}}, 2, tensors);
  }

  // Resumes path into opt (fresh).
  void resume(const std::string& path, mt::nn::ParamRegistry& reg, Factored& opt) {
    Whole src(reg.size());
    mt::train::Consolidation c(mt::train::StateConsolidator(reg, reg, {}, nullptr), src, opt);
    std::vector<float> whole(reg.size());
    std::vector<std::vector<float>> states(c.state_names().size(), std::vector<float>(reg.size()));
    mt::checkpoint::NamedFlatOut outs;
    for (size_t k = 0; k < states.size(); k++) outs.push_back({c.state_names()[k], states[k].data()});
    mt::checkpoint::load_checkpoint(path, reg, whole.data(), outs, c.factored_targets());
    c.load(whole.data(), states);
  }

  std::filesystem::path dir_;
};

TEST_F(FactoredCheckpoint, SavedAsDeclaredAndRestored) {
  mt::nn::ParamRegistry reg;
  declare(reg);
  Factored opt(reg);
  ASSERT_EQ(opt.state().factored().size(), 4u);  // row and column of w and v
  const std::string path = save(reg, opt);

  // The optimizer file holds each factored buffer once, named and shaped as declared.
  mt::SafetensorsReader file(path + "/optimizer.safetensors");
  for (size_t k : opt.state().factored()) {
    const mt::TensorInfo* t = file.find(opt.state().at(k).name);
    ASSERT_NE(t, nullptr) << opt.state().at(k).name;
    EXPECT_EQ(t->shape, opt.state().at(k).shape) << t->name;
  }
  EXPECT_NE(file.find("fac.m/bias"), nullptr);
  EXPECT_EQ(file.find("fac.row/bias"), nullptr);  // a vector has no factored state here

  mt::nn::ParamRegistry reg2;
  declare(reg2);
  Factored fresh(reg2);
  resume(path, reg2, fresh);
  ASSERT_EQ(fresh.state().count(), opt.state().count());
  for (size_t k = 0; k < opt.state().count(); k++) {
    ASSERT_EQ(fresh.state().size(k), opt.state().size(k));
    for (size_t i = 0; i < opt.state().size(k); i++)
      ASSERT_EQ(fresh.state().data(k)[i], opt.state().data(k)[i]) << opt.state().at(k).name << "[" << i << "]";
  }
}

TEST_F(FactoredCheckpoint, MissingOrReshapedIsAnError) {
  mt::nn::ParamRegistry reg;
  declare(reg);
  Factored opt(reg, /*wrong_shape=*/true);
  const std::string path = save(reg, opt);
  mt::nn::ParamRegistry reg2;
  declare(reg2);
  Factored other(reg2);  // declares fac.col/w as {4}; the file has {5}
  try {
    resume(path, reg2, other);
    FAIL() << "a reshaped factored buffer was loaded";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer tensor fac.col/"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has shape [5], the optimizer declares [4]"), std::string::npos) << e.what();
  }
  // A checkpoint without factored state (an AdamW run's) does not resume a factored optimizer.
  mt::nn::ParamRegistry reg3;
  declare(reg3);
  std::vector<float> zeros(reg3.size());
  const std::string plain = mt::checkpoint::save_checkpoint((dir_ / "plain").string(), 1, reg3, zeros.data(),
                                                            {{"fac.m", zeros.data()}}, {}, {{"step", 1}}, 2);
  try {
    resume(plain, reg2, other);
    FAIL() << "a missing factored buffer was not noticed";
  } catch (const mt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no optimizer tensor fac.row/w"), std::string::npos) << e.what();
  }
}

}  // namespace
