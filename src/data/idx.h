// IDX files (the MNIST format): a big-endian header of a uint32 magic and one uint32 per dim, then the
// values. Only the two MNIST shapes are supported: magic 2051 = uint8 images [count, rows, cols] and
// magic 2049 = uint8 labels [count]. Files are small (47 MB for MNIST train), so they are read into memory
// whole rather than mapped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

constexpr uint32_t kIdxImagesMagic = 2051;  // 0x00000803: uint8, 3 dims
constexpr uint32_t kIdxLabelsMagic = 2049;  // 0x00000801: uint8, 1 dim

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
};
struct IdxLabels {
  std::vector<uint8_t> labels;  // [count]
};

// Throw InputError naming the file on a wrong magic (expected and found), a size other than the header
// promises (expected and actual bytes), or a zero dim.
IdxImages read_idx_images(const std::string& path);
IdxLabels read_idx_labels(const std::string& path);
// Atomic (write_file_atomic). Throw mt::Error if the dims are zero, exceed uint32 or disagree with the data.
void write_idx_images(const std::string& path, const IdxImages& images);
void write_idx_labels(const std::string& path, const IdxLabels& labels);

}  // namespace mt
