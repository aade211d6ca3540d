// Fuzz target: the safetensors reader (checkpoint/safetensors.h). Any input must either be rejected with
// mt::InputError or give a reader whose every tensor can be read whole: its bytes touched end to end and,
// for the float dtypes, converted to float32. Anything else (another exception, a crash, an out-of-bounds
// read that AddressSanitizer sees) is a finding.
#include <cstdint>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_input("input.safetensors", data, size);
  try {
    mt::SafetensorsReader r(path);
    // Every accepted tensor lies inside the data buffer: the file after the 8-byte length and the header.
    // (Reads past the end of a small file land in its mapped page's padding, which no sanitizer sees.)
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
    const uint64_t data_size = size - 8 - header;
    volatile uint8_t sink = 0;
    for (const mt::TensorInfo& t : r.tensors()) {
      if (t.begin > t.end || t.end > data_size) __builtin_trap();
      const uint8_t* b = r.bytes(t);
      for (uint64_t i = t.begin; i < t.end; i += 61) sink = sink ^ b[i - t.begin];
      if (t.end > t.begin) sink = sink ^ b[t.end - t.begin - 1];
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      if (t.dtype == mt::DType::F32 || t.dtype == mt::DType::BF16 || t.dtype == mt::DType::F16 ||
          t.dtype == mt::DType::F64) {
        std::vector<float> out(static_cast<size_t>(numel));
        r.read_f32(t.name, out.data(), numel);
      }
      if (r.find(t.name) != &t) __builtin_trap();  // the index must agree with the list
    }
    for (const auto& [k, v] : r.metadata()) sink = sink ^ uint8_t(k.size() + v.size());
  } catch (const mt::InputError&) {
  }
  return 0;
}
