// Unicode classes for the GPT-2 pre-tokenizer from ICU, cached in a flat table; see unicode_class.h.
#include "data/unicode_class.h"

#include <unicode/uchar.h>

#include <vector>

namespace mt::data {

namespace {

constexpr uint32_t kCodePoints = 0x110000;

std::vector<CharClass> build_table() {
  std::vector<CharClass> t(kCodePoints, CharClass::kOther);
  for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
    const UChar32 c = static_cast<UChar32>(cp);
    const uint32_t mask = U_GET_GC_MASK(c);
    if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE))
      t[cp] = CharClass::kSpace;
    else if (mask & U_GC_L_MASK)
      t[cp] = CharClass::kLetter;
    else if (mask & U_GC_N_MASK)
      t[cp] = CharClass::kNumber;
  }
  return t;
}

const std::vector<CharClass>& table() {
  static const std::vector<CharClass> t = build_table();
  return t;
}

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass char_class(uint32_t cp) { return cp < kCodePoints ? table()[cp] : CharClass::kOther; }

uint32_t decode_utf8(const unsigned char* s, size_t n, uint32_t* cp) {
  const unsigned char b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  // Second-byte ranges from the Unicode standard's table of well-formed sequences (3.9, table 3-7): they
  // exclude overlong forms (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and > U+10FFFF (F4 90..).
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (n < 2 || !is_cont(s[1])) return 0;
    *cp = ((b0 & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (n < 3 || !is_cont(s[1]) || !is_cont(s[2])) return 0;
    if ((b0 == 0xE0 && s[1] < 0xA0) || (b0 == 0xED && s[1] > 0x9F)) return 0;
    *cp = ((b0 & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (n < 4 || !is_cont(s[1]) || !is_cont(s[2]) || !is_cont(s[3])) return 0;
    if ((b0 == 0xF0 && s[1] < 0x90) || (b0 == 0xF4 && s[1] > 0x8F)) return 0;
    *cp = ((b0 & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
  }
  return 0;
}

Utf8Char next_char_slow(const unsigned char* s, size_t n) {
  uint32_t cp = 0;
  const uint32_t len = decode_utf8(s, n, &cp);
  if (len == 0) return {1, CharClass::kOther};
  return {len, table()[cp]};
}

}  // namespace mt::data
