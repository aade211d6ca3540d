// The safetensors file format: reading (memory-mapped, validated up front) and writing (streamed, atomic).
//
// Layout: an 8-byte little-endian uint64 N, then N bytes of UTF-8 JSON
//   {"__metadata__": {string: string}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
// then the data buffer; offsets are relative to the start of the data buffer, bytes are little-endian.
//
// The reader checks every header entry against the file before handing out anything, so later reads index
// the mapping without further checks; a bad file fails at open with a message naming the file and tensor.
// Only tensor bytes live here: which tensors a checkpoint holds and how they are sharded is checkpoint/'s
// business one level up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fs.h"

namespace mt {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL };
size_t dtype_size(DType);
const char* dtype_name(DType);  // "F32", ...; the spelling used in the header
// Parses a header spelling; returns false for an unknown name.
bool dtype_from_name(const std::string& name, DType* out);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data buffer
  int64_t numel() const;
};

// bfloat16 is the top half of a float32; conversion to bf16 rounds to nearest even (NaN stays NaN).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);  // IEEE half, including subnormals, inf and NaN

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // maps and validates the whole header; throws InputError
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const TensorInfo* find(const std::string& name) const;                // nullptr when absent
  const TensorInfo& get(const std::string& name) const;                 // InputError "FILE: no tensor named NAME"

  // The raw little-endian bytes of t (t.end - t.begin of them); t must come from this reader. Not aligned
  // in general: files from other writers need not pad the header.
  const uint8_t* bytes(const TensorInfo& t) const { return data_ + t.begin; }

  // Copies tensor `name` into dst[count] as float32, converting from F32, BF16, F16 or F64. count must equal
  // numel, else InputError naming file, tensor, expected and actual count. Other dtypes: InputError.
  void read_f32(const std::string& name, float* dst, int64_t count) const;

 private:
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // start of the data buffer inside file_
  uint64_t data_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
};

class SafetensorsWriter {
 public:
  void set_metadata(const std::string& key, const std::string& value);
  // data must stay valid until write(); tensors are written in the order added. Throws mt::Error on a
  // repeated or reserved name or a negative dim.
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void add_bf16(const std::string& name, std::vector<int64_t> shape, const uint16_t* data);
  // Any dtype: data holds numel * dtype_size(dtype) little-endian bytes.
  void add_raw(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Streams header and tensors to a temporary file, fsyncs and renames over path (see AtomicFileWriter);
  // no copy of the tensor data is made. Throws mt::Error.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    uint64_t nbytes;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> names_;
};

}  // namespace mt
