// The three Unicode classes GPT-2's pre-tokenizer regex tests (\p{L}, \p{N}, \s) and UTF-8 decoding that
// never fails: an ill-formed byte is a character of its own, of class kOther (see docs/tokenizer.md).
// Classes come from ICU (libicu-dev): general categories L* and N*, and the White_Space property, which is
// what tiktoken's regex engine means by \s (JavaScript's \s differs on U+0085 and U+FEFF). ICU is asked once
// per code point to fill a table of 0x110000 bytes (1.1 MB, some 20 ms at first use); lookups are then one
// load. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::data {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Class of a code point (< 0x110000).
CharClass char_class(uint32_t cp);

// One character of s[0, n), n >= 1: its length in bytes (1..4) and class. A well-formed UTF-8 sequence
// (shortest form, no surrogates, <= U+10FFFF) is one character; any other lead byte is a 1-byte kOther.
struct Utf8Char {
  uint32_t len;
  CharClass cls;
};
Utf8Char next_char_slow(const unsigned char* s, size_t n);
inline Utf8Char next_char(const unsigned char* s, size_t n) {
  // ASCII inline: letters, digits, and the White_Space characters \t \n \v \f \r and ' '.
  const unsigned char b = s[0];
  if (b >= 0x80) return next_char_slow(s, n);
  if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return {1, CharClass::kLetter};
  if (b >= '0' && b <= '9') return {1, CharClass::kNumber};
  if (b == ' ' || (b >= '\t' && b <= '\r')) return {1, CharClass::kSpace};
  return {1, CharClass::kOther};
}

// Decodes one well-formed sequence at s[0, n); returns its length, or 0 if s does not start with one.
// *cp receives the code point.
uint32_t decode_utf8(const unsigned char* s, size_t n, uint32_t* cp);

}  // namespace mt::data
