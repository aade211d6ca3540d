// Tests for data/idx: round trip with big-endian headers checked byte by byte, and each defect (magic,
// truncation, zero dims, gzip) rejected with the numbers that disagree.
#include "data/idx.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/fs.h"
#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::ScratchDir;
using testing_io::throws_input_error;
using testing_io::write_raw;

IdxImages sample_images() {
  IdxImages im;
  im.count = 3;
  im.rows = 4;
  im.cols = 5;
  for (int i = 0; i < 60; ++i) im.pixels.push_back(static_cast<uint8_t>(i * 4 + 1));  // pixel = 4 * index + 1
  return im;
}

TEST(Idx, RoundTripImagesAndLabels) {
  ScratchDir dir;
  std::string ipath = dir.file("images.idx3-ubyte");
  std::string lpath = dir.file("labels.idx1-ubyte");
  write_idx_images(ipath, sample_images());
  write_idx_labels(lpath, IdxLabels{{7, 2, 1}});
  EXPECT_EQ(dir.count_temp_files(), 0);

  std::string raw = read_file(ipath);
  ASSERT_EQ(raw.size(), 16u + 60);
  EXPECT_EQ(raw.substr(0, 16), std::string("\x00\x00\x08\x03\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00\x05", 16));
  EXPECT_EQ(read_file(lpath), std::string("\x00\x00\x08\x01\x00\x00\x00\x03\x07\x02\x01", 11));

  IdxImages im = read_idx_images(ipath);
  EXPECT_EQ(im.count, 3);
  EXPECT_EQ(im.rows, 4);
  EXPECT_EQ(im.cols, 5);
  EXPECT_EQ(im.pixels, sample_images().pixels);
  EXPECT_EQ(read_idx_labels(lpath).labels, (std::vector<uint8_t>{7, 2, 1}));
}

std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

struct BadIdx {
  const char* name;
  bool images;
  std::string bytes;
  std::vector<std::string> expect;
};

TEST(Idx, RejectsEachDefect) {
  ScratchDir dir;
  const std::string img_header = be32(2051) + be32(2) + be32(3) + be32(4);
  const std::vector<BadIdx> cases = {
      {"labels_as_images", true, be32(2049) + be32(2) + be32(3) + be32(4) + std::string(24, 'x'),
       {"bad magic: expected 2051", "found 2049", "labels file"}},
      {"images_as_labels", false, img_header + std::string(24, 'x'), {"bad magic: expected 2049", "found 2051"}},
      {"little_endian_magic", true, std::string("\x03\x08\x00\x00", 4) + be32(2) + be32(3) + be32(4) + std::string(24, 'x'),
       {"found 50855936"}},
      {"short_header", true, img_header.substr(0, 10), {"10 bytes", "16-byte"}},
      {"truncated_images", true, img_header + std::string(20, 'x'), {"truncated", "promises 40 bytes", "has 36"}},
      {"extra_images", true, img_header + std::string(30, 'x'), {"promises 40 bytes", "has 46", "6 extra"}},
      {"zero_rows", true, be32(2051) + be32(2) + be32(0) + be32(4), {"dim 1", "is 0"}},
      {"huge_dims", true, be32(2051) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF), {"overflow"}},
      {"truncated_labels", false, be32(2049) + be32(10) + "abc", {"truncated", "promises 18 bytes", "has 11"}},
      {"zero_labels", false, be32(2049) + be32(0), {"dim 0", "is 0"}},
      {"gzip", true, std::string("\x1f\x8b\x08\x00", 4) + std::string(40, 'x'), {"gzip", "gunzip"}},
  };
  for (const BadIdx& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(std::string(c.name) + ".idx");
    write_raw(path, c.bytes);
    std::function<void()> open = [&] {
      if (c.images)
        read_idx_images(path);
      else
        read_idx_labels(path);
    };
    EXPECT_TRUE(throws_input_error(open, {path + ": "}));
    for (const std::string& part : c.expect) EXPECT_TRUE(throws_input_error(open, {part}));
  }
  EXPECT_TRUE(throws_input_error([&] { read_idx_images(dir.file("missing")); }, {"cannot open " + dir.file("missing")}));
}

TEST(Idx, WriterRejectsInconsistentImages) {
  ScratchDir dir;
  std::string path = dir.file("bad.idx");
  IdxImages im = sample_images();
  im.pixels.pop_back();
  EXPECT_THROW(write_idx_images(path, im), mt::Error);
  im = sample_images();
  im.rows = 0;
  EXPECT_THROW(write_idx_images(path, im), mt::Error);
  EXPECT_THROW(write_idx_labels(path, IdxLabels{}), mt::Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace mt
