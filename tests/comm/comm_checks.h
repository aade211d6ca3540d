// Backend-independent checks of every operation against a serial reference computed in the test: each rank
// can compute every rank's input (value = f(rank, index), small integers, exact in f32 and bf16 and in any
// summation order), so it computes the expected output itself and compares bit for bit. A failed check
// throws, which fails the rank and so the launch. Used by the shm tests (forked ranks) and the MPI tests.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/shared_heap.h"
#include "comm/reduce.h"
#include "core/error.h"

namespace mt::comm::testing {

// Rank r's element i: a small integer in [-5, 5], different per rank and position.
inline float input_value(int r, size_t i) { return static_cast<float>(static_cast<int>((r * 7 + i * 3 + i / 5) % 11) - 5); }

// While a SharedBufs lives, Bufs made on this thread allocate in the job's shared heap (core/shared_heap.h) when
// there is one, so that peers read them with ordinary loads; private memory otherwise.
inline thread_local bool g_shared_bufs = false;
struct SharedBufs {
  SharedBufs() { g_shared_bufs = true; }
  ~SharedBufs() { g_shared_bufs = false; }
};
template <class T>
struct HeapAllocator {
  using value_type = T;
  HeapAllocator() = default;
  template <class U>
  HeapAllocator(const HeapAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = g_shared_bufs ? shared_heap::allocate(n * sizeof(T)) : nullptr;
    if (!p) p = ::operator new(n * sizeof(T));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) {
    if (!shared_heap::release(p)) ::operator delete(p);
  }
  bool operator==(const HeapAllocator&) const { return true; }
};

struct Buf {
  DType t;
  std::vector<char, HeapAllocator<char>> bytes;
  Buf(DType t_, size_t n) : t(t_), bytes(n * dtype_size(t_) + 1) {}  // +1: never a null data() for n = 0
  void* data() { return bytes.data(); }
  size_t count() const { return (bytes.size() - 1) / dtype_size(t); }
  void set(size_t i, float v) {
    if (t == DType::f32) {
      std::memcpy(&bytes[i * 4], &v, 4);
    } else {
      bf16_t h = f32_to_bf16(v);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  float get(size_t i) const {
    if (t == DType::f32) {
      float v;
      std::memcpy(&v, &bytes[i * 4], 4);
      return v;
    }
    bf16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return bf16_to_f32(h);
  }
  void fill(float v) {
    for (size_t i = 0; i < count(); ++i) set(i, v);
  }
};

inline Buf input_of(int r, size_t n, DType t, size_t first = 0) {
  Buf b(t, n);
  for (size_t i = 0; i < n; ++i) b.set(i, input_value(r, first + i));
  return b;
}

inline void expect_equal(const Buf& got, const Buf& want, size_t n, const std::string& what) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got.bytes[i * dtype_size(got.t)], &want.bytes[i * dtype_size(want.t)], dtype_size(got.t)) != 0) {
      throw Error(str(what, ": element ", i, " of ", n, " is ", got.get(i), ", expected ", want.get(i)));
    }
  }
}

// The reduction of all ranks' inputs over [first, first + n).
inline Buf reference_reduce(int size, size_t first, size_t n, DType t, ReduceOp op) {
  std::vector<Buf> ins;
  std::vector<const void*> ptrs;
  for (int p = 0; p < size; ++p) ins.push_back(input_of(p, n, t, first));
  for (auto& b : ins) ptrs.push_back(b.data());
  Buf out(t, n);
  if (n) reduce_reference(out.data(), ptrs.data(), size, n, t, op, size);
  return out;
}

inline void check_all_reduce(Communicator& c, size_t n, DType t, ReduceOp op, bool in_place) {
  const int r = c.rank();
  Buf in = input_of(r, n, t), out(t, n);
  std::string what = str(c.name(), " all_reduce n=", n, " ", dtype_name(t), " ", reduce_op_name(op),
                         in_place ? " in-place" : "", " algo=", algo_name(c.algorithm()), " rank ", r);
  if (in_place) {
    c.all_reduce(in.data(), in.data(), n, t, op);
    expect_equal(in, reference_reduce(c.size(), 0, n, t, op), n, what);
  } else {
    c.all_reduce(in.data(), out.data(), n, t, op);
    expect_equal(out, reference_reduce(c.size(), 0, n, t, op), n, what);
    expect_equal(in, input_of(r, n, t), n, what + " (send buffer changed)");
  }
}

inline void check_reduce_scatter(Communicator& c, size_t n, DType t, ReduceOp op, bool in_place) {
  const int r = c.rank();
  Shard s = shard_of(n, c.size(), r);
  Buf in = input_of(r, n, t), out(t, s.count);
  std::string what = str(c.name(), " reduce_scatter n=", n, " ", dtype_name(t), " ", reduce_op_name(op),
                         in_place ? " in-place" : "", " rank ", r);
  void* dst = in_place ? static_cast<char*>(in.data()) + s.offset * dtype_size(t) : out.data();
  c.reduce_scatter(in.data(), dst, n, t, op);
  Buf want = reference_reduce(c.size(), s.offset, s.count, t, op);
  Buf got(t, s.count);
  std::memcpy(got.data(), dst, s.count * dtype_size(t));
  expect_equal(got, want, s.count, what);
}

inline void check_all_gather(Communicator& c, size_t n, DType t, bool in_place) {
  const int r = c.rank();
  Shard s = shard_of(n, c.size(), r);
  Buf mine = input_of(r, s.count, t, s.offset), out(t, n), want(t, n);
  for (int p = 0; p < c.size(); ++p) {
    Shard sp = shard_of(n, c.size(), p);
    for (size_t i = 0; i < sp.count; ++i) want.set(sp.offset + i, input_value(p, sp.offset + i));
  }
  std::string what = str(c.name(), " all_gather n=", n, " ", dtype_name(t), in_place ? " in-place" : "", " rank ", r);
  if (in_place) {
    out.fill(-99);
    std::memcpy(static_cast<char*>(out.data()) + s.offset * dtype_size(t), mine.data(), s.count * dtype_size(t));
    c.all_gather(static_cast<char*>(out.data()) + s.offset * dtype_size(t), out.data(), n, t);
  } else {
    c.all_gather(mine.data(), out.data(), n, t);
  }
  expect_equal(out, want, n, what);
}

inline void check_broadcast(Communicator& c, size_t n, DType t, int root) {
  const int r = c.rank();
  Buf buf = r == root ? input_of(root, n, t) : Buf(t, n);
  c.broadcast(buf.data(), n, t, root);
  expect_equal(buf, input_of(root, n, t), n,
               str(c.name(), " broadcast n=", n, " ", dtype_name(t), " root ", root, " rank ", r));
}

inline void check_reduce(Communicator& c, size_t n, DType t, ReduceOp op, int root) {
  const int r = c.rank();
  Buf in = input_of(r, n, t), out(t, n);
  out.fill(-99);
  c.reduce(in.data(), out.data(), n, t, op, root);
  std::string what = str(c.name(), " reduce n=", n, " ", dtype_name(t), " ", reduce_op_name(op), " root ", root,
                         " rank ", r);
  if (r == root) {
    expect_equal(out, reference_reduce(c.size(), 0, n, t, op), n, what);
  } else {
    Buf untouched(t, n);
    untouched.fill(-99);
    expect_equal(out, untouched, n, what + " (non-root output written)");
  }
}

// Rank p's block for rank q: value input_value(p * 64 + q, i).
inline void check_all_to_all(Communicator& c, size_t k, DType t, bool in_place) {
  const int n = c.size(), r = c.rank();
  Buf in(t, k * n), out(t, k * n), want(t, k * n);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < k; ++i) {
      in.set(q * k + i, input_value(r * 64 + q, i));
      want.set(q * k + i, input_value(q * 64 + r, i));
    }
  }
  Buf* dst = in_place ? &in : &out;
  c.all_to_all(in.data(), dst->data(), k, t);
  expect_equal(*dst, want, k * n,
               str(c.name(), " all_to_all k=", k, " ", dtype_name(t), in_place ? " in-place" : "", " rank ", r));
}

// Rank p sends (p + 2q) % 5 * scale elements to rank q, at shuffled offsets with gaps.
inline void check_all_to_all_v(Communicator& c, size_t scale, DType t) {
  const int n = c.size(), r = c.rank();
  auto cnt = [&](int p, int q) { return static_cast<size_t>((p + 2 * q) % 5) * scale + (p == q ? 1 : 0); };
  std::vector<size_t> sc(n), so(n), rc(n), ro(n);
  size_t stot = 0, rtot = 0;
  for (int j = n - 1; j >= 0; --j) {  // reversed layout: offsets are not the packed ones
    sc[j] = cnt(r, j);
    so[j] = stot;
    stot += sc[j] + 3;
    rc[j] = cnt(j, r);
    ro[j] = rtot;
    rtot += rc[j] + 2;
  }
  Buf in(t, stot), out(t, rtot), want(t, rtot);
  out.fill(-99);
  want.fill(-99);
  for (int j = 0; j < n; ++j) {
    for (size_t i = 0; i < sc[j]; ++i) in.set(so[j] + i, input_value(r * 64 + j, i));
    for (size_t i = 0; i < rc[j]; ++i) want.set(ro[j] + i, input_value(j * 64 + r, i));
  }
  c.all_to_all_v(in.data(), sc.data(), so.data(), out.data(), rc.data(), ro.data(), t);
  expect_equal(out, want, rtot, str(c.name(), " all_to_all_v scale=", scale, " ", dtype_name(t), " rank ", r));
}

// Every collective at every size and dtype; `big` is the "few MB" element count.
inline void check_all_ops(Communicator& c, const std::vector<size_t>& sizes) {
  const int n = c.size();
  for (DType t : {DType::f32, DType::bf16}) {
    for (size_t s : sizes) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) check_all_reduce(c, s, t, op, false);
      check_all_reduce(c, s, t, ReduceOp::sum, true);
      check_reduce_scatter(c, s, t, ReduceOp::sum, false);
      check_reduce_scatter(c, s, t, ReduceOp::avg, true);
      check_all_gather(c, s, t, false);
      check_all_gather(c, s, t, true);
      check_broadcast(c, s, t, n - 1);
      check_reduce(c, s, t, ReduceOp::max, n / 2);
      check_all_to_all(c, s / n, t, false);
      check_all_to_all(c, s / n + 1, t, true);
      check_all_to_all_v(c, s / (3 * n) + 1, t);
    }
  }
  // Both all-reduce algorithms at sizes around their chunk boundaries.
  Algo saved = c.algorithm();
  for (Algo a : {Algo::direct, Algo::rs_ag}) {
    c.set_algorithm(a);
    for (size_t s : sizes) {
      check_all_reduce(c, s, DType::f32, ReduceOp::sum, false);
      check_all_reduce(c, s, DType::bf16, ReduceOp::avg, true);
      check_reduce(c, s, DType::f32, ReduceOp::sum, 0);
    }
  }
  c.set_algorithm(saved);
  c.barrier();
}

// Point to point: a ring exchange at each size with isend + recv, then messages posted out of tag order.
inline void check_p2p(Communicator& c, const std::vector<size_t>& sizes) {
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (size_t s : sizes) {
    Buf out = input_of(r, s, DType::f32), in(DType::f32, s);
    Request q = c.isend(out.data(), s, DType::f32, next, 7);
    c.recv(in.data(), s, DType::f32, prev, 7);
    q.wait();
    expect_equal(in, input_of(prev, s, DType::f32), s, str(c.name(), " ring p2p n=", s, " rank ", r));
  }
  // Three tagged messages to next, received in reverse tag order (the first two arrive unexpected).
  size_t big = sizes.back();
  std::vector<Buf> outs, ins;
  std::vector<Request> reqs;
  for (int tag = 0; tag < 3; ++tag) {
    outs.push_back(input_of(r * 10 + tag, big, DType::bf16));
    ins.emplace_back(DType::bf16, big);
  }
  for (int tag = 0; tag < 3; ++tag) reqs.push_back(c.isend(outs[tag].data(), big, DType::bf16, next, tag));
  for (int tag = 2; tag >= 0; --tag) reqs.push_back(c.irecv(ins[tag].data(), big, DType::bf16, prev, tag));
  wait_all(reqs);
  for (int tag = 0; tag < 3; ++tag) {
    expect_equal(ins[tag], input_of(prev * 10 + tag, big, DType::bf16), big,
                 str(c.name(), " tagged p2p tag ", tag, " rank ", r));
  }
  // To self.
  Buf self_in(DType::f32, 5), self_out = input_of(r, 5, DType::f32);
  Request sq = c.isend(self_out.data(), 5, DType::f32, r, 99);
  c.recv(self_in.data(), 5, DType::f32, r, 99);
  sq.wait();
  expect_equal(self_in, self_out, 5, "self p2p");
}

}  // namespace mt::comm::testing
