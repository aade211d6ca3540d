// The shared-memory region of one communicator (one group), carved from the job arena:
//
//   [Header][RankCtrl x n][ChannelCtrl x n*n][slots: n x kNumBuf x slot_bytes][channel rings: n*n x chan_bytes]
//
// RankCtrl r holds rank r's step counter (collectives synchronise on it), its p2p doorbell and the
// descriptor of its current collective (checked by peers to catch mismatched calls). Slots are the staging
// buffers of collectives: rank r writes only its own slots, and peers read them directly after the step
// that publishes them. Channel (s, d) is a single-producer single-consumer byte ring for p2p from s to d.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/shm/signal.h"

namespace mt::comm::shm {

constexpr int kNumBuf = 2;  // double buffering: chunk t+1 is written while peers still read chunk t
// Slots are spaced slot_bytes + kSlotPad apart, so that the n*kNumBuf slots do not all start in the same
// cache sets (slot sizes are powers of two).
constexpr size_t kSlotPad = 64 * 5;

struct OpDesc {
  uint64_t seq;
  uint64_t count;
  uint8_t kind, dtype, op, pad;
  int32_t root;
};

struct alignas(64) RankCtrl {
  Signal arrive;    // steps this rank has completed
  Signal doorbell;  // bumped whenever a channel to or from this rank changes
  OpDesc desc[2];   // by seq parity: a peer can be at most one collective ahead
  int32_t world_rank;
  int32_t pid;
  uint64_t slot_off[kNumBuf];     // where in its slot b this rank's data of the current use starts
  uint64_t slot_stride[kNumBuf];  // all_to_all_v: this rank's piece stride in slot b
  uint64_t cma_addr;   // single-copy broadcast: the root's buffer, in the root's address space
  int32_t cma_failed;  // single-copy broadcast: this rank's process_vm_readv failed (1) or not (0)
  uint32_t cma_want[2];  // by seq parity: this rank wants single copy (1), vetoes it (2) or neither (0)
};

struct ChannelCtrl {
  alignas(64) std::atomic<uint64_t> head;  // bytes produced (written by the sender)
  alignas(64) std::atomic<uint64_t> tail;  // bytes consumed (written by the receiver)
};

struct alignas(64) RegionHeader {
  uint64_t magic;
  int32_t size;
  int32_t group_id;
  uint64_t slot_bytes;
  uint64_t chan_bytes;
};

struct Layout {
  char* base = nullptr;
  int n = 0;
  size_t slot_bytes = 0, chan_bytes = 0;

  static size_t bytes_for(int n, size_t slot_bytes, size_t chan_bytes) {
    size_t nn = static_cast<size_t>(n);
    return sizeof(RegionHeader) + nn * sizeof(RankCtrl) + nn * nn * sizeof(ChannelCtrl) +
           nn * kNumBuf * (slot_bytes + kSlotPad) + nn * nn * chan_bytes;
  }
  RegionHeader& header() const { return *reinterpret_cast<RegionHeader*>(base); }
  RankCtrl& ctrl(int p) const {
    return reinterpret_cast<RankCtrl*>(base + sizeof(RegionHeader))[p];
  }
  ChannelCtrl& chan(int src, int dst) const {
    return reinterpret_cast<ChannelCtrl*>(base + sizeof(RegionHeader) + n * sizeof(RankCtrl))[src * n + dst];
  }
  char* slot(int p, int b) const {
    size_t off = sizeof(RegionHeader) + n * sizeof(RankCtrl) + size_t(n) * n * sizeof(ChannelCtrl);
    return base + off + (size_t(p) * kNumBuf + b) * (slot_bytes + kSlotPad);
  }
  char* ring(int src, int dst) const {
    size_t off = sizeof(RegionHeader) + n * sizeof(RankCtrl) + size_t(n) * n * sizeof(ChannelCtrl) +
                 size_t(n) * kNumBuf * (slot_bytes + kSlotPad);
    return base + off + (size_t(src) * n + dst) * chan_bytes;
  }
};

}  // namespace mt::comm::shm
