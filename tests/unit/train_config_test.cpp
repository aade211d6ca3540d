// TrainConfig::validate, the --schedule part: the accepted names are the schedule registry's
// (parallel/pipeline/schedules/registry.cpp), not a list in train_config, so a generator added to the registry is
// accepted with no edit there; an unknown name lists the registered ones; the default is kDefaultSchedule.
#include "train/train_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "train/layout.h"

using mt::train::BatchLayout;
using mt::train::TrainConfig;

namespace {

// A two-stage pipeline with 4 micro-batches (interleaved's m % p == 0 holds), V chunks per rank.
TrainConfig pipeline_config(const std::string& schedule, int pp = 2, int V = 1) {
  TrainConfig c;
  c.data = "unused.bin";  // validate checks only that it is given
  c.gpt.n_layer = 4;
  c.batch_size = 8;
  c.micro_batch_size = 2;
  c.nproc = pp;
  c.pp = pp;
  c.schedule = schedule;
  c.virtual_stages = V;
  return c;
}

std::string error_of(const TrainConfig& c, int world) {
  try {
    c.validate(world);
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// The generator's own verdict on the spec the layout builds (p = 2, m = 4).
std::string generator_error(const std::string& name, int V) {
  try {
    mt::pipeline::validate({name, 2, 4, V});
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// The flag adds nothing to the registry: a name is accepted exactly where its generator accepts the spec, and
// every generator accepts one or two chunks per rank.
TEST(TrainConfigSchedule, EveryRegisteredNameIsAccepted) {
  ASSERT_FALSE(mt::pipeline::schedule_names().empty());
  for (const std::string& name : mt::pipeline::schedule_names()) {
    int accepted = 0;
    for (int V : {1, 2}) {
      const TrainConfig c = pipeline_config(name, 2, V);
      EXPECT_EQ(error_of(c, 2), generator_error(name, V)) << name << " V=" << V;
      if (error_of(c, 2) != "(no error)") continue;
      accepted++;
      EXPECT_EQ(BatchLayout(c, 1).schedule().name, name);
    }
    EXPECT_GE(accepted, 1) << name;
  }
}

TEST(TrainConfigSchedule, ZbVWithZeroTwoOrThreeIsRefusedNamingBothFlags) {
  // Its V puts both ends, and the one tied wte, on pipeline rank 0 (see the kRefused entry).
  for (int z : {2, 3}) {
    TrainConfig c = pipeline_config("zb-v", 2, 2);
    c.zero = z;
    const std::string e = error_of(c, 2);
    EXPECT_NE(e.find("--schedule zb-v with --zero " + std::to_string(z) + " is not supported"), std::string::npos) << e;
  }
  TrainConfig one = pipeline_config("zb-v", 2, 2);
  one.zero = 1;
  EXPECT_EQ(error_of(one, 2), "(no error)");
}

TEST(TrainConfigSchedule, ChimeraWithZeroTwoOrThreeIsRefusedNamingBothFlags) {
  // Its two copies of a stage are summed over their pair after the list, after ZeRO 2/3 would have reduced them.
  for (int z : {2, 3}) {
    TrainConfig c = pipeline_config("chimera", 2, 2);
    c.zero = z;
    const std::string e = error_of(c, 2);
    EXPECT_NE(e.find("--schedule chimera with --zero " + std::to_string(z) + " is not supported"), std::string::npos)
        << e;
  }
  TrainConfig one = pipeline_config("chimera", 2, 2);
  one.zero = 1;
  EXPECT_EQ(error_of(one, 2), "(no error)");
  one.micro_batch_size = 8;  // one micro-batch: the two pipelines cannot split it
  EXPECT_NE(error_of(one, 2).find("needs an even number of micro-batches per pipeline rank, got 1"), std::string::npos)
      << error_of(one, 2);
}

TEST(TrainConfigSchedule, UnknownNameListsTheRegistry) {
  const std::string e = error_of(pipeline_config("zero-bubble"), 2);
  EXPECT_NE(e.find("--schedule must be one of " + mt::pipeline::schedule_names_joined() + "; got 'zero-bubble'"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("gpipe, 1f1b, interleaved"), std::string::npos) << e;
  // Checked before the pipeline degree, so the message is about the name even without --pp.
  EXPECT_NE(error_of(pipeline_config("nosuch", 1), 1).find("got 'nosuch'"), std::string::npos);
}

TEST(TrainConfigSchedule, DefaultAndNeedsPipeline) {
  EXPECT_EQ(BatchLayout(pipeline_config(""), 1).schedule().name, "1f1b");
  EXPECT_EQ(std::string(mt::pipeline::kDefaultSchedule), "1f1b");
  EXPECT_EQ(error_of(pipeline_config(""), 2), "(no error)");
  TrainConfig one = pipeline_config("gpipe", 1);
  EXPECT_NE(error_of(one, 1).find("--schedule gpipe needs --pp > 1"), std::string::npos) << error_of(one, 1);
  one.schedule.clear();
  EXPECT_EQ(error_of(one, 1), "(no error)");
}

}  // namespace

// The delay-1 rule (--delayed-update, --schedule pipedream-2bw): what stays refused names both flags.
TEST(TrainConfigDelayOne, RefusedCombinationsNameBothFlags) {
  auto refused = [](const TrainConfig& c, int world, const std::string& a, const std::string& b) {
    const std::string e = error_of(c, world);
    EXPECT_NE(e.find(a), std::string::npos) << e;
    EXPECT_NE(e.find(b), std::string::npos) << e;
    EXPECT_NE(e.find("is not supported"), std::string::npos) << e;
  };
  for (int z : {2, 3}) {
    TrainConfig c = pipeline_config("pipedream-2bw", 2);
    c.nproc = 4;
    c.zero = z;
    refused(c, 4, "--schedule pipedream-2bw", "--zero " + std::to_string(z));
    c.schedule = "1f1b";  // the synchronous schedule takes ZeRO 2, 3, with or without the delayed update
    EXPECT_EQ(error_of(c, 4), "(no error)");
    c.delayed_update = true;
    EXPECT_EQ(error_of(c, 4), "(no error)");
  }
  for (int z : {0, 1}) {
    TrainConfig c = pipeline_config("pipedream-2bw", 2);
    c.nproc = 4;
    c.zero = z;
    EXPECT_EQ(error_of(c, 4), "(no error)") << "ZeRO " << z;
  }
  TrainConfig ps;
  ps.data = "unused.bin";
  ps.nproc = 3;
  ps.async = mt::train::AsyncMode::ps;
  EXPECT_EQ(error_of(ps, 3), "(no error)");
  ps.delayed_update = true;
  refused(ps, 3, "--delayed-update", "--async ps");
  TrainConfig hog;
  hog.data = "unused.bin";
  hog.model = mt::train::ModelKind::mlp;
  hog.optimizer = mt::train::OptimizerKind::sgd;
  hog.async = mt::train::AsyncMode::hogwild;
  hog.nproc = 2;
  EXPECT_EQ(error_of(hog, 1), "(no error)");
  hog.delayed_update = true;
  refused(hog, 1, "--delayed-update", "--async hogwild");
  TrainConfig local;
  local.data = "unused.bin";
  local.nproc = 2;
  local.local_sgd = 4;
  EXPECT_EQ(error_of(local, 2), "(no error)");
  local.delayed_update = true;
  refused(local, 2, "--delayed-update", "--local-sgd 4");
  TrainConfig dp;
  dp.data = "unused.bin";
  dp.nproc = 2;
  dp.delayed_update = true;
  for (int z = 0; z <= 3; z++) {
    dp.zero = z;
    EXPECT_EQ(error_of(dp, 2), "(no error)") << "--delayed-update --zero " << z;
  }
}

namespace {

// --optimizer lamb | adafactor with a method that hands the optimizer other gradients than the exact reduced
// one (--compress, --local-sgd) or steps slices of tensors (--async ps) is refused at config time, naming both
// flags; the same runs with AdamW are accepted (the refusal is the optimizer's).
TEST(TrainConfigOptimizer, WholeTensorOptimizersRefuseInexactExchanges) {
  struct Case {
    const char* method;
    void (*set)(TrainConfig&);
    int world;
  };
  const Case cases[] = {
      {"--compress topk:0.01", [](TrainConfig& c) { c.compress = mt::compress::parse_compress_spec("topk:0.01"); }, 2},
      {"--local-sgd 4", [](TrainConfig& c) { c.local_sgd = 4; }, 2},
      {"--async ps", [](TrainConfig& c) { c.async = mt::train::AsyncMode::ps; }, 3},
      {"--offload optimizer",
       [](TrainConfig& c) {
         c.offload.optimizer = true;
         c.offload.dir = "/tmp";
       },
       1},
  };
  for (const Case& k : cases) {
    for (auto opt : {mt::train::OptimizerKind::lamb, mt::train::OptimizerKind::adafactor}) {
      TrainConfig c;
      c.data = "unused.bin";
      c.nproc = k.world;
      k.set(c);
      c.optimizer = opt;
      const std::string e = error_of(c, k.world);
      const std::string flag = std::string("--optimizer ") + mt::train::flag_name(opt);
      EXPECT_NE(e.find(flag + " with " + k.method + " is not supported"), std::string::npos) << e;
      c.optimizer = mt::train::OptimizerKind::adamw;
      EXPECT_EQ(error_of(c, k.world), "(no error)") << k.method << " with AdamW";
    }
  }
}

// --sync gossip | decentralized-lowprec (train/gossip_sync.h): the plain run is accepted at dp 2 and 4 (both
// graphs); each combination of kRefused's decentralized rows is refused naming both flags; one rank is refused
// naming --nproc.
TEST(TrainConfigDecentralized, RefusalsNameBothFlags) {
  using mt::train::GossipGraphKind;
  using mt::train::SyncKind;
  auto base = [](SyncKind k, int world) {
    TrainConfig c;
    c.data = "unused.bin";
    c.nproc = world;
    c.sync = k;
    return c;
  };
  for (int world : {2, 4}) {
    EXPECT_EQ(error_of(base(SyncKind::gossip, world), world), "(no error)");
    TrainConfig e = base(SyncKind::gossip, world);
    e.gossip_graph = GossipGraphKind::exp;
    EXPECT_EQ(error_of(e, world), "(no error)");
    EXPECT_EQ(error_of(base(SyncKind::decentralized_lowprec, world), world), "(no error)");
  }
  struct Case {
    const char* second;
    void (*set)(TrainConfig&);
    int world;
  };
  const Case cases[] = {
      {"--zero 1", [](TrainConfig& c) { c.zero = 1; }, 2},
      {"--tp 2", [](TrainConfig& c) { c.tp = 2; }, 4},
      {"--pp 2", [](TrainConfig& c) { c.pp = 2; }, 4},
      {"--compress topk:0.01", [](TrainConfig& c) { c.compress = mt::compress::parse_compress_spec("topk:0.01"); }, 2},
      {"--local-sgd 4", [](TrainConfig& c) { c.local_sgd = 4; }, 2},
      {"--async ps", [](TrainConfig& c) { c.async = mt::train::AsyncMode::ps; }, 3},
      {"--optimizer lamb", [](TrainConfig& c) { c.optimizer = mt::train::OptimizerKind::lamb; }, 2},
      {"--optimizer adafactor", [](TrainConfig& c) { c.optimizer = mt::train::OptimizerKind::adafactor; }, 2},
      {"--optimizer onebit-adam",
       [](TrainConfig& c) {
         c.optimizer = mt::train::OptimizerKind::onebit_adam;
         c.freeze_step = 2;
       },
       2},
      {"--delayed-update", [](TrainConfig& c) { c.delayed_update = true; }, 2},
      {"--resume",
       [](TrainConfig& c) {
         c.resume = "ckpt";
         c.checkpoint_dir = "ckpt";
       },
       2},
  };
  for (SyncKind k : {SyncKind::gossip, SyncKind::decentralized_lowprec})
    for (const Case& x : cases) {
      TrainConfig c = base(k, x.world);
      x.set(c);
      const std::string e = error_of(c, x.world);
      const std::string first = std::string("--sync ") + mt::train::flag_name(k);
      EXPECT_NE(e.find(first), std::string::npos) << x.second << ": " << e;
      EXPECT_NE(e.find(x.second), std::string::npos) << e;
      EXPECT_NE(e.find("is not supported"), std::string::npos) << e;
    }
  TrainConfig lp = base(SyncKind::decentralized_lowprec, 4);
  lp.gossip_graph = GossipGraphKind::exp;
  const std::string e = error_of(lp, 4);
  EXPECT_NE(e.find("--sync decentralized-lowprec with --gossip-graph exp is not supported"), std::string::npos) << e;
  TrainConfig plain = base(SyncKind::exact, 2);
  plain.gossip_graph = GossipGraphKind::exp;
  const std::string g = error_of(plain, 2);
  EXPECT_NE(g.find("--gossip-graph exp needs --sync gossip (got --sync exact)"), std::string::npos) << g;
  const std::string one = error_of(base(SyncKind::gossip, 1), 1);
  EXPECT_NE(one.find("--sync gossip needs more than one data-parallel rank"), std::string::npos) << one;
  EXPECT_NE(one.find("--nproc"), std::string::npos) << one;
}

// --gossip-mix params | grads | both: accepted with --sync gossip (both graphs), refused naming both flags with
// any other --sync (exact: nothing to mix; decentralized-lowprec: its exchange is of compressed model
// differences only); not given (unset, both under gossip) is accepted with every --sync.
TEST(TrainConfigDecentralized, GossipMixNeedsSyncGossip) {
  using mt::train::GossipGraphKind;
  using mt::train::GossipMixKind;
  using mt::train::SyncKind;
  for (SyncKind k : {SyncKind::exact, SyncKind::gossip, SyncKind::decentralized_lowprec}) {
    TrainConfig c;
    c.data = "unused.bin";
    c.nproc = 2;
    c.sync = k;
    EXPECT_EQ(c.gossip_mix, GossipMixKind::unset);
    EXPECT_EQ(error_of(c, 2), "(no error)");
  }
  for (GossipMixKind m : {GossipMixKind::params, GossipMixKind::grads, GossipMixKind::both}) {
    for (GossipGraphKind g : {GossipGraphKind::ring, GossipGraphKind::exp}) {
      TrainConfig c;
      c.data = "unused.bin";
      c.nproc = 4;
      c.sync = SyncKind::gossip;
      c.gossip_graph = g;
      c.gossip_mix = m;
      EXPECT_EQ(error_of(c, 4), "(no error)");
    }
    for (SyncKind k : {SyncKind::exact, SyncKind::decentralized_lowprec}) {
      TrainConfig c;
      c.data = "unused.bin";
      c.nproc = 2;
      c.sync = k;
      c.gossip_mix = m;
      const std::string e = error_of(c, 2);
      const std::string want = std::string("--gossip-mix ") + mt::train::flag_name(m) + " needs --sync gossip (got --sync " +
                               mt::train::flag_name(k) + ")";
      EXPECT_NE(e.find(want), std::string::npos) << e;
    }
  }
}

}  // namespace

// Per-micro-batch updates (--schedule pipedream, pipemare): every refused combination names both flags; the
// combinations the parity test runs are accepted.
TEST(TrainConfigMicroUpdates, RefusedCombinationsNameBothFlags) {
  auto refused = [](const TrainConfig& c, int world, const std::string& a, const std::string& b) {
    const std::string e = error_of(c, world);
    EXPECT_NE(e.find(a), std::string::npos) << e;
    EXPECT_NE(e.find(b), std::string::npos) << e;
  };
  for (const std::string s : {"pipedream", "pipemare"}) {
    TrainConfig ok = pipeline_config(s, 2);
    EXPECT_EQ(error_of(ok, 2), "(no error)") << s;
    for (int z : {0, 1}) {
      TrainConfig c = pipeline_config(s, 2);
      c.nproc = 4;
      c.zero = z;
      EXPECT_EQ(error_of(c, 4), "(no error)") << s << " ZeRO " << z;
    }
    for (int z : {2, 3}) {
      TrainConfig c = pipeline_config(s, 2);
      c.nproc = 4;
      c.zero = z;
      refused(c, 4, "--schedule " + s, "--zero " + std::to_string(z));
    }
    TrainConfig d = pipeline_config(s, 2);
    d.delayed_update = true;
    refused(d, 2, "--schedule " + s, "--delayed-update");
    TrainConfig b = pipeline_config(s, 2);
    b.precision = mt::Precision::bf16;
    refused(b, 2, "--schedule " + s, "--precision bf16");
    TrainConfig o = pipeline_config(s, 2);
    o.offload.optimizer = true;
    o.offload.dir = "/tmp";
    refused(o, 2, "--schedule " + s, "--offload optimizer");
    TrainConfig moe = pipeline_config(s, 2);
    moe.gpt.moe_every = 2;
    moe.gpt.experts = 2;
    refused(moe, 2, "--schedule " + s, "--moe-every 2");
    TrainConfig l = pipeline_config(s, 2);
    l.nproc = 4;
    l.local_sgd = 4;
    refused(l, 4, "--schedule " + s, "--local-sgd 4");
    TrainConfig one = pipeline_config(s, 1);
    EXPECT_NE(error_of(one, 1).find("--schedule " + s), std::string::npos) << error_of(one, 1);
  }
  TrainConfig r = pipeline_config("pipemare", 2);
  r.recompute = true;
  refused(r, 2, "--schedule pipemare", "--recompute");
  r.schedule = "pipedream";  // its backward reads the forward's version: recomputing is exact
  EXPECT_EQ(error_of(r, 2), "(no error)");
  TrainConfig v = pipeline_config("pipemare", 2);
  v.vertical_sync = true;
  refused(v, 2, "--vertical-sync", "--schedule pipemare");
  v.schedule = "1f1b";
  refused(v, 2, "--vertical-sync", "--schedule 1f1b");
  v.schedule = "pipedream";
  EXPECT_EQ(error_of(v, 2), "(no error)");
}

// PipeMare's corrections: each flag needs --schedule pipemare at pp >= 2; the learning-rate rescheduling refuses
// the whole-tensor optimizers; the correction refuses --resume and a decay outside [0, 1).
TEST(TrainConfigMicroUpdates, PipeMareCorrectionFlags) {
  auto refused = [](const TrainConfig& c, int world, const std::string& a, const std::string& b) {
    const std::string e = error_of(c, world);
    EXPECT_NE(e.find(a), std::string::npos) << e;
    EXPECT_NE(e.find(b), std::string::npos) << e;
  };
  TrainConfig a = pipeline_config("pipemare", 2);
  a.pipemare_lr_anneal = 100;
  a.pipemare_correction = 0.5;
  EXPECT_EQ(error_of(a, 2), "(no error)");
  for (const std::string s : {"pipedream", "1f1b"}) {
    TrainConfig k = pipeline_config(s, 2);
    k.pipemare_lr_anneal = 100;
    refused(k, 2, "--pipemare-lr-anneal 100", "--schedule " + s);
    TrainConfig g = pipeline_config(s, 2);
    g.pipemare_correction = 0.5;
    refused(g, 2, "--pipemare-correction 0.5", "--schedule " + s);
  }
  TrainConfig l = pipeline_config("pipemare", 2);
  l.pipemare_lr_anneal = 100;
  l.optimizer = mt::train::OptimizerKind::lamb;
  refused(l, 2, "--pipemare-lr-anneal 100", "--optimizer lamb");
  TrainConfig r = pipeline_config("pipemare", 2);
  r.pipemare_correction = 0.5;
  r.resume = "/tmp/ck";
  r.checkpoint_dir = "/tmp/ck";
  refused(r, 2, "--pipemare-correction 0.5", "--resume");
  TrainConfig g = pipeline_config("pipemare", 2);
  g.pipemare_correction = 1.5;
  EXPECT_NE(error_of(g, 2).find("--pipemare-correction 1.5"), std::string::npos) << error_of(g, 2);
  g.pipemare_correction = 0.0;
  EXPECT_EQ(error_of(g, 2), "(no error)");
}

// A restart resumes from the last checkpoint, so --max-restarts N is refused at config time with every method
// the table refuses with --resume, naming both flags (not when a restart is needed); the same methods without
// --max-restarts, and a plain run with it, are accepted.
TEST(TrainConfigRestarts, MethodsThatRefuseResumeRefuseMaxRestarts) {
  auto with_restarts = [](TrainConfig c) {
    c.max_restarts = 2;
    c.checkpoint_dir = "/tmp/ck";
    return c;
  };
  auto dp = [](int world) {
    TrainConfig c;
    c.data = "unused.bin";
    c.nproc = world;
    c.batch_size = 8;
    c.micro_batch_size = 2;
    return c;
  };
  EXPECT_EQ(error_of(with_restarts(dp(2)), 2), "(no error)");
  TrainConfig l = dp(2);  // --learners resumes (its learners' state is in checkpoints), so it restarts too
  l.learners = 2;
  l.micro_batch_size = 1;
  EXPECT_EQ(error_of(with_restarts(l), 2), "(no error)");
  struct Case {
    std::string flag;
    TrainConfig c;
    int world;
  };
  std::vector<Case> cases;
  TrainConfig g = dp(2);
  g.sync = mt::train::SyncKind::gossip;
  cases.push_back({"--sync gossip", g, 2});
  TrainConfig a = dp(2);
  a.adaptive_batch = true;
  cases.push_back({"--adaptive-batch", a, 2});
  TrainConfig p = pipeline_config("pipemare", 2);
  p.pipemare_correction = 0.5;
  cases.push_back({"--pipemare-correction 0.5", p, 2});
  for (const Case& k : cases) {
    EXPECT_EQ(error_of(k.c, k.world), "(no error)") << k.flag;
    const std::string e = error_of(with_restarts(k.c), k.world);
    EXPECT_NE(e.find("--max-restarts 2 with " + k.flag + " is not supported"), std::string::npos) << e;
    EXPECT_NE(e.find("a restart resumes"), std::string::npos) << e;
  }
}
