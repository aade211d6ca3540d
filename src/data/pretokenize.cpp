// GPT-2's pre-tokenizer regex by hand; see pretokenize.h.
#include "data/pretokenize.h"

#include <algorithm>

#include "data/unicode_class.h"

namespace mt::data {

namespace {

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

Utf8Char char_at(std::string_view text, size_t i) { return next_char(bytes(text) + i, text.size() - i); }

// End of the run of characters of class c starting at i.
size_t run_end(std::string_view text, size_t i, CharClass c) {
  while (i < text.size()) {
    const Utf8Char ch = char_at(text, i);
    if (ch.cls != c) break;
    i += ch.len;
  }
  return i;
}

// 's 't 're 've 'm 'll 'd at i (text[i] == '\''): the length, or 0.
size_t contraction(std::string_view text, size_t i) {
  if (i + 1 >= text.size()) return 0;
  const char b = text[i + 1];
  if (b == 's' || b == 't' || b == 'm' || b == 'd') return 2;
  if (i + 2 >= text.size()) return 0;
  const char c = text[i + 2];
  if ((b == 'r' && c == 'e') || (b == 'v' && c == 'e') || (b == 'l' && c == 'l')) return 3;
  return 0;
}

bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

size_t piece_end(std::string_view text, size_t i) {
  if (text[i] == '\'') {
    if (const size_t n = contraction(text, i)) return i + n;
  }
  const Utf8Char first = char_at(text, i);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional U+0020, then a run of one class.
  if (text[i] == ' ' && i + 1 < text.size()) {
    const Utf8Char next = char_at(text, i + 1);
    if (next.cls != CharClass::kSpace) return run_end(text, i + 1, next.cls);
  }
  if (first.cls != CharClass::kSpace) return run_end(text, i, first.cls);
  // "\s+(?!\S)": the whole run at the end of the text or before more whitespace (impossible: the run is
  // maximal), else the run minus its last character if that leaves one; "\s+": the run of one character.
  size_t last = i, j = i;
  while (j < text.size()) {
    const Utf8Char ch = char_at(text, j);
    if (ch.cls != CharClass::kSpace) break;
    last = j;
    j += ch.len;
  }
  if (j == text.size()) return j;
  return last > i ? last : j;
}

std::vector<size_t> split_points(std::string_view text, size_t parts) {
  std::vector<size_t> cuts{0};
  const size_t n = text.size();
  for (size_t p = 1; p < parts; ++p) {
    size_t k = std::max(cuts.back() + 1, p * n / parts);
    // A cut at k (text[k] == ' ') is a piece boundary whatever surrounds it: the piece holding text[k - 1],
    // a letter, is a letter run or a contraction and ends at the space; ' ' + letter starts " ?\p{L}+"; no
    // alternative looks behind, and none looks ahead past the letter after the space.
    while (k + 1 < n && !(text[k] == ' ' && ascii_letter(text[k - 1]) && ascii_letter(text[k + 1]))) ++k;
    if (k + 1 >= n) break;
    cuts.push_back(k);
  }
  cuts.push_back(n);
  return cuts;
}

}  // namespace mt::data
