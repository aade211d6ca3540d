// BatchLayout: the micro-batch arithmetic. Every window of the global batch is taken by exactly one rank
// and one micro-batch (checked by marking windows, not by re-deriving the formula), the counts in written-out
// cases, the uneven evaluation split, and the errors naming the flags.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/layout.h"
#include "train/train_config.h"

using mt::train::BatchLayout;
using mt::train::BatchShare;
using mt::train::TrainConfig;

namespace {

TrainConfig config(int B, int mbs, int pp = 1, const std::string& schedule = "", int V = 1) {
  TrainConfig c;
  c.batch_size = B;
  c.micro_batch_size = mbs;
  c.pp = pp;
  c.schedule = schedule;
  c.virtual_stages = V;
  return c;
}

// Marks every window each rank's micro-batches cover; returns the marks.
std::vector<int> cover(const BatchLayout& l, bool eval) {
  std::vector<int> marks(l.global_batch(), 0);
  for (int r = 0; r < l.dp_ranks(); r++) {
    const BatchShare s = eval ? l.eval_share(r) : l.share(r, 0);
    int covered = 0;
    for (int i = 0; i < s.micro_count(); i++) {
      EXPECT_GE(s.micro_len(i), 1);
      EXPECT_LE(s.micro_len(i), s.micro_size());
      for (int w = s.micro_first(i); w < s.micro_first(i) + s.micro_len(i); w++) {
        EXPECT_GE(w, s.first);
        EXPECT_LT(w, s.first + s.count());
        marks[w]++;
        covered++;
      }
    }
    EXPECT_EQ(covered, s.count()) << "rank " << r;
  }
  return marks;
}

std::string error_of(const TrainConfig& c, int dp) {
  try {
    BatchLayout l(c, dp);
  } catch (const mt::InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(BatchLayout, EveryWindowOnceForAllDivisibleLayouts) {
  for (int B = 1; B <= 24; B++)
    for (int N = 1; N <= B; N++)
      for (int u = 0; u <= B; u++) {
        if (B % (N * (u > 0 ? u : 1))) continue;
        const BatchLayout l(config(B, u), N);
        EXPECT_EQ(l.per_rank(), B / N);
        EXPECT_EQ(l.micro_size(), u > 0 ? u : B / N);
        EXPECT_EQ(l.micro_count() * l.micro_size(), B / N);
        EXPECT_EQ(cover(l, false), std::vector<int>(B, 1)) << "B=" << B << " N=" << N << " u=" << u;
        EXPECT_EQ(cover(l, true), std::vector<int>(B, 1)) << "eval B=" << B << " N=" << N << " u=" << u;
      }
}

TEST(BatchLayout, WrittenOutCases) {
  const BatchLayout a(config(8, 2), 2);  // 2 ranks of 4 windows, 2 micro-batches of 2
  const BatchShare s1 = a.share(1, 0);
  EXPECT_EQ(s1.first, 4);
  EXPECT_EQ(s1.count(), 4);
  EXPECT_EQ(a.share(1, 7).sizes, s1.sizes);  // even shares: the same every step
  EXPECT_EQ(s1.micro_count(), 2);
  EXPECT_EQ(s1.micro_first(1), 6);
  EXPECT_EQ(a.schedule().micro_batches, 2);
  EXPECT_FALSE(a.pipelined());

  const BatchLayout b(config(12, 0), 3);  // no --micro-batch-size: the share is one micro-batch
  EXPECT_EQ(b.micro_size(), 4);
  EXPECT_EQ(b.micro_count(), 1);

  const BatchLayout c(config(16, 1, 4, "interleaved", 2), 2);  // 8 micro-batches of 1 over 4 stages x 2 chunks
  EXPECT_TRUE(c.pipelined());
  EXPECT_EQ(c.schedule().name, "interleaved");
  EXPECT_EQ(c.schedule().stages, 4);
  EXPECT_EQ(c.schedule().micro_batches, 8);
  EXPECT_EQ(c.schedule().virtual_stages, 2);
  EXPECT_EQ(BatchLayout(config(8, 2, 2), 1).schedule().name, "1f1b");  // the default schedule
}

TEST(BatchLayout, ShortLastMicroBatch) {
  // Training layouts are whole (B % (N u) == 0 is required); a share's last micro-batch is clipped to it:
  // 5 windows from 3 in micro-batches of 2 are 3-4, 5-6, 7.
  const BatchShare s = BatchShare::even(3, 5, 2);
  EXPECT_EQ(s.micro_first(0), 3);
  EXPECT_EQ(s.micro_len(0), 2);
  EXPECT_EQ(s.micro_first(2), 7);
  EXPECT_EQ(s.micro_len(2), 1);
  // Evaluation without --micro-batch-size runs the share as one micro-batch; with it, in u-sized pieces.
  EXPECT_EQ(BatchLayout(config(12, 0), 3).eval_share(2).micro_count(), 1);
  EXPECT_EQ(BatchLayout(config(12, 2), 3).eval_share(2).micro_count(), 2);
  EXPECT_EQ(BatchLayout(config(12, 2), 3).eval_share(2).first, 8);
}

TEST(BatchLayout, ErrorsNameTheFlags) {
  EXPECT_NE(error_of(config(10, 0), 4).find("--batch-size 10 is not divisible by --dp 4 x --micro-batch-size 1"),
            std::string::npos);
  EXPECT_NE(error_of(config(8, 3), 1).find("--batch-size 8 is not divisible by --dp 1 x --micro-batch-size 3"),
            std::string::npos);
  EXPECT_NE(error_of(config(8, -1), 1).find("--micro-batch-size must be >= 0, got -1"), std::string::npos);
  // interleaved: m % p == 0 (m = 8 / 1 / 2 = 4 micro-batches over 3 stages)
  EXPECT_NE(error_of(config(8, 2, 3, "interleaved", 2), 1), "(no error)");
  // An unknown schedule name: TrainConfig::validate rejects it first (TrainConfigSchedule below); a layout built
  // without validate still refuses it, listing the registry's names.
  EXPECT_NE(error_of(config(8, 2, 2, "zero-bubble"), 1)
                .find("unknown pipeline schedule 'zero-bubble'; choose one "
                      "of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v"),
            std::string::npos);
  TrainConfig sp = config(4, 1);
  sp.sequence_parallel = true;
  sp.tp = 3;
  sp.seq_len = 8;  // 1 x 8 token rows over 3 ranks
  EXPECT_NE(error_of(sp, 1).find("splits the 8 token rows of a micro-batch (--micro-batch-size x --seq-len 8) "
                                 "over --tp 3"),
            std::string::npos);
  sp.tp = 1;
  EXPECT_NE(error_of(sp, 1).find("--sequence-parallel needs --tp > 1"), std::string::npos);
}

TEST(BatchShare, AListOfMicroBatchSizes) {
  // An uneven share (what a layout by measured speed would hand out): micro-batches of 3, 1 and 2 windows.
  BatchShare s;
  s.first = 5;
  s.sizes = {3, 1, 2};
  EXPECT_EQ(s.count(), 6);
  EXPECT_EQ(s.micro_count(), 3);
  EXPECT_EQ(s.micro_first(0), 5);
  EXPECT_EQ(s.micro_first(1), 8);
  EXPECT_EQ(s.micro_first(2), 9);
  EXPECT_EQ(s.micro_len(2), 2);
  EXPECT_EQ(s.micro_size(), 3);
  EXPECT_EQ(BatchShare::even(0, 0, 4).micro_count(), 0);
  EXPECT_EQ(BatchShare::even(0, 7, 3).sizes, (std::vector<int>{3, 3, 1}));
}
