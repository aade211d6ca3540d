// safetensors reading and writing; the format is described in safetensors.h.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt {

// Tensor bytes are copied between the file and memory as they are; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// A real header is a few MB at most (a few hundred bytes per tensor); anything larger is a corrupt length
// field, and believing it would make us parse hundreds of MB of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Real headers nest three deep (root, entry, shape); the limit only keeps hostile input cheap.
constexpr int kMaxJsonDepth = 8;

struct DTypeRow {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},  {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2},  {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::U16, "U16", 2}, {DType::U32, "U32", 4},  {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1},
};

// kDTypes is indexed by the enum value.
const DTypeRow& row(DType d) {
  size_t i = static_cast<size_t>(d);
  MT_ASSERT(i < std::size(kDTypes) && kDTypes[i].dtype == d, "unknown DType ", i);
  return kDTypes[i];
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel * elem_size, or false on overflow (a corrupt shape can claim 2^70 elements).
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  if (n > static_cast<uint64_t>(INT64_MAX)) return false;
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(elem_size), out);
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Turns one header entry into a TensorInfo, checking JSON types, dtype, dims and the byte count. Offsets
// against the data buffer and against other tensors are checked by the caller.
TensorInfo parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  const std::string where = str(path, ": tensor '", name, "'");
  MT_CHECK_INPUT(e.is_object(), where, ": header entry is a JSON ", e.type_name(), ", expected an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    MT_CHECK_INPUT(e.contains(key), where, ": header entry has no \"", key, "\"");

  TensorInfo t;
  t.name = name;
  const nlohmann::json& dt = e["dtype"];
  MT_CHECK_INPUT(dt.is_string(), where, ": \"dtype\" is a JSON ", dt.type_name(), ", expected a string");
  const std::string& dname = dt.get_ref<const std::string&>();
  MT_CHECK_INPUT(dtype_from_name(dname, &t.dtype), where, ": unknown dtype \"", dname,
                 "\" (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 U16 U32 U64 BOOL)");

  const nlohmann::json& sh = e["shape"];
  MT_CHECK_INPUT(sh.is_array(), where, ": \"shape\" is a JSON ", sh.type_name(), ", expected an array");
  for (size_t i = 0; i < sh.size(); ++i) {
    const nlohmann::json& d = sh[i];
    MT_CHECK_INPUT(d.is_number_integer(), where, ": shape[", i, "] is a JSON ", d.type_name(), ", expected an integer");
    MT_CHECK_INPUT(!d.is_number_unsigned() || d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where,
                   ": shape[", i, "] = ", d.get<uint64_t>(), " is too large");
    int64_t v = d.get<int64_t>();
    MT_CHECK_INPUT(v >= 0, where, ": negative dim shape[", i, "] = ", v);
    t.shape.push_back(v);
  }

  const nlohmann::json& off = e["data_offsets"];
  MT_CHECK_INPUT(off.is_array() && off.size() == 2, where, ": \"data_offsets\" must be an array [begin, end], found a JSON ",
                 off.type_name(), off.is_array() ? str(" of ", off.size(), " elements") : "");
  for (size_t i = 0; i < 2; ++i) {
    MT_CHECK_INPUT(off[i].is_number_integer(), where, ": data_offsets[", i, "] is a JSON ", off[i].type_name(),
                   ", expected an integer");
    MT_CHECK_INPUT(off[i].is_number_unsigned(), where, ": negative data_offsets[", i, "] = ", off[i].get<int64_t>());
  }
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  MT_CHECK_INPUT(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] has begin > end");

  uint64_t nbytes = 0;
  MT_CHECK_INPUT(checked_nbytes(t.shape, dtype_size(t.dtype), &nbytes), where, ": shape ", shape_text(t.shape),
                 " of ", dname, " is too large to address");
  MT_CHECK_INPUT(nbytes == t.end - t.begin, where, ": shape ", shape_text(t.shape), " of ", dname, " needs ", nbytes,
                 " bytes but data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin, " bytes");
  return t;
}

}  // namespace

size_t dtype_size(DType d) { return row(d).size; }
const char* dtype_name(DType d) { return row(d).name; }

bool dtype_from_name(const std::string& name, DType* out) {
  for (const DTypeRow& r : kDTypes) {
    if (name == r.name) {
      *out = r.dtype;
      return true;
    }
  }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  // Plain rounding could carry a NaN's payload into the exponent and turn it into inf; keep it a quiet NaN.
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);  // round to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float32.
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf or NaN
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

// ---------------------------------------------------------------------------------------------------------
// Reader

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path) {
  const uint64_t fsize = file_.size();
  MT_CHECK_INPUT(fsize >= 8, path, ": file is ", fsize, " bytes, shorter than the 8-byte header length (not a safetensors file?)");
  const uint64_t n = load_le64(file_.data());
  MT_CHECK_INPUT(n <= kMaxHeaderBytes, path, ": header length ", n, " bytes exceeds the ", kMaxHeaderBytes >> 20,
                 " MB limit (not a safetensors file?)");
  MT_CHECK_INPUT(n <= fsize - 8, path, ": header length ", n, " bytes but only ", fsize - 8,
                 " bytes follow the length field (truncated file?)");

  const char* hbegin = reinterpret_cast<const char*>(file_.data() + 8);
  nlohmann::json header;
  try {
    auto depth_guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      MT_CHECK_INPUT(depth <= kMaxJsonDepth, path, ": header JSON nests deeper than ", kMaxJsonDepth, " levels");
      return true;
    };
    header = nlohmann::json::parse(hbegin, hbegin + n, depth_guard);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(str(path, ": header is not valid JSON: ", e.what()));
  }
  MT_CHECK_INPUT(header.is_object(), path, ": header is a JSON ", header.type_name(), ", expected an object");

  data_ = file_.data() + 8 + n;
  data_size_ = fsize - 8 - n;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      MT_CHECK_INPUT(value.is_object(), path, ": __metadata__ is a JSON ", value.type_name(),
                     ", expected an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        MT_CHECK_INPUT(mv.is_string(), path, ": __metadata__ entry '", mk, "' is a JSON ", mv.type_name(),
                       ", expected a string");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    TensorInfo t = parse_entry(path, key, value);
    MT_CHECK_INPUT(t.end <= data_size_, path, ": tensor '", key, "': data_offsets [", t.begin, ", ", t.end,
                   "] reach beyond the data buffer of ", data_size_, " bytes (truncated file?)");
    tensors_.push_back(std::move(t));
  }

  std::stable_sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Empty tensors occupy no bytes and may sit anywhere; every other tensor must start at or after the end
  // of all non-empty tensors that start before it.
  const TensorInfo* reach = nullptr;  // the non-empty tensor with the largest end so far
  for (const TensorInfo& t : tensors_) {
    if (t.begin == t.end) continue;
    MT_CHECK_INPUT(reach == nullptr || t.begin >= reach->end, path, ": tensors '", reach->name, "' [", reach->begin, ", ",
                   reach->end, ") and '", t.name, "' [", t.begin, ", ", t.end, ") overlap");
    reach = &t;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsReader::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  MT_CHECK_INPUT(t != nullptr, path(), ": no tensor named ", name);
  return *t;
}

void SafetensorsReader::read_f32(const std::string& name, float* dst, int64_t count) const {
  const TensorInfo& t = get(name);
  const int64_t n = t.numel();
  MT_CHECK_INPUT(count == n, path(), ": tensor '", name, "' has ", n, " elements (shape ", shape_text(t.shape),
                 ") but the destination expects ", count);
  const uint8_t* src = bytes(t);
  switch (t.dtype) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16:
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);  // src is not necessarily 2-byte aligned
        dst[i] = t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = static_cast<float>(d);
      }
      return;
    default:
      throw InputError(str(path(), ": tensor '", name, "' has dtype ", dtype_name(t.dtype),
                           ", which cannot be read as float32 (supported: F32, BF16, F16, F64)"));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data) {
  add_raw(name, DType::F32, std::move(shape), data);
}

void SafetensorsWriter::add_bf16(const std::string& name, std::vector<int64_t> shape, const uint16_t* data) {
  add_raw(name, DType::BF16, std::move(shape), data);
}

void SafetensorsWriter::add_raw(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  MT_REQUIRE(Error, name != "__metadata__", "safetensors: '__metadata__' is reserved and cannot name a tensor");
  MT_REQUIRE(Error, !names_.count(name), "safetensors: tensor '", name, "' added twice");
  for (int64_t d : shape) MT_REQUIRE(Error, d >= 0, "safetensors: tensor '", name, "' has negative dim in shape ", shape_text(shape));
  uint64_t nbytes = 0;
  MT_REQUIRE(Error, checked_nbytes(shape, dtype_size(dtype), &nbytes), "safetensors: tensor '", name, "' shape ",
             shape_text(shape), " is too large");
  MT_REQUIRE(Error, data != nullptr || nbytes == 0, "safetensors: tensor '", name, "' has ", nbytes, " bytes but no data");
  names_[name] = entries_.size();
  entries_.push_back(Entry{name, dtype, std::move(shape), data, nbytes});
}

void SafetensorsWriter::write(const std::string& path) const {
  // ordered_json keeps the header in the same order as the data, which makes files easy to inspect.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("cannot write ", path, ": a tensor name or metadata string is not valid UTF-8: ", e.what()));
  }
  // Pad with spaces so the data buffer starts 8-byte aligned in the file (and in an mmap of it), as the
  // reference implementation does; JSON ignores trailing whitespace.
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFileWriter out(path);
  uint64_t n = text.size();
  out.write(&n, 8);
  out.write(text.data(), text.size());
  for (const Entry& e : entries_) out.write(e.data, e.nbytes);
  out.commit();
}

}  // namespace mt
