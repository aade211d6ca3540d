// IDX (MNIST) reading and writing; the format is in idx.h.
#include "data/idx.h"

#include "core/error.h"
#include "core/fs.h"

namespace mt {
namespace {

uint32_t load_be32(const std::string& buf, size_t pos) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(buf[pos + i])); };
  return b(0) << 24 | b(1) << 16 | b(2) << 8 | b(3);
}

void store_be32(std::string& buf, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) buf.push_back(static_cast<char>((v >> shift) & 0xFF));
}

// Checks the magic, that no dim is 0 and that the file is exactly as long as the dims say; returns the dims.
std::vector<uint32_t> read_header(const std::string& path, const std::string& buf, uint32_t magic, size_t ndims,
                                  const char* what) {
  const size_t header = 4 + 4 * ndims;
  if (buf.size() >= 2 && static_cast<uint8_t>(buf[0]) == 0x1F && static_cast<uint8_t>(buf[1]) == 0x8B)
    throw InputError(str(path, ": looks gzip-compressed; gunzip it first"));
  MT_CHECK_INPUT(buf.size() >= header, path, ": file is ", buf.size(), " bytes, shorter than the ", header,
                 "-byte IDX ", what, " header");
  const uint32_t found = load_be32(buf, 0);
  MT_CHECK_INPUT(found == magic, path, ": bad magic: expected ", magic, " (IDX ", what, "), found ", found,
                 found == kIdxImagesMagic   ? " (an images file)"
                 : found == kIdxLabelsMagic ? " (a labels file)"
                                            : "");
  std::vector<uint32_t> dims;
  for (size_t i = 0; i < ndims; ++i) {
    dims.push_back(load_be32(buf, 4 + 4 * i));
    MT_CHECK_INPUT(dims.back() > 0, path, ": dim ", i, " of the IDX ", what, " header is 0");
  }
  // Three uint32 dims multiply to at most 2^96, so check in steps.
  uint64_t expected = header;
  uint64_t body = 1;
  for (uint32_t d : dims) MT_CHECK_INPUT(!__builtin_mul_overflow(body, uint64_t{d}, &body), path, ": IDX dims overflow");
  MT_CHECK_INPUT(!__builtin_add_overflow(expected, body, &expected), path, ": IDX dims overflow");
  MT_CHECK_INPUT(buf.size() >= expected, path, ": truncated: header promises ", expected, " bytes, file has ", buf.size());
  MT_CHECK_INPUT(buf.size() == expected, path, ": header promises ", expected, " bytes, file has ", buf.size(), " (",
                 buf.size() - expected, " extra)");
  return dims;
}

void check_dim(const std::string& path, int64_t d, const char* name) {
  MT_REQUIRE(Error, d > 0 && d <= int64_t{UINT32_MAX}, "cannot write ", path, ": ", name, " = ", d,
             " must be in [1, 2^32)");
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  std::string buf = read_file(path);
  std::vector<uint32_t> dims = read_header(path, buf, kIdxImagesMagic, 3, "images");
  IdxImages out;
  out.count = dims[0];
  out.rows = dims[1];
  out.cols = dims[2];
  out.pixels.assign(buf.begin() + 16, buf.end());
  return out;
}

IdxLabels read_idx_labels(const std::string& path) {
  std::string buf = read_file(path);
  read_header(path, buf, kIdxLabelsMagic, 1, "labels");
  IdxLabels out;
  out.labels.assign(buf.begin() + 8, buf.end());
  return out;
}

void write_idx_images(const std::string& path, const IdxImages& images) {
  check_dim(path, images.count, "count");
  check_dim(path, images.rows, "rows");
  check_dim(path, images.cols, "cols");
  // Each dim is < 2^32 but their product can still overflow.
  uint64_t n = 0;
  bool overflow = __builtin_mul_overflow(uint64_t(images.count), uint64_t(images.rows), &n) ||
                  __builtin_mul_overflow(n, uint64_t(images.cols), &n);
  MT_REQUIRE(Error, !overflow && n == images.pixels.size(), "cannot write ", path, ": ", images.count, " x ",
             images.rows, " x ", images.cols, " images need ", images.count, "*", images.rows, "*", images.cols,
             " pixels, got ", images.pixels.size());
  std::string buf;
  buf.reserve(16 + images.pixels.size());
  store_be32(buf, kIdxImagesMagic);
  store_be32(buf, static_cast<uint32_t>(images.count));
  store_be32(buf, static_cast<uint32_t>(images.rows));
  store_be32(buf, static_cast<uint32_t>(images.cols));
  buf.append(images.pixels.begin(), images.pixels.end());
  write_file_atomic(path, buf);
}

void write_idx_labels(const std::string& path, const IdxLabels& labels) {
  check_dim(path, static_cast<int64_t>(labels.labels.size()), "label count");
  std::string buf;
  buf.reserve(8 + labels.labels.size());
  store_be32(buf, kIdxLabelsMagic);
  store_be32(buf, static_cast<uint32_t>(labels.labels.size()));
  buf.append(labels.labels.begin(), labels.labels.end());
  write_file_atomic(path, buf);
}

}  // namespace mt
