// data/labeled_images: IDX images and labels read into classification examples (pixels / 255), the batch
// rule (example j of step s is (s B + j) mod N, wrapping around the data), the held-out tail, and the
// defects refused with the files and numbers named.
#include "data/labeled_images.h"

#include <gtest/gtest.h>

#include "data/idx.h"
#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::ScratchDir;
using testing_io::throws_input_error;

// 5 images of 1 x 2 pixels: image k holds (51 k, 255 - 51 k), label k.
void write_five(const std::string& images, const std::string& labels) {
  IdxImages im;
  im.count = 5, im.rows = 1, im.cols = 2;
  for (int k = 0; k < 5; k++) im.pixels.insert(im.pixels.end(), {(uint8_t)(51 * k), (uint8_t)(255 - 51 * k)});
  write_idx_images(images, im);
  write_idx_labels(labels, IdxLabels{{0, 1, 2, 3, 4}});
}

TEST(LabeledImages, PixelsScaledBatchesWrapAndTailSplits) {
  ScratchDir dir;
  const std::string im = dir.file("im.idx"), lb = dir.file("lb.idx");
  write_five(im, lb);
  data::LabeledImages e = data::load_labeled_images(im, lb, 5);
  ASSERT_EQ(e.count, 5);
  ASSERT_EQ(e.D, 2);
  EXPECT_EQ(e.x[2], 51.0f / 255.0f);
  EXPECT_EQ(e.x[1], 1.0f);
  // Step 1 of a global batch of 4, windows [2, 4): examples (4 + 2) mod 5 = 1 and (4 + 3) mod 5 = 2.
  float x[4];
  int32_t y[2];
  e.batch(1, 4, 2, 2, x, y);
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[1], 2);
  EXPECT_EQ(x[0], e.x[2]);
  EXPECT_EQ(x[3], e.x[5]);
  // Step 2, windows [0, 2): examples 8 mod 5 = 3 and 4.
  e.batch(2, 4, 0, 2, x, y);
  EXPECT_EQ(y[0], 3);
  EXPECT_EQ(y[1], 4);
  const data::LabeledImages tail = e.split_tail(3);
  EXPECT_EQ(e.count, 3);
  EXPECT_EQ(e.x.size(), 6u);
  EXPECT_EQ(tail.count, 2);
  EXPECT_EQ(tail.D, 2);
  EXPECT_EQ(tail.y, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(tail.x[0], 153.0f / 255.0f);
}

TEST(LabeledImages, DefectsNameTheFiles) {
  ScratchDir dir;
  const std::string im = dir.file("im.idx"), lb = dir.file("lb.idx"), lb3 = dir.file("lb3.idx");
  write_five(im, lb);
  write_idx_labels(lb3, IdxLabels{{0, 1, 2}});
  EXPECT_TRUE(throws_input_error([&] { data::load_labeled_images(im, lb, 4); },
                                 {lb, "label 4 at position 4 is not below the number of classes 4"}));
  EXPECT_TRUE(throws_input_error([&] { data::load_labeled_images(im, lb3, 5); }, {"has 5 images but", "has 3 labels"}));
  EXPECT_TRUE(throws_input_error([&] { data::load_labeled_images(im, "", 5); }, {"needs a labels file for", im}));
}

}  // namespace
}  // namespace mt
