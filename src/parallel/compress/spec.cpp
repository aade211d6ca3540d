#include "parallel/compress/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace mt::compress {

namespace {
const char* kForms = "topk:RATIO, randk:RATIO (0 < RATIO <= 1), qsgd:BITS, nuqsgd:BITS (2..8), powersgd:RANK (>= 1) "
                     "or sign";

double parse_number(const std::string& text, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  MT_CHECK_INPUT(!value.empty() && end && *end == '\0' && std::isfinite(v), "--compress ", text, ": '", value,
                 "' is not a number; expected ", kForms);
  return v;
}
}  // namespace

std::string CompressSpec::str() const {
  switch (method) {
    case Method::none: return "none";
    case Method::topk: return mt::str("topk:", ratio);
    case Method::randk: return mt::str("randk:", ratio);
    case Method::qsgd: return mt::str("qsgd:", bits);
    case Method::nuqsgd: return mt::str("nuqsgd:", bits);
    case Method::powersgd: return mt::str("powersgd:", rank);
    case Method::sign: return "sign";
  }
  return "?";
}

CompressSpec CompressSpec::light() const {
  CompressSpec l = *this;
  switch (method) {
    case Method::topk:
    case Method::randk: l.ratio = std::min(1.0, 4 * ratio); break;
    case Method::qsgd:
    case Method::nuqsgd: l.bits = std::min(8, bits + 4); break;
    case Method::powersgd: l.rank = 4 * rank; break;
    case Method::sign: l.method = Method::none; break;
    case Method::none: break;
  }
  return l;
}

CompressSpec parse_compress_spec(const std::string& text) {
  CompressSpec s;
  if (text.empty() || text == "none") return s;
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon), value = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (name == "sign") {
    MT_CHECK_INPUT(colon == std::string::npos, "--compress ", text, ": sign takes no setting");
    s.method = Method::sign;
    return s;
  }
  MT_CHECK_INPUT(colon != std::string::npos && (name == "topk" || name == "randk" || name == "qsgd" ||
                                                name == "nuqsgd" || name == "powersgd"),
                 "--compress ", text, " is not understood; expected ", kForms);
  const double v = parse_number(text, value);
  if (name == "topk" || name == "randk") {
    MT_CHECK_INPUT(v > 0 && v <= 1, "--compress ", text, ": the ratio must be in (0, 1], got ", v);
    s.method = name == "topk" ? Method::topk : Method::randk;
    s.ratio = v;
  } else if (name == "powersgd") {
    MT_CHECK_INPUT(v >= 1 && v == std::floor(v) && v <= 1024, "--compress ", text,
                   ": the rank must be a whole number in 1..1024, got ", value);
    s.method = Method::powersgd;
    s.rank = (int)v;
  } else {
    MT_CHECK_INPUT(v >= 2 && v <= 8 && v == std::floor(v), "--compress ", text,
                   ": the bits per element must be a whole number in 2..8, got ", value);
    s.method = name == "qsgd" ? Method::qsgd : Method::nuqsgd;
    s.bits = (int)v;
  }
  return s;
}

}  // namespace mt::compress
