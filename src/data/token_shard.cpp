// llm.c token shards: validated memory-mapped reading and atomic writing; the format is in token_shard.h.
#include "data/token_shard.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace mt {

static_assert(std::endian::native == std::endian::little, "token shards are read in place as little-endian");

TokenShard::TokenShard(const std::string& path) : file_(path) {
  const int64_t fsize = static_cast<int64_t>(file_.size());
  MT_CHECK_INPUT(fsize >= kTokenShardHeaderBytes, path, ": file is ", fsize, " bytes, shorter than the ",
                 kTokenShardHeaderBytes, "-byte token shard header");
  int32_t header[3];
  std::memcpy(header, file_.data(), sizeof header);
  MT_CHECK_INPUT(header[0] == kTokenShardMagic, path, ": bad magic: expected ", kTokenShardMagic, ", found ", header[0],
                 " (not an llm.c token shard?)");
  MT_CHECK_INPUT(header[1] == kTokenShardVersion, path, ": unsupported token shard version ", header[1], " (expected ",
                 kTokenShardVersion, ", uint16 tokens)");
  const int64_t count = header[2];
  MT_CHECK_INPUT(count > 0, path, ": header says the shard holds ", count, " tokens; expected at least 1");
  const int64_t have = fsize - kTokenShardHeaderBytes;
  MT_CHECK_INPUT(have >= 2 * count, path, ": truncated: header promises ", count, " tokens (", 2 * count,
                 " bytes) but only ", have, " bytes follow the header");
  MT_CHECK_INPUT(have == 2 * count, path, ": header promises ", count, " tokens (", 2 * count, " bytes) but ", have,
                 " bytes follow the header (", have - 2 * count, " extra)");
  tokens_ = reinterpret_cast<const uint16_t*>(file_.data() + kTokenShardHeaderBytes);
  size_ = count;
}

uint16_t TokenShard::operator[](int64_t i) const {
  MT_ASSERT(i >= 0 && i < size_, "token index ", i, " out of range [0, ", size_, ") in ", path());
  return tokens_[i];
}

void TokenShard::check_vocab(int vocab_size) const {
  for (int64_t i = 0; i < size_; ++i) {
    MT_CHECK_INPUT(tokens_[i] < vocab_size, path(), ": token ", tokens_[i], " at position ", i,
                   " is outside the vocabulary of ", vocab_size, " (shard made with a different tokenizer?)");
  }
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  MT_REQUIRE(Error, !tokens.empty(), "cannot write ", path, ": a token shard needs at least one token");
  MT_REQUIRE(Error, tokens.size() <= static_cast<size_t>(INT32_MAX), "cannot write ", path, ": ", tokens.size(),
             " tokens do not fit the int32 count field");
  std::string buf(kTokenShardHeaderBytes + 2 * tokens.size(), '\0');
  int32_t header[3] = {kTokenShardMagic, kTokenShardVersion, static_cast<int32_t>(tokens.size())};
  std::memcpy(buf.data(), header, sizeof header);
  std::memcpy(buf.data() + kTokenShardHeaderBytes, tokens.data(), 2 * tokens.size());
  write_file_atomic(path, buf);
}

}  // namespace mt
