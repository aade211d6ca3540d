// GPT-2's pre-tokenizer: splits text into the pieces that BPE then encodes one by one. It is the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out by hand over UTF-8 (first alternative that matches wins; runs are greedy; \s+(?!\S) gives back
// the last whitespace character when a non-space follows, so that " word" keeps its space). Classes come
// from unicode_class.h; an ill-formed UTF-8 byte counts as one character of class "other", like '!'.
// Cost: one pass, one table load per character.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace mt::data {

// End (exclusive byte offset) of the piece that starts at byte i < text.size().
size_t piece_end(std::string_view text, size_t i);

// Calls f(piece) for every piece of text, in order; the pieces concatenate to text.
template <class F>
void for_each_piece(std::string_view text, F&& f) {
  for (size_t i = 0; i < text.size();) {
    const size_t j = piece_end(text, i);
    f(text.substr(i, j - i));
    i = j;
  }
}

// Byte offsets 0 = b[0] < b[1] < ... < b[k] = text.size(), k <= parts, where the text may be cut so that
// pre-tokenizing each part alone gives the same pieces as the whole: every cut is at " x" with an ASCII
// letter before the space and after it ("a b" -> "a" | " b"), the first such place at or after
// i * size / parts. Text without such places stays one part. The cuts depend on the text and `parts` only.
std::vector<size_t> split_points(std::string_view text, size_t parts);

}  // namespace mt::data
