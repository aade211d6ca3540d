// Corruption fuzzing of the three readers. Each test starts from a valid file and applies thousands of
// deterministic random corruptions (byte flips near the header, truncation, rewritten length/count fields,
// spliced JSON). Every corrupted file must either load into a self-consistent reader whose every tensor or
// token can be read, or be rejected with mt::InputError; any other exception fails the test and any
// out-of-bounds read crashes it (run under -DMESHTRAIN_SANITIZE=address to catch the quiet ones).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/fs.h"
#include "data/idx.h"
#include "data/token_shard.h"
#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::ScratchDir;
using testing_io::write_raw;

// splitmix64: the same sequence on every platform, unlike std:: distributions.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
};

// Tallies outcomes so each test can assert that it exercised both the accept and the reject path.
struct Outcomes {
  int loaded = 0;
  int rejected = 0;
};

// Runs one attempt: InputError counts as a rejection, anything else fails the test with the case number.
template <typename Fn>
void attempt(int iter, const std::string& what, Outcomes& out, Fn&& fn) {
  try {
    fn();
    ++out.loaded;
  } catch (const mt::InputError&) {
    ++out.rejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " case " << iter << ": non-InputError exception: " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << " case " << iter << ": non-std exception";
  }
}

// Generic corruptions shared by all formats; `hot` is the length of the prefix that holds the fields that
// matter (length, magic, dims), flipped more often than the rest of the first 200 bytes.
std::string corrupt_bytes(Rng& rng, std::string f, size_t hot) {
  switch (rng.below(4)) {
    case 0: {  // flip 1-4 bytes in the first 200
      int n = 1 + static_cast<int>(rng.below(4));
      for (int i = 0; i < n && !f.empty(); ++i) {
        size_t lim = std::min<size_t>(f.size(), rng.below(2) ? hot : 200);
        f[rng.below(lim)] ^= static_cast<char>(1 + rng.below(255));
      }
      return f;
    }
    case 1:  // truncate anywhere
      f.resize(rng.below(f.size() + 1));
      return f;
    case 2: {  // truncate near the end or append a few bytes: the off-by-a-few sizes
      size_t delta = rng.below(9);
      if (rng.below(2) && delta <= f.size())
        f.resize(f.size() - delta);
      else
        f.append(delta, static_cast<char>(rng.next()));
      return f;
    }
    default: {  // set one byte of the hot prefix to an extreme
      static const char kExtremes[] = {0, 1, 0x7F, static_cast<char>(0x80), static_cast<char>(0xFF)};
      if (!f.empty()) f[rng.below(std::min(hot, f.size()))] = kExtremes[rng.below(5)];
      return f;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// safetensors

std::string valid_safetensors(const ScratchDir& dir) {
  std::vector<float> w = {1, -2, 3.5f, 0, 1e30f, -1e-30f};
  std::vector<uint16_t> b = {0x3F80, 0xC000, 0x7FC0, 0x0001};
  std::vector<double> d = {0.25, -8};
  std::vector<int32_t> ids = {1, 2, 3};
  float s = 7;
  SafetensorsWriter wr;
  wr.set_metadata("format", "pt");
  wr.add_f32("w", {2, 3}, w.data());
  wr.add_bf16("b", {2, 2}, b.data());
  wr.add_raw("d", DType::F64, {2}, d.data());
  wr.add_raw("ids", DType::I32, {3}, ids.data());
  wr.add_raw("h", DType::F16, {1, 2}, b.data());
  wr.add_f32("s", {}, &s);
  std::string path = dir.file("base.safetensors");
  wr.write(path);
  return read_file(path);
}

const char* const kJsonSnippets[] = {
    "{", "}", "[", "]", ",", ":", "\"", "null", "true", "0", "-1", "1e400", "-0", "1.5", "18446744073709551615",
    "18446744073709551616", "-9223372036854775808", "9223372036854775807", "4294967296", "\"F32\"", "\"BF16\"",
    "\"I8\"", "\"BOOL\"", "\"F8\"", "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"",
    "[0,0]", "[0,4]", "[4,0]", "[0,18446744073709551615]", "[-1]", "[]", "{}", "[[[[[[[[[[[[", "\"\\ud800\"",
    "\"\\u0000\"", "\xff", "\xc3\xa9", "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},",
    "\"w\"", "\"s\"", " ", "\n", "\\",
};

// A JSON-aware corruption: replace a short run of the header with a snippet, then usually fix the length
// field so the parser sees the new header whole.
std::string splice_json(Rng& rng, const std::string& f) {
  uint64_t n;
  std::memcpy(&n, f.data(), 8);
  std::string header = f.substr(8, n);
  std::string data = f.substr(8 + n);
  int edits = 1 + static_cast<int>(rng.below(3));
  for (int i = 0; i < edits; ++i) {
    size_t pos = rng.below(header.size() + 1);
    size_t len = std::min<size_t>(rng.below(12), header.size() - pos);
    header.replace(pos, len, kJsonSnippets[rng.below(std::size(kJsonSnippets))]);
  }
  uint64_t new_n = rng.below(4) ? header.size() : n;
  return testing_io::le64(new_n) + header + data;
}

// A structure-aware corruption: parse the header, set one field of one entry to a value of the right or
// wrong kind, and write it back. Byte-level corruptions mostly break the JSON syntax; these reach the
// semantic checks (sizes, offsets, overlaps, dtypes).
std::string mutate_field(Rng& rng, const std::string& f) {
  using nlohmann::json;
  uint64_t n;
  std::memcpy(&n, f.data(), 8);
  json header = json::parse(f.substr(8, n));
  std::string data = f.substr(8 + n);
  std::vector<std::string> keys;
  for (const auto& [k, v] : header.items()) keys.push_back(k);
  const int64_t big = int64_t{1} << 40;
  const json values[] = {0, 1, 2, 3, 4, 8, 12, 24, 25, -1, -24, big, UINT64_MAX, INT64_MAX, 1.5, "F32", "BF16", "F64",
                         "I32", "U8", "BOOL", "F16", "x", nullptr, true, json::array(), json::array({2}),
                         json::array({0, 4}), json::array({24, 8}), json::object()};
  int edits = 1 + static_cast<int>(rng.below(2));
  for (int e = 0; e < edits; ++e) {
    json& entry = header[keys[rng.below(keys.size())]];
    if (!entry.is_object() || entry.empty()) continue;
    std::vector<std::string> fields;
    for (const auto& [k, v] : entry.items()) fields.push_back(k);
    json& field = entry[fields[rng.below(fields.size())]];
    switch (rng.below(5)) {
      case 4:  // move the tensor, keeping its size: overlaps, gaps and ends past the buffer
        if (entry.contains("data_offsets") && entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2 &&
            entry["data_offsets"][0].is_number_unsigned() && entry["data_offsets"][1].is_number_unsigned()) {
          static const int64_t kShifts[] = {-16, -8, -4, -2, -1, 1, 2, 4, 8, 16};
          int64_t shift = kShifts[rng.below(std::size(kShifts))];
          for (int k = 0; k < 2; ++k) {
            json& x = entry["data_offsets"][k];
            x = x.get<int64_t>() + shift;
          }
        }
        break;
      case 0:  // replace the whole field
        field = values[rng.below(std::size(values))];
        break;
      case 1:  // replace one element of an array field, or the field itself
        if (field.is_array() && !field.empty())
          field[rng.below(field.size())] = values[rng.below(std::size(values))];
        else
          field = values[rng.below(std::size(values))];
        break;
      case 2:  // nudge one integer element: the off-by-a-few offsets and dims
        if (field.is_array() && !field.empty() && field[0].is_number_integer()) {
          json& x = field[rng.below(field.size())];
          x = x.get<int64_t>() + static_cast<int64_t>(rng.below(9)) - 4;
        }
        break;
      default:  // drop the field
        entry.erase(fields[rng.below(fields.size())]);
        break;
    }
  }
  std::string text = header.dump();
  if (rng.below(4) == 0) data.resize(rng.below(data.size() + 1));
  return testing_io::le64(text.size()) + text + data;
}

std::string corrupt_safetensors(Rng& rng, const std::string& f) {
  if (rng.below(3) == 0) return mutate_field(rng, f);
  switch (rng.below(4)) {
    case 0:
      return corrupt_bytes(rng, f, 8);
    case 1: {  // rewrite the header length field
      std::string g = f;
      uint64_t n;
      std::memcpy(&n, g.data(), 8);
      uint64_t choices[] = {rng.next(), rng.below(g.size() + 16), n + rng.below(9) - 4, g.size() - 8, 0, 1ull << 63};
      n = choices[rng.below(std::size(choices))];
      std::memcpy(g.data(), &n, 8);
      return g;
    }
    case 2:
      return splice_json(rng, f);
    default: {  // two corruptions in a row
      std::string g = splice_json(rng, f);
      return g.size() >= 8 ? corrupt_bytes(rng, g, 8) : g;
    }
  }
}

// Everything a loaded reader promises, checked against the file's own bytes. The bounds are asserted
// explicitly because ASan cannot see them: reads past a tensor into the rest of the mapping, or past the
// file end within its last page, touch valid (mapped, unpoisoned) memory.
void check_loaded_safetensors(const SafetensorsReader& r, const std::string& f) {
  uint64_t n;
  std::memcpy(&n, f.data(), 8);
  ASSERT_LE(8 + n, f.size());
  const uint64_t data_size = f.size() - 8 - n;
  const auto& ts = r.tensors();
  uint64_t reach = 0;  // end of the non-empty tensors seen so far
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& t = ts[i];
    ASSERT_LE(t.begin, t.end) << t.name;
    ASSERT_LE(t.end, data_size) << t.name;
    ASSERT_EQ(std::memcmp(r.bytes(t), f.data() + 8 + n + t.begin, t.end - t.begin), 0) << t.name;
    ASSERT_EQ(static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype), t.end - t.begin) << t.name;
    if (i > 0) {
      ASSERT_LE(ts[i - 1].begin, t.begin);
    }
    if (t.end > t.begin) {
      ASSERT_GE(t.begin, reach) << t.name << " overlaps an earlier tensor";
      reach = t.end;
    }
    ASSERT_EQ(r.find(t.name), &t);
    std::vector<float> dst(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F64)
      r.read_f32(t.name, dst.data(), t.numel());
    else
      EXPECT_THROW(r.read_f32(t.name, dst.data(), t.numel()), mt::InputError);
    EXPECT_THROW(r.read_f32(t.name, dst.data(), t.numel() + 1), mt::InputError);
  }
}

TEST(Fuzz, SafetensorsCorruptions) {
  ScratchDir dir;
  const std::string base = valid_safetensors(dir);
  const std::string path = dir.file("fuzz.safetensors");
  Rng rng{12345};
  Outcomes out;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string f = corrupt_safetensors(rng, base);
    write_raw(path, f);
    attempt(iter, "safetensors", out, [&] {
      SafetensorsReader r(path);
      check_loaded_safetensors(r, f);
    });
    if (::testing::Test::HasFailure()) FAIL() << "stopping at case " << iter;
  }
  // Both paths must have been exercised, or the corruptions are too weak (or too strong) to test anything.
  EXPECT_GT(out.loaded, 100);
  EXPECT_GT(out.rejected, 1000);
  std::printf("safetensors: %d loaded, %d rejected\n", out.loaded, out.rejected);
}

// ---------------------------------------------------------------------------------------------------------
// token shards

std::string corrupt_shard(Rng& rng, const std::string& f) {
  if (rng.below(3) == 0) {  // rewrite the count field
    std::string g = f;
    int32_t n;
    std::memcpy(&n, g.data() + 8, 4);
    int32_t choices[] = {static_cast<int32_t>(rng.next()), n + static_cast<int32_t>(rng.below(9)) - 4, 0, -1,
                         INT32_MAX, INT32_MIN, static_cast<int32_t>(rng.below(2 * n))};
    n = choices[rng.below(std::size(choices))];
    std::memcpy(g.data() + 8, &n, 4);
    return g;
  }
  return corrupt_bytes(rng, f, 12);
}

TEST(Fuzz, TokenShardCorruptions) {
  ScratchDir dir;
  const std::string base_path = dir.file("base.bin");
  std::vector<uint16_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 331);
  write_token_shard(base_path, tokens);
  const std::string base = read_file(base_path);
  const std::string path = dir.file("fuzz.bin");
  Rng rng{777};
  Outcomes out;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string f = corrupt_shard(rng, base);
    write_raw(path, f);
    attempt(iter, "token shard", out, [&] {
      TokenShard s(path);
      ASSERT_EQ(static_cast<uint64_t>(1024 + 2 * s.size()), f.size());
      uint64_t sum = 0;
      for (int64_t i = 0; i < s.size(); ++i) sum += s[i] + s.data()[i];
      (void)sum;
      s.check_vocab(65536);  // every uint16 fits
      try {
        s.check_vocab(static_cast<int>(rng.below(70000)));
      } catch (const mt::InputError&) {
        // a small vocabulary rejecting the shard is the expected outcome, not a failure
      }
    });
    if (::testing::Test::HasFailure()) FAIL() << "stopping at case " << iter;
  }
  EXPECT_GT(out.loaded, 100);
  EXPECT_GT(out.rejected, 1000);
  std::printf("token shard: %d loaded, %d rejected\n", out.loaded, out.rejected);
}

// ---------------------------------------------------------------------------------------------------------
// IDX

std::string corrupt_idx(Rng& rng, const std::string& f, size_t header) {
  if (rng.below(3) == 0) {  // rewrite one dim, big-endian, to a nearby or wild value
    std::string g = f;
    size_t field = 4 * (1 + rng.below((header - 4) / 4));
    uint32_t v = rng.below(2) ? static_cast<uint32_t>(rng.next()) : static_cast<uint32_t>(rng.below(8));
    for (int k = 0; k < 4; ++k) g[field + k] = static_cast<char>(v >> (24 - 8 * k));
    return g;
  }
  return corrupt_bytes(rng, f, header);
}

TEST(Fuzz, IdxCorruptions) {
  ScratchDir dir;
  IdxImages im;
  im.count = 2;
  im.rows = 3;
  im.cols = 4;
  for (int i = 0; i < 24; ++i) im.pixels.push_back(static_cast<uint8_t>(i));
  write_idx_images(dir.file("img.idx"), im);
  write_idx_labels(dir.file("lab.idx"), IdxLabels{{1, 2, 3, 4, 5, 6, 7, 8}});
  const std::string images = read_file(dir.file("img.idx"));
  const std::string labels = read_file(dir.file("lab.idx"));
  const std::string path = dir.file("fuzz.idx");
  Rng rng{4242};
  Outcomes out;
  for (int iter = 0; iter < 3000; ++iter) {
    bool is_images = rng.below(2);
    std::string f = corrupt_idx(rng, is_images ? images : labels, is_images ? 16 : 8);
    write_raw(path, f);
    attempt(iter, "idx", out, [&] {
      if (is_images) {
        IdxImages r = read_idx_images(path);
        ASSERT_GT(r.count * r.rows * r.cols, 0);
        ASSERT_EQ(static_cast<size_t>(r.count * r.rows * r.cols), r.pixels.size());
        ASSERT_EQ(16 + r.pixels.size(), f.size());
      } else {
        IdxLabels r = read_idx_labels(path);
        ASSERT_EQ(8 + r.labels.size(), f.size());
      }
    });
    if (::testing::Test::HasFailure()) FAIL() << "stopping at case " << iter;
  }
  EXPECT_GT(out.loaded, 100);
  EXPECT_GT(out.rejected, 1000);
  std::printf("idx: %d loaded, %d rejected\n", out.loaded, out.rejected);
}

}  // namespace
}  // namespace mt
