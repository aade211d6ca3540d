// Tests for checkpoint/safetensors: bit-exact round trips, dtype conversions against hand-computed values,
// and one case per malformation, each checking that the message names the file and the detail.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <limits>

#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::safetensors_bytes;
using testing_io::ScratchDir;
using testing_io::throws_input_error;
using testing_io::write_raw;

TEST(Safetensors, RoundTripIsBitExact) {
  ScratchDir dir;
  std::string path = dir.file("rt.safetensors");
  // Values whose bits are easy to lose: -0, a subnormal, inf, a NaN with payload, the largest float.
  std::vector<float> w = {1.5f, -0.0f, std::numeric_limits<float>::denorm_min(), INFINITY,
                          std::bit_cast<float>(0x7FC12345u), std::numeric_limits<float>::max()};
  std::vector<uint16_t> b = {0x3F80, 0xC000, 0x7FC1, 0x0001};
  float scalar = 42.0f;
  SafetensorsWriter wr;
  wr.set_metadata("format", "pt");
  wr.set_metadata("step", "1200");
  wr.add_f32("h.0.w", {2, 3}, w.data());
  wr.add_bf16("h.0.b", {4}, b.data());
  wr.add_f32("scalar", {}, &scalar);
  wr.add_f32("empty", {0, 5}, nullptr);
  wr.write(path);
  EXPECT_EQ(dir.count_temp_files(), 0);

  SafetensorsReader r(path);
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "1200"}}));
  ASSERT_EQ(r.tensors().size(), 4u);
  // Sorted by offset; the writer lays tensors out in the order added (the empty one has begin == end).
  EXPECT_EQ(r.tensors()[0].name, "h.0.w");
  EXPECT_EQ(r.tensors()[1].name, "h.0.b");
  EXPECT_EQ(r.tensors()[2].name, "scalar");
  EXPECT_EQ(r.tensors()[3].name, "empty");

  const TensorInfo& tw = r.get("h.0.w");
  EXPECT_EQ(tw.dtype, DType::F32);
  EXPECT_EQ(tw.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tw.begin, 0u);
  EXPECT_EQ(tw.end, 24u);
  EXPECT_EQ(tw.numel(), 6);
  std::vector<float> got(6);
  r.read_f32("h.0.w", got.data(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(w[i])) << i;

  const TensorInfo& tb = r.get("h.0.b");
  EXPECT_EQ(tb.dtype, DType::BF16);
  EXPECT_EQ(tb.begin, 24u);
  EXPECT_EQ(tb.end, 32u);
  EXPECT_EQ(std::memcmp(r.bytes(tb), b.data(), 8), 0);

  EXPECT_EQ(r.get("scalar").shape.size(), 0u);
  EXPECT_EQ(r.get("scalar").numel(), 1);
  float s = 0;
  r.read_f32("scalar", &s, 1);
  EXPECT_EQ(s, 42.0f);
  EXPECT_EQ(r.get("empty").numel(), 0);
  r.read_f32("empty", nullptr, 0);
  EXPECT_EQ(r.find("absent"), nullptr);
  EXPECT_EQ(r.find("scalar"), &r.get("scalar"));

  // The header is space-padded so that the data buffer starts 8-byte aligned.
  std::string raw = read_file(path);
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + 24 + 8 + 4);

  SafetensorsReader moved = std::move(r);
  EXPECT_EQ(moved.get("scalar").end, 36u);
}

TEST(Safetensors, Bf16ConversionMatchesHandComputedBits) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_bf16(0.15625f), 0x3E20);  // 1.25 * 2^-3
  // 1 + 2^-8 lies halfway between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81): ties go to even.
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3F82);  // 1 + 3 * 2^-8: halfway, rounds up to even
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // just above halfway
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7F800001u)))));  // NaN stays NaN

  ScratchDir dir;
  std::string path = dir.file("bf16.safetensors");
  std::vector<uint16_t> b = {0x3F80, 0xC000, 0x3FC0, 0x0000, 0x8000, 0x7F80, 0x4049};
  SafetensorsWriter wr;
  wr.add_bf16("b", {7}, b.data());
  wr.write(path);
  SafetensorsReader r(path);
  std::vector<float> got(7);
  r.read_f32("b", got.data(), 7);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(got[2], 1.5f);
  EXPECT_EQ(std::bit_cast<uint32_t>(got[3]), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(got[4]), 0x80000000u);
  EXPECT_EQ(got[5], INFINITY);
  EXPECT_EQ(got[6], 3.140625f);  // 0x4049 = 1.5703125 * 2
}

TEST(Safetensors, ReadsF16AndF64AsF32) {
  ScratchDir dir;
  std::string path = dir.file("mixed.safetensors");
  // F16: 1, -2, smallest subnormal 2^-24, largest subnormal, 65504 (max), -inf, 0x3555 = 1365/1024/4.
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x7BFF, 0xFC00, 0x3555};
  std::vector<double> d = {0.5, -3.25, 1e-50};
  std::vector<int32_t> ints = {1, 2};
  SafetensorsWriter wr;
  wr.add_raw("h", DType::F16, {7}, h.data());
  wr.add_raw("d", DType::F64, {3}, d.data());
  wr.add_raw("i", DType::I32, {2}, ints.data());
  wr.write(path);

  SafetensorsReader r(path);
  std::vector<float> got(7);
  r.read_f32("h", got.data(), 7);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(got[2], 0x1p-24f);
  EXPECT_EQ(got[3], 1023 * 0x1p-24f);
  EXPECT_EQ(got[4], 65504.0f);
  EXPECT_EQ(got[5], -INFINITY);
  EXPECT_EQ(got[6], 0.333251953125f);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  r.read_f32("d", got.data(), 3);
  EXPECT_EQ(got[0], 0.5f);
  EXPECT_EQ(got[1], -3.25f);
  EXPECT_EQ(got[2], 0.0f);
  EXPECT_EQ(r.get("i").dtype, DType::I32);
  EXPECT_TRUE(throws_input_error([&] { r.read_f32("i", got.data(), 2); }, {path, "'i'", "I32"}));
}

TEST(Safetensors, ReadF32RejectsWrongCountAndUnknownName) {
  ScratchDir dir;
  std::string path = dir.file("count.safetensors");
  std::vector<float> w(6, 1.0f);
  SafetensorsWriter wr;
  wr.add_f32("wte", {2, 3}, w.data());
  wr.write(path);
  SafetensorsReader r(path);
  std::vector<float> dst(6);
  EXPECT_TRUE(throws_input_error([&] { r.read_f32("wte", dst.data(), 5); }, {path, "'wte'", "has 6 elements", "expects 5"}));
  EXPECT_TRUE(throws_input_error([&] { r.get("wpe"); }, {path + ": no tensor named wpe"}));
  EXPECT_TRUE(throws_input_error([&] { r.read_f32("wpe", dst.data(), 6); }, {path + ": no tensor named wpe"}));
}

TEST(Safetensors, WriterRejectsMisuse) {
  float x = 0;
  SafetensorsWriter wr;
  wr.add_f32("a", {1}, &x);
  EXPECT_THROW(wr.add_f32("a", {1}, &x), mt::Error);
  EXPECT_THROW(wr.add_f32("__metadata__", {1}, &x), mt::Error);
  EXPECT_THROW(wr.add_f32("neg", {-1}, &x), mt::Error);
  EXPECT_THROW(wr.add_f32("null", {3}, nullptr), mt::Error);
  ScratchDir dir;
  std::string path = dir.file("bad_utf8.safetensors");
  wr.add_f32("\xff\xfe", {1}, &x);
  EXPECT_THROW(wr.write(path), mt::Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(dir.count_temp_files(), 0);
}

// One malformed file per case: its header (or whole bytes) and the text the error must contain besides
// the file name.
struct BadFile {
  const char* name;
  std::string bytes;
  std::vector<std::string> expect;
};

std::string st(const std::string& header, size_t data_bytes = 0) {
  return safetensors_bytes(header, std::string(data_bytes, '\0'));
}

std::vector<BadFile> bad_files() {
  const std::string w24 = R"("w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})";
  return {
      {"short_file", std::string("\x05\x00\x00\x00\x00", 5), {"5 bytes", "shorter than the 8-byte"}},
      {"header_longer_than_file", testing_io::le64(1000) + std::string(20, ' '), {"header length 1000", "only 20 bytes"}},
      {"header_absurd", testing_io::le64(200ull << 20) + "{}", {"header length 209715200", "100 MB"}},
      {"header_length_max", testing_io::le64(UINT64_MAX) + "{}", {"header length 18446744073709551615"}},
      {"invalid_json", st(R"({"w": )"), {"not valid JSON"}},
      {"trailing_garbage", st(R"({} x)"), {"not valid JSON"}},
      {"not_an_object", st("[1, 2]"), {"header is a JSON array, expected an object"}},
      {"too_deep", st(std::string(50, '[') + std::string(50, ']')), {"nests deeper than"}},
      {"metadata_not_object", st(R"({"__metadata__": "pt"})"), {"__metadata__ is a JSON string"}},
      {"metadata_value_not_string", st(R"({"__metadata__": {"step": 5}})"), {"__metadata__ entry 'step'", "number"}},
      {"entry_not_object", st(R"({"w": 5})"), {"tensor 'w'", "is a JSON number, expected an object"}},
      {"missing_dtype", st(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4), {"tensor 'w'", "no \"dtype\""}},
      {"missing_shape", st(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), {"tensor 'w'", "no \"shape\""}},
      {"missing_offsets", st(R"({"w": {"dtype": "F32", "shape": [1]}})", 4), {"tensor 'w'", "no \"data_offsets\""}},
      {"dtype_not_string", st(R"({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4),
       {"tensor 'w'", "\"dtype\" is a JSON number"}},
      {"shape_not_array", st(R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4),
       {"tensor 'w'", "\"shape\" is a JSON number"}},
      {"shape_float", st(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
       {"tensor 'w'", "shape[0] is a JSON number, expected an integer"}},
      {"offsets_one_element", st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 4),
       {"tensor 'w'", "data_offsets", "of 1 elements"}},
      {"offsets_strings", st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}})", 4),
       {"tensor 'w'", "data_offsets[0] is a JSON string"}},
      {"offset_negative", st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
       {"tensor 'w'", "negative data_offsets[0] = -4"}},
      {"unknown_dtype", st(R"({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", 1),
       {"tensor 'w'", "unknown dtype \"F8_E4M3\""}},
      {"negative_dim", st(R"({"w": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 16]}})", 16),
       {"tensor 'w'", "negative dim shape[0] = -2"}},
      {"dim_overflow", st(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
       {"tensor 'w'", "too large"}},
      {"size_mismatch", st(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24),
       {"tensor 'w'", "needs 24 bytes", "span 20 bytes"}},
      {"begin_after_end", st(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8),
       {"tensor 'w'", "[8, 4] has begin > end"}},
      {"end_beyond_buffer", st("{" + w24 + "}", 16), {"tensor 'w'", "[0, 24]", "data buffer of 16 bytes"}},
      {"overlap",
       st(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
       {"'a' [0, 8)", "'b' [4, 12)", "overlap"}},
      {"contained_overlap",
       st(R"({"big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 16),
       {"overlap", "'big'"}},
  };
}

TEST(Safetensors, RejectsEachMalformation) {
  ScratchDir dir;
  for (const BadFile& c : bad_files()) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_raw(path, c.bytes);
    std::function<void()> open = [&] { SafetensorsReader r(path); };
    EXPECT_TRUE(throws_input_error(open, {path + ": "}));
    for (const std::string& part : c.expect) EXPECT_TRUE(throws_input_error(open, {part}));
  }
}

TEST(Safetensors, AcceptsLegalOddities) {
  ScratchDir dir;
  std::string path = dir.file("odd.safetensors");
  // No metadata, unpadded header, a gap between tensors, trailing bytes, an empty tensor placed inside
  // another's range, an unknown extra key: all legal.
  write_raw(path, safetensors_bytes(R"({"b": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]},
    "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4], "extra": 1},
    "z": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]}})",
                                    std::string("\x80\x3f\x00\xc0..\x07\x09tail", 12)));
  SafetensorsReader r(path);
  EXPECT_TRUE(r.metadata().empty());
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.tensors()[0].name, "a");
  EXPECT_EQ(r.tensors()[1].name, "z");
  EXPECT_EQ(r.tensors()[2].name, "b");
  float a[2];
  r.read_f32("a", a, 2);
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -2.0f);
  EXPECT_EQ(r.bytes(r.get("b"))[1], 9);
}

TEST(Safetensors, MissingFileNamesPath) {
  ScratchDir dir;
  std::string path = dir.file("nope.safetensors");
  EXPECT_TRUE(throws_input_error([&] { SafetensorsReader r(path); }, {"cannot open " + path}));
}

}  // namespace
}  // namespace mt
