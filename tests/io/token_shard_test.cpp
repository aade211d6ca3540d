// Tests for data/token_shard: round trip with position-derived tokens, exact header layout, and each
// header or size defect rejected with the numbers that disagree.
#include "data/token_shard.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::ScratchDir;
using testing_io::throws_input_error;
using testing_io::write_raw;

// A shard's bytes with an arbitrary header, for building defective files.
std::string shard_bytes(int32_t magic, int32_t version, int32_t count, size_t ntokens) {
  std::string s(1024 + 2 * ntokens, '\0');
  int32_t h[3] = {magic, version, count};
  std::memcpy(s.data(), h, sizeof h);
  for (size_t i = 0; i < ntokens; ++i) {
    uint16_t t = static_cast<uint16_t>(i);
    std::memcpy(s.data() + 1024 + 2 * i, &t, 2);
  }
  return s;
}

TEST(TokenShard, RoundTrip) {
  ScratchDir dir;
  std::string path = dir.file("t.bin");
  std::vector<uint16_t> tokens(3001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7);  // token = 7 * position
  tokens.back() = 65535;
  write_token_shard(path, tokens);
  EXPECT_EQ(dir.count_temp_files(), 0);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 2 * 3001);

  std::string raw = read_file(path);
  int32_t h[256];
  std::memcpy(h, raw.data(), 1024);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 3001);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(h[i], 0) << i;

  TokenShard s(path);
  EXPECT_EQ(s.path(), path);
  ASSERT_EQ(s.size(), 3001);
  EXPECT_EQ(std::vector<uint16_t>(s.data(), s.data() + s.size()), tokens);
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(s[1000], 7000);
  EXPECT_EQ(s[3000], 65535);
  s.check_vocab(65536);
}

TEST(TokenShard, CheckVocabNamesFirstBadToken) {
  ScratchDir dir;
  std::string path = dir.file("vocab.bin");
  write_token_shard(path, {1, 2, 50256, 50257, 60000});
  TokenShard s(path);
  s.check_vocab(60001);
  EXPECT_TRUE(throws_input_error([&] { s.check_vocab(50257); }, {path, "token 50257 at position 3", "50257"}));
}

struct BadShard {
  const char* name;
  std::string bytes;
  std::vector<std::string> expect;
};

TEST(TokenShard, RejectsEachDefect) {
  ScratchDir dir;
  const std::vector<BadShard> cases = {
      {"short", std::string(1000, '\0'), {"1000 bytes", "shorter than the 1024-byte"}},
      {"empty", std::string(), {"0 bytes"}},
      {"bad_magic", shard_bytes(20240521, 1, 4, 4), {"bad magic: expected 20240520, found 20240521"}},
      {"version2", shard_bytes(kTokenShardMagic, 2, 4, 4), {"version 2"}},
      {"zero_count", shard_bytes(kTokenShardMagic, 1, 0, 0), {"holds 0 tokens"}},
      {"negative_count", shard_bytes(kTokenShardMagic, 1, -5, 0), {"holds -5 tokens"}},
      {"truncated", shard_bytes(kTokenShardMagic, 1, 100, 50), {"truncated", "promises 100 tokens", "only 100 bytes"}},
      {"truncated_odd", shard_bytes(kTokenShardMagic, 1, 100, 50) + "x", {"promises 100 tokens", "only 101 bytes"}},
      {"extra", shard_bytes(kTokenShardMagic, 1, 4, 6), {"promises 4 tokens (8 bytes)", "12 bytes", "4 extra"}},
  };
  for (const BadShard& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(std::string(c.name) + ".bin");
    write_raw(path, c.bytes);
    std::function<void()> open = [&] { TokenShard s(path); };
    EXPECT_TRUE(throws_input_error(open, {path + ": "}));
    for (const std::string& part : c.expect) EXPECT_TRUE(throws_input_error(open, {part}));
  }
}

TEST(TokenShard, WriterRejectsEmpty) {
  ScratchDir dir;
  std::string path = dir.file("none.bin");
  EXPECT_THROW(write_token_shard(path, {}), mt::Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace mt
