// nn/tensor_parallel_layers.h with ranks as threads: the vocabulary-parallel loss against the single-process
// softmax cross-entropy (uneven vocabulary split), the sequence-parallel paired collectives against the rows
// written out by hand, and the column- and row-parallel linear layers (forward and backward, with and without
// sequence parallelism) against the unsharded nn::linear_* on small integers (every float sum exact, so the
// comparisons are bit for bit whatever the summation order). A group whose sums are dropped shows that the
// column-parallel check fails without the input gradient's reduction.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/types.h"
#include "nn/layers.h"
#include "nn/tensor_parallel_layers.h"
#include "tensor/bf16.h"

#include "thread_tp.h"

namespace {

using mt::testing::Group;
using mt::testing::ThreadTp;

// A broken group: sums are not formed (all-reduce leaves each rank's own buffer, reduce-scatter keeps this
// rank's part of its own buffer); gathers work.
class ThreadTpWithoutSums : public ThreadTp {
 public:
  using ThreadTp::ThreadTp;
  void all_reduce_sum(float*, size_t) override {}
  void reduce_scatter(const float* full, float* local, size_t count) override {
    const size_t part = count / size();
    for (size_t i = 0; i < part; i++) local[i] = full[rank() * part + i];
  }
};

void run_ranks(int S, const std::function<void(mt::nn::TensorParallelOps&, int)>& body, bool drop_sums = false) {
  Group g(S);
  std::vector<std::thread> threads;
  for (int r = 0; r < S; r++)
    threads.emplace_back([&, r] {
      if (drop_sums) {
        ThreadTpWithoutSums tp(g, r);
        body(tp, r);
      } else {
        ThreadTp tp(g, r);
        body(tp, r);
      }
    });
  for (auto& t : threads) t.join();
}

// Small integers in [lo, lo + span): products and sums of a few of them are exact in float32.
std::vector<float> ints(size_t n, int mul, int span, int lo) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (float)((int)((i * mul + 1) % span) + lo);
  return v;
}

// Elements where a sharded result differs from the unsharded one, per quantity.
struct Mismatches {
  int out = 0, whole = 0, dinp = 0, dW = 0, db = 0;
};

// Column-parallel linear over S thread ranks against nn::linear_* on the whole weight W[Cin, Cout], Cout =
// S x Cl, each rank's Cl columns taken in `blocks` blocks (the q|k|v layout). dW and db start non-zero
// (accumulation). With drop_sums the group forms no sums.
Mismatches column_parallel_vs_whole(int S, bool sp, int blocks, bool drop_sums = false) {
  const int N = 6, Cin = 5, w = 2, Cl = blocks * w, Cout = S * Cl, Nr = sp && S > 1 ? N / S : N;
  const std::vector<float> inp = ints((size_t)N * Cin, 7, 5, -2), W = ints((size_t)Cin * Cout, 3, 7, -3),
                           b = ints(Cout, 1, 3, -1), dout = ints((size_t)N * Cout, 5, 9, -4),
                           dW0 = ints((size_t)Cin * Cout, 2, 3, 0), db0 = ints(Cout, 4, 5, 0);
  std::vector<float> out(N * Cout), dinp(N * Cin), dW = dW0, db = db0;
  mt::nn::linear_forward(out.data(), inp.data(), W.data(), b.data(), N, Cin, Cout);
  mt::nn::linear_backward(dinp.data(), dW.data(), db.data(), dout.data(), inp.data(), W.data(), N, Cin, Cout);
  // Full column of local column j on rank q.
  auto col = [&](int q, int j) { return (j / w) * S * w + q * w + j % w; };
  std::vector<Mismatches> bad(S);
  run_ranks(
      S,
      [&](mt::nn::TensorParallelOps& tp, int r) {
        mt::nn::TpRows rows(&tp, sp);
        Mismatches& m = bad[r];
        std::vector<float> Wl(Cin * Cl), bl(Cl), dWl(Cin * Cl), dbl(Cl);
        for (int j = 0; j < Cl; j++) {
          for (int i = 0; i < Cin; i++) {
            Wl[i * Cl + j] = W[i * Cout + col(r, j)];
            dWl[i * Cl + j] = dW0[i * Cout + col(r, j)];
          }
          bl[j] = b[col(r, j)];
          dbl[j] = db0[col(r, j)];
        }
        const int n0 = Nr == N ? 0 : r * Nr;  // my rows of the input
        std::vector<float> inp_l(inp.begin() + n0 * Cin, inp.begin() + (n0 + Nr) * Cin);
        std::vector<float> inp_full(N * Cin), dinp_full(N * Cin), out_l(N * Cl), parts(S * N * Cl),
            whole(N * Cout), dout_l(N * Cl), dinp_l(Nr * Cin);
        mt::nn::column_parallel_linear_forward(rows, inp_full.data(), out_l.data(), inp_l.data(), Wl.data(),
                                               bl.data(), N, Cin, Cl);
        for (int n = 0; n < N; n++)
          for (int j = 0; j < Cl; j++) m.out += out_l[n * Cl + j] != out[n * Cout + col(r, j)];
        mt::nn::gather_columns(rows, parts.data(), whole.data(), out_l.data(), N, Cl, blocks);
        for (int i = 0; i < N * Cout; i++) m.whole += whole[i] != out[i];
        mt::nn::split_columns(rows, dout_l.data(), dout.data(), N, Cl, blocks);
        mt::nn::column_parallel_linear_backward(rows, inp_full.data(), dinp_full.data(), dinp_l.data(), dWl.data(),
                                                dbl.data(), dout_l.data(), inp_l.data(), Wl.data(), N, Cin, Cl);
        for (int i = 0; i < Nr * Cin; i++) m.dinp += dinp_l[i] != dinp[n0 * Cin + i];
        for (int j = 0; j < Cl; j++) {
          for (int i = 0; i < Cin; i++) m.dW += dWl[i * Cl + j] != dW[i * Cout + col(r, j)];
          m.db += dbl[j] != db[col(r, j)];
        }
      },
      drop_sums);
  Mismatches total;
  for (const Mismatches& m : bad) {
    total.out += m.out, total.whole += m.whole, total.dinp += m.dinp, total.dW += m.dW, total.db += m.db;
  }
  return total;
}

}  // namespace

TEST(TensorParallelLayers, VocabParallelLossMatchesTheWholeVocabulary) {
  const int N = 5, V = 10;
  const float dscale = 0.125f;
  std::vector<float> logits(N * V);
  for (int i = 0; i < N * V; i++) logits[i] = (float)((i * 37) % 23) * 0.25f - 2.0f;
  const std::vector<int32_t> targets = {0, 9, 4, 5, 3};
  std::vector<float> want = logits;
  const double want_loss = mt::nn::softmax_cross_entropy(want.data(), targets.data(), N, V, dscale, nullptr);
  for (int S : {1, 2, 3, 4}) {  // 10 over 3 and 4 is uneven: 4 3 3, 3 3 2 2
    std::vector<double> loss(S);
    std::vector<float> got(N * V, -99.0f);
    run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
      const mt::comm::Shard sh = mt::comm::shard_of(V, S, r);
      std::vector<float> mine(N * sh.count);
      for (int n = 0; n < N; n++)
        for (size_t j = 0; j < sh.count; j++) mine[n * sh.count + j] = logits[n * V + sh.offset + j];
      loss[r] = mt::nn::vocab_parallel_cross_entropy(tp, mine.data(), targets.data(), N, (int64_t)sh.offset,
                                                     (int64_t)(sh.offset + sh.count), dscale);
      for (int n = 0; n < N; n++)
        for (size_t j = 0; j < sh.count; j++) got[n * V + sh.offset + j] = mine[n * sh.count + j];
    });
    for (int r = 0; r < S; r++) EXPECT_NEAR(loss[r], want_loss, 1e-5 * std::abs(want_loss)) << "S " << S;
    for (int i = 0; i < N * V; i++) EXPECT_NEAR(got[i], want[i], 1e-7) << "S " << S << " element " << i;
  }
}

TEST(TensorParallelLayers, SequenceParallelRowsGatherAndReduce) {
  const int S = 3, N = 6, C = 2, Nr = N / S;
  run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
    mt::nn::TpRows rows(&tp, true);
    EXPECT_EQ(rows.rows_here(N), Nr);
    // Rank r holds rows [r Nr, (r + 1) Nr); row n, column c holds 10 n + c.
    std::vector<float> local(Nr * C), full(N * C);
    for (int n = 0; n < Nr; n++)
      for (int c = 0; c < C; c++) local[n * C + c] = 10.0f * (r * Nr + n) + c;
    const float* all = rows.gather(local.data(), full.data(), N, C);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) EXPECT_EQ(all[n * C + c], 10.0f * n + c);
    // Every rank contributes (r + 1) x row value: my rows of the sum are (1 + 2 + 3) x row value.
    std::vector<float> partial(N * C), mine(Nr * C);
    for (int i = 0; i < N * C; i++) partial[i] = (float)(r + 1) * all[i];
    rows.reduce(partial.data(), mine.data(), N, C);
    for (int n = 0; n < Nr; n++)
      for (int c = 0; c < C; c++) EXPECT_EQ(mine[n * C + c], 6.0f * (10.0f * (r * Nr + n) + c));
  });
  // Without sequence parallelism the reduce is an all-reduce of all N rows and gather the identity.
  run_ranks(2, [&](mt::nn::TensorParallelOps& tp, int r) {
    mt::nn::TpRows rows(&tp, false);
    std::vector<float> x = {1.0f + r, 2.0f, 3.0f, 4.0f * r};
    EXPECT_EQ(rows.gather(x.data(), nullptr, 2, 2), x.data());
    rows.reduce(x.data(), x.data(), 2, 2);
    EXPECT_EQ(x, (std::vector<float>{3.0f, 4.0f, 6.0f, 4.0f}));
  });
}

// Under --precision bf16 a column-parallel layer's input kept in bf16 (this rank's rows, all-gathered in bf16 under
// sequence parallelism) and its weight read from a bf16 mirror give the float32 input's Precision::bf16 results
// bit for bit, on every rank, with and without SP. Values that bf16 rounding changes, so a wrong row order or a
// missing gather shows.
TEST(TensorParallelLayers, ColumnParallelWithBf16KeptInputAndMirrorIsTheBf16Layer) {
  const int S = 2, N = 6, Cin = 40, Cl = 24;
  for (bool sp : {false, true}) {
    const int Nr = sp ? N / S : N;
    std::vector<int> bad(S, -1);
    run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
      mt::nn::TpRows rows(&tp, sp);
      std::vector<float> inp(Nr * Cin), W(Cin * Cl), b(Cl), dout(N * Cl);
      for (size_t i = 0; i < inp.size(); i++) inp[i] = 0.37f * (float)((i * 7 + r * 3) % 11) - 1.01f;
      for (size_t i = 0; i < W.size(); i++) W[i] = 0.013f * (float)((i * 5 + r) % 13) - 0.071f;
      for (size_t i = 0; i < b.size(); i++) b[i] = 0.1f * (float)i;
      for (size_t i = 0; i < dout.size(); i++) dout[i] = 0.029f * (float)((i * 3) % 17) - 0.2f;
      std::vector<uint16_t> inp16(inp.size()), W16(W.size()), full16(N * Cin);
      mt::to_bf16(inp.data(), inp16.data(), inp.size());
      mt::to_bf16(W.data(), W16.data(), W.size());
      std::vector<float> full(N * Cin), dfull(N * Cin), out(N * Cl), out16(N * Cl), dinp(Nr * Cin), dinp16(Nr * Cin),
          dW(Cin * Cl, 0.0f), dW16(Cin * Cl, 0.0f), db(Cl, 0.0f), db16(Cl, 0.0f);
      mt::nn::column_parallel_linear_forward(rows, full.data(), out.data(), inp.data(), W.data(), b.data(), N, Cin, Cl,
                                             mt::Precision::bf16);
      mt::nn::column_parallel_linear_forward(rows, full16.data(), out16.data(), inp16.data(), {W.data(), W16.data()},
                                             b.data(), N, Cin, Cl);
      mt::nn::column_parallel_linear_backward(rows, full.data(), dfull.data(), dinp.data(), dW.data(), db.data(),
                                              dout.data(), inp.data(), W.data(), N, Cin, Cl, mt::Precision::bf16);
      mt::nn::column_parallel_linear_backward(rows, full16.data(), dfull.data(), dinp16.data(), dW16.data(),
                                              db16.data(), dout.data(), inp16.data(), {W.data(), W16.data()}, N, Cin,
                                              Cl);
      bad[r] = (out != out16) + (dinp != dinp16) + (dW != dW16) + (db != db16);
    });
    for (int r = 0; r < S; r++) EXPECT_EQ(bad[r], 0) << "sp " << sp << " rank " << r;
  }
}

TEST(TensorParallelLayers, ColumnParallelLinearEqualsTheWholeLinear) {
  for (int S : {1, 2, 3})
    for (bool sp : {false, true})
      for (int blocks : {1, 3}) {
        const Mismatches m = column_parallel_vs_whole(S, sp, blocks);
        const std::string at = "S " + std::to_string(S) + " sp " + std::to_string(sp) + " blocks " +
                               std::to_string(blocks);
        EXPECT_EQ(m.out, 0) << at;
        EXPECT_EQ(m.whole, 0) << at;
        EXPECT_EQ(m.dinp, 0) << at;
        EXPECT_EQ(m.dW, 0) << at;
        EXPECT_EQ(m.db, 0) << at;
      }
}

TEST(TensorParallelLayers, ColumnParallelCheckCatchesAMissingInputGradientSum) {
  // Without the backward reduction ("f"'s pair) each rank keeps only its columns' part of the input gradient:
  // the check above sees it, while forward, dW and db (local by construction) still agree.
  for (bool sp : {false, true}) {
    const Mismatches m = column_parallel_vs_whole(2, sp, 3, /*drop_sums=*/true);
    EXPECT_GT(m.dinp, 0) << "sp " << sp;
    EXPECT_EQ(m.out, 0);
    EXPECT_EQ(m.whole, 0);
    EXPECT_EQ(m.dW, 0);
    EXPECT_EQ(m.db, 0);
  }
}

TEST(TensorParallelLayers, RowParallelLinearEqualsTheWholeLinear) {
  // W[Cin, C] split by input rows (Cl = Cin / S each); out = inp W + b + residual, bias replicated.
  for (int S : {1, 2, 3})
    for (bool sp : {false, true}) {
      const int N = 6, Cl = 2, Cin = S * Cl, C = 4, Nr = sp && S > 1 ? N / S : N;
      const std::vector<float> inp = ints((size_t)N * Cin, 7, 5, -2), W = ints((size_t)Cin * C, 3, 7, -3),
                               b = ints(C, 1, 3, -1), res = ints((size_t)N * C, 2, 5, -2),
                               dout = ints((size_t)N * C, 5, 9, -4);
      std::vector<float> out(N * C), dinp(N * Cin), dW(Cin * C, 0.0f), db(C, 0.0f);
      mt::nn::linear_forward(out.data(), inp.data(), W.data(), b.data(), N, Cin, C, res.data());
      mt::nn::linear_backward(dinp.data(), dW.data(), db.data(), dout.data(), inp.data(), W.data(), N, Cin, C);
      run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
        mt::nn::TpRows rows(&tp, sp);
        const int n0 = Nr == N ? 0 : r * Nr;
        std::vector<float> inp_l(N * Cl), Wl(W.begin() + r * Cl * C, W.begin() + (r + 1) * Cl * C);
        for (int n = 0; n < N; n++)
          for (int i = 0; i < Cl; i++) inp_l[n * Cl + i] = inp[n * Cin + r * Cl + i];
        std::vector<float> res_l(res.begin() + n0 * C, res.begin() + (n0 + Nr) * C),
            dout_l(dout.begin() + n0 * C, dout.begin() + (n0 + Nr) * C);
        std::vector<float> scratch(N * C), out_l(N * C), dinp_l(N * Cl), dWl(Cl * C, 0.0f), dbl(C, 0.0f);
        mt::nn::row_parallel_linear_forward(rows, scratch.data(), out_l.data(), inp_l.data(), Wl.data(), b.data(),
                                            res_l.data(), N, Cl, C);
        for (int i = 0; i < Nr * C; i++) EXPECT_EQ(out_l[i], out[n0 * C + i]) << "S " << S << " sp " << sp;
        mt::nn::row_parallel_linear_backward(rows, scratch.data(), dinp_l.data(), dWl.data(), dbl.data(),
                                             dout_l.data(), inp_l.data(), Wl.data(), N, Cl, C);
        for (int n = 0; n < N; n++)
          for (int i = 0; i < Cl; i++) EXPECT_EQ(dinp_l[n * Cl + i], dinp[n * Cin + r * Cl + i]) << "S " << S;
        for (int i = 0; i < Cl * C; i++) EXPECT_EQ(dWl[i], dW[r * Cl * C + i]) << "S " << S << " sp " << sp;
        for (int j = 0; j < C; j++) EXPECT_EQ(dbl[j], db[j]) << "S " << S << " sp " << sp;
      });
    }
}

TEST(TensorParallelLayers, VocabParallelLogitsEqualTheWholeHead) {
  // The tied head over an uneven vocabulary split (10 rows over 3 and 4 ranks): logits = x wte^T, dx = dlogits
  // wte (summed over the group), dwte += dlogits^T x (accumulated onto a non-zero start).
  const int N = 12, C = 3, V = 10;
  const std::vector<float> x = ints((size_t)N * C, 7, 5, -2), wte = ints((size_t)V * C, 3, 7, -3),
                           dlogits = ints((size_t)N * V, 5, 9, -4), dwte0 = ints((size_t)V * C, 2, 3, 0);
  std::vector<float> logits(N * V, 0.0f), dx(N * C, 0.0f), dwte = dwte0;  // written out as plain loops
  for (int n = 0; n < N; n++)
    for (int v = 0; v < V; v++)
      for (int c = 0; c < C; c++) {
        logits[n * V + v] += x[n * C + c] * wte[v * C + c];
        dx[n * C + c] += dlogits[n * V + v] * wte[v * C + c];
        dwte[v * C + c] += dlogits[n * V + v] * x[n * C + c];
      }
  for (int S : {1, 2, 3, 4})
    for (bool sp : {false, true}) {
      const int Nr = sp && S > 1 ? N / S : N;
      run_ranks(S, [&](mt::nn::TensorParallelOps& tp, int r) {
        mt::nn::TpRows rows(&tp, sp);
        const mt::comm::Shard sh = mt::comm::shard_of(V, S, r);
        const int v0 = (int)sh.offset, Vl = (int)sh.count, n0 = Nr == N ? 0 : r * Nr;
        std::vector<float> x_l(x.begin() + n0 * C, x.begin() + (n0 + Nr) * C),
            wte_l(wte.begin() + v0 * C, wte.begin() + (v0 + Vl) * C),
            dwte_l(dwte0.begin() + v0 * C, dwte0.begin() + (v0 + Vl) * C), dlogits_l(N * Vl);
        for (int n = 0; n < N; n++)
          for (int j = 0; j < Vl; j++) dlogits_l[n * Vl + j] = dlogits[n * V + v0 + j];
        std::vector<float> x_full(N * C), dx_full(N * C), logits_l(N * Vl), dx_l(Nr * C);
        mt::nn::vocab_parallel_logits_forward(rows, x_full.data(), logits_l.data(), x_l.data(), wte_l.data(), N, C,
                                              Vl);
        for (int n = 0; n < N; n++)
          for (int j = 0; j < Vl; j++)
            EXPECT_EQ(logits_l[n * Vl + j], logits[n * V + v0 + j]) << "S " << S << " sp " << sp;
        mt::nn::vocab_parallel_logits_backward(rows, x_full.data(), dx_full.data(), dx_l.data(), dwte_l.data(),
                                               dlogits_l.data(), x_l.data(), wte_l.data(), N, C, Vl);
        for (int i = 0; i < Nr * C; i++) EXPECT_EQ(dx_l[i], dx[n0 * C + i]) << "S " << S << " sp " << sp;
        for (int i = 0; i < Vl * C; i++) EXPECT_EQ(dwte_l[i], dwte[v0 * C + i]) << "S " << S << " sp " << sp;
      });
    }
}
