// Fuzz target: the IDX (MNIST) readers (data/idx.h). The first byte picks images or labels; an accepted
// file's sizes must agree with its header.
#include <cstdint>

#include "core/error.h"
#include "data/idx.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool images = data[0] & 1;
  const std::string path = mt::fuzz::write_input("input.idx", data + 1, size - 1);
  try {
    if (images) {
      const mt::IdxImages im = mt::read_idx_images(path);
      if (im.count <= 0 || im.rows <= 0 || im.cols <= 0) __builtin_trap();
      if (im.pixels.size() != size_t(im.count * im.rows * im.cols)) __builtin_trap();
    } else {
      const mt::IdxLabels lb = mt::read_idx_labels(path);
      if (lb.labels.empty()) __builtin_trap();
    }
  } catch (const mt::InputError&) {
  }
  return 0;
}
