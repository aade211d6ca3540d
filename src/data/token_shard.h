// llm.c token shards: a 1024-byte header of 256 little-endian int32 ([0] = magic 20240520, [1] = version 1,
// [2] = token count n), then n little-endian uint16 tokens. Readers map the file and validate the header and
// size at open, so indexing afterwards needs no checks beyond the bounds. Which tokens a rank reads for a
// given step is the data loader's job, not this file's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/fs.h"

namespace mt {

constexpr int32_t kTokenShardMagic = 20240520;
constexpr int32_t kTokenShardVersion = 1;  // uint16 tokens; llm.c's version 2 (uint32 tokens) is not supported
constexpr int64_t kTokenShardHeaderBytes = 256 * 4;

class TokenShard {
 public:
  // Maps the file; throws InputError naming the file on a bad magic (expected and found), version, a token
  // count <= 0, or a size other than 1024 + 2 * count.
  explicit TokenShard(const std::string& path);

  const std::string& path() const { return file_.path(); }
  int64_t size() const { return size_; }  // number of tokens
  const uint16_t* data() const { return tokens_; }
  uint16_t operator[](int64_t i) const;
  // InputError naming the file, position and id of the first token >= vocab_size.
  void check_vocab(int vocab_size) const;

 private:
  MappedFile file_;
  const uint16_t* tokens_ = nullptr;  // inside file_; 2-byte aligned since the mapping is page-aligned
  int64_t size_ = 0;
};

// Writes tokens as a version-1 shard via write_file_atomic. Throws mt::Error for an empty vector or more
// tokens than the int32 count field can hold.
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace mt
