// Fuzz target: the token-shard reader (data/token_shard.h). An accepted shard must have every token
// readable and check_vocab must either pass or throw InputError; nothing else may happen.
#include <cstdint>

#include "core/error.h"
#include "data/token_shard.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_input("input.bin", data, size);
  try {
    mt::TokenShard s(path);
    if (s.size() <= 0) __builtin_trap();
    uint64_t sum = 0;
    for (int64_t i = 0; i < s.size(); ++i) sum += s[i];
    volatile uint64_t sink = sum;
    (void)sink;
    s.check_vocab(size > 0 ? 1 + data[size - 1] * 256 : 50257);
  } catch (const mt::InputError&) {
  }
  return 0;
}
