// What `--compress` asks for: a codec and its setting, parsed from "topk:0.01", "randk:0.1", "qsgd:4",
// "nuqsgd:4", "powersgd:4" or "sign", with the light setting an adaptive controller switches to.
#pragma once

#include <string>

namespace mt::compress {

enum class Method { none, topk, randk, qsgd, nuqsgd, powersgd, sign };

struct CompressSpec {
  Method method = Method::none;
  double ratio = 0;  // topk, randk: fraction of entries kept, in (0, 1]
  int bits = 0;      // qsgd, nuqsgd: bits per element incl. the sign, 2..8
  int rank = 0;      // powersgd: rank of the approximation, >= 1

  bool enabled() const { return method != Method::none; }
  // Biased codecs keep what they did not send and add it to the next step's gradient.
  bool error_feedback() const {
    return method == Method::topk || method == Method::randk || method == Method::sign ||
           method == Method::powersgd;
  }
  std::string str() const;  // the flag's spelling: "topk:0.01"
  // The setting Accordion uses in critical regimes: 4x the entries (topk, randk, capped at all), 4 more
  // bits (qsgd, nuqsgd, capped at 8), 4x the rank (powersgd), no compression (sign).
  CompressSpec light() const;
};

// Throws mt::InputError naming --compress and the value when it is not one of the forms above.
CompressSpec parse_compress_spec(const std::string& text);

}  // namespace mt::compress
