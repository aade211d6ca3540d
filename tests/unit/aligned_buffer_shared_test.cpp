// AlignedBuffer::shared: in the job's shared heap when there is one, private memory otherwise; zeroed either way,
// shared across resize() and moves, and given back to the heap when it ends.
#include <gtest/gtest.h>

#include "core/shared_heap.h"
#include "tensor/buffer.h"

namespace mt {
namespace {

TEST(AlignedBufferShared, PrivateWithoutAHeap) {
  AlignedBuffer b = AlignedBuffer::shared(1000);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_FALSE(b.in_shared_heap());
  EXPECT_EQ(b[999], 0.0f);
}

TEST(AlignedBufferShared, InTheHeapZeroedAndReturned) {
  ASSERT_TRUE(shared_heap::create(2, size_t(4) << 20));
  shared_heap::enter_rank(0);
  {
    // A small block is not punched on release: the next one at its place must still read zeros.
    AlignedBuffer dirty = AlignedBuffer::shared(100);
    ASSERT_TRUE(dirty.in_shared_heap());
    for (size_t i = 0; i < dirty.size(); ++i) dirty[i] = 7.0f;
  }
  AlignedBuffer b = AlignedBuffer::shared(100);
  ASSERT_TRUE(b.in_shared_heap());
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], 0.0f) << i;
  b.resize(50'000);  // 200 KB: still in the heap
  EXPECT_TRUE(b.in_shared_heap());
  AlignedBuffer moved = std::move(b);
  EXPECT_TRUE(moved.in_shared_heap());
  moved.resize(60'000);  // the moved-to buffer stays shared
  EXPECT_TRUE(moved.in_shared_heap());
  AlignedBuffer plain(1000);
  EXPECT_FALSE(plain.in_shared_heap()) << "only shared() buffers go to the heap";
  EXPECT_EQ(shared_heap::stats().blocks, 1u);
  moved = AlignedBuffer();  // the old data goes back to the heap (swap, then the temporary ends)
  EXPECT_EQ(shared_heap::stats().blocks, 0u);
  EXPECT_EQ(shared_heap::stats().live_bytes, 0u);
  shared_heap::destroy();
}

}  // namespace
}  // namespace mt
