// GPT-2's pre-tokenizer (src/data/pretokenize.*) and the Unicode classes under it (src/data/unicode_class.*):
// pieces of hand-written strings, worked out from the regex by hand; cuts for threads that leave the pieces as
// they are; UTF-8 decoding at the edges of the well-formed ranges.
#include "data/pretokenize.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "data/unicode_class.h"

namespace mt::data {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for_each_piece(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

using V = std::vector<std::string>;

TEST(Pretokenize, AsciiWordsNumbersPunctuation) {
  EXPECT_EQ(pieces(""), V{});
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces(" 123abc x!!! ?"), (V{" 123", "abc", " x", "!!!", " ?"}));
  EXPECT_EQ(pieces("a1b2"), (V{"a", "1", "b", "2"}));
  EXPECT_EQ(pieces("$5.00"), (V{"$", "5", ".", "00"}));
}

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(pieces("it's I'll you'd we've they're I'm don't"),
            (V{"it", "'s", " I", "'ll", " you", "'d", " we", "'ve", " they", "'re", " I", "'m", " don", "'t"}));
  // Case-sensitive, and only right after the apostrophe; a run of punctuation swallows the apostrophe.
  EXPECT_EQ(pieces("IT'S"), (V{"IT", "'", "S"}));
  EXPECT_EQ(pieces("'''s"), (V{"'''", "s"}));
  EXPECT_EQ(pieces("'lll"), (V{"'ll", "l"}));
  EXPECT_EQ(pieces("x 's"), (V{"x", " '", "s"}));
  EXPECT_EQ(pieces("'"), (V{"'"}));
  EXPECT_EQ(pieces("'r"), (V{"'", "r"}));
}

TEST(Pretokenize, WhitespaceRunsGiveBackTheirLastCharacter) {
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(pieces("end   "), (V{"end", "   "}));
  EXPECT_EQ(pieces("\t\tword"), (V{"\t", "\t", "word"}));
  EXPECT_EQ(pieces(" "), (V{" "}));
  EXPECT_EQ(pieces("   !"), (V{"  ", " !"}));
  // U+3000 (3 bytes) is White_Space: the run gives back a whole character, not a byte.
  EXPECT_EQ(pieces("a \xE3\x80\x80\xE3\x80\x80z"), (V{"a", " \xE3\x80\x80", "\xE3\x80\x80", "z"}));
  // U+0085 is White_Space (tiktoken's \s); U+FEFF is not (JavaScript's \s says it is).
  EXPECT_EQ(pieces("a\xC2\x85"
                   "b"),
            (V{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(pieces("a\xEF\xBB\xBF"
                   "b"),
            (V{"a", "\xEF\xBB\xBF", "b"}));
}

TEST(Pretokenize, UnicodeLettersNumbersAndSymbols) {
  EXPECT_EQ(pieces("na\xC3\xAFve caf\xC3\xA9"), (V{"na\xC3\xAFve", " caf\xC3\xA9"}));
  EXPECT_EQ(pieces("\xCE\xB1\xCE\xB2 \xCE\xB3"), (V{"\xCE\xB1\xCE\xB2", " \xCE\xB3"}));  // Greek
  EXPECT_EQ(pieces("\xE4\xB8\xAD\xE6\x96\x87!"), (V{"\xE4\xB8\xAD\xE6\x96\x87", "!"}));  // CJK, Lo
  EXPECT_EQ(pieces("x\xD9\xA3\xD9\xA4"), (V{"x", "\xD9\xA3\xD9\xA4"}));                  // Arabic-Indic 3 4, Nd
  EXPECT_EQ(pieces(" \xE2\x85\xAB\xC2\xB2"), (V{" \xE2\x85\xAB\xC2\xB2"}));              // Roman XII (Nl), ² (No)
  EXPECT_EQ(pieces("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80"), (V{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80"}));  // So
  // Devanagari: the virama (Mn) and vowel sign (Mc) are neither letters nor numbers.
  EXPECT_EQ(pieces("\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87"),
            (V{"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8", "\xE0\xA5\x8D", "\xE0\xA4\xA4", "\xE0\xA5\x87"}));
  EXPECT_EQ(pieces("a\xCC\x81"), (V{"a", "\xCC\x81"}));  // combining acute accent, Mn
}

TEST(Pretokenize, IllFormedBytesArePunctuation) {
  EXPECT_EQ(pieces("a\xFF"
                   "b"),
            (V{"a", "\xFF", "b"}));
  EXPECT_EQ(pieces(" \xFF\xFE!x"), (V{" \xFF\xFE!", "x"}));
  EXPECT_EQ(pieces("\xE4\xB8x"), (V{"\xE4\xB8", "x"}));          // truncated 3-byte sequence
  EXPECT_EQ(pieces("x\xF0\x9F\x98"), (V{"x", "\xF0\x9F\x98"}));  // truncated at the end
  EXPECT_EQ(pieces("\xC0\xAF"
                   "a"),
            (V{"\xC0\xAF", "a"}));                                 // overlong '/'
  EXPECT_EQ(pieces("\xED\xA0\x80 a"), (V{"\xED\xA0\x80", " a"}));  // surrogate U+D800
  EXPECT_EQ(pieces("\x80\x80 \x80"), (V{"\x80\x80", " \x80"}));    // lone continuation bytes
  EXPECT_EQ(pieces("\xC3"), (V{"\xC3"}));
}

TEST(Pretokenize, PiecesCoverAnyBytesInOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? "a ' \n\t1"[rng() % 8] : rng() % 256);
    std::string joined;
    for (const std::string& p : pieces(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

// Text with words, runs of spaces and newlines, punctuation, non-ASCII letters and ill-formed bytes.
std::string mixed_text(std::mt19937& rng, size_t n) {
  const char* parts[] = {"the",
                         " ",
                         "  ",
                         "\n",
                         "\n\n",
                         "'s",
                         "!",
                         "42",
                         "\xCE\xB1\xCE\xB2",
                         "\xE3\x80\x80",
                         "\xFF",
                         "x",
                         "Q",
                         "\t",
                         ".",
                         "'ll",
                         "\xF0\x9F\x98\x80"};
  std::string s;
  while (s.size() < n) s += parts[rng() % (sizeof parts / sizeof parts[0])];
  return s;
}

TEST(Pretokenize, SplitPointsKeepThePieces) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::string s = mixed_text(rng, 50 + rng() % 3000);
    const V whole = pieces(s);
    for (size_t parts = 1; parts <= 9; ++parts) {
      const std::vector<size_t> cuts = split_points(s, parts);
      ASSERT_GE(cuts.size(), 2u);
      ASSERT_LE(cuts.size(), parts + 1);
      ASSERT_EQ(cuts.front(), 0u);
      ASSERT_EQ(cuts.back(), s.size());
      V joined;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        ASSERT_LT(cuts[k], cuts[k + 1]);
        for (std::string& p : pieces(std::string_view(s).substr(cuts[k], cuts[k + 1] - cuts[k])))
          joined.push_back(std::move(p));
      }
      ASSERT_EQ(joined, whole) << "trial " << trial << ", " << parts << " parts";
    }
  }
}

TEST(Pretokenize, SplitPointsOnlyAtSpaceBetweenAsciiLetters) {
  EXPECT_EQ(split_points("aaaa bbbb cccc dddd", 4), (std::vector<size_t>{0, 4, 9, 14, 19}));
  EXPECT_EQ(split_points("a  b\n\nc", 3), (std::vector<size_t>{0, 7}));  // no "x y" anywhere
  EXPECT_EQ(split_points("", 4), (std::vector<size_t>{0, 0}));
  EXPECT_EQ(split_points("ab cd", 1), (std::vector<size_t>{0, 5}));
}

TEST(UnicodeClass, Utf8WellFormedRangeEdges) {
  struct Case {
    const char* bytes;
    uint32_t len, cp;
  };
  const Case cases[] = {
      {"\x7F", 1, 0x7F},
      {"\xC2\x80", 2, 0x80},
      {"\xDF\xBF", 2, 0x7FF},
      {"\xE0\xA0\x80", 3, 0x800},
      {"\xED\x9F\xBF", 3, 0xD7FF},
      {"\xEE\x80\x80", 3, 0xE000},
      {"\xEF\xBF\xBF", 3, 0xFFFF},
      {"\xF0\x90\x80\x80", 4, 0x10000},
      {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF},
      {"\xC1\xBF", 0, 0},
      {"\xE0\x9F\xBF", 0, 0},
      {"\xED\xA0\x80", 0, 0},
      {"\xF0\x8F\xBF\xBF", 0, 0},
      {"\xF4\x90\x80\x80", 0, 0},
      {"\xF5\x80\x80\x80", 0, 0},
      {"\x80", 0, 0},
      {"\xC2\x41", 0, 0},
      {"\xFF", 0, 0},
  };
  for (const Case& c : cases) {
    const std::string s = c.bytes;
    uint32_t cp = 0;
    EXPECT_EQ(decode_utf8(reinterpret_cast<const unsigned char*>(s.data()), s.size(), &cp), c.len) << c.cp;
    if (c.len) { EXPECT_EQ(cp, c.cp); }
  }
  uint32_t cp = 0;  // a sequence cut short by the end of the text
  EXPECT_EQ(decode_utf8(reinterpret_cast<const unsigned char*>("\xE4\xB8\xAD"), 2, &cp), 0u);
}

TEST(UnicodeClass, LettersNumbersWhiteSpace) {
  EXPECT_EQ(char_class('A'), CharClass::kLetter);
  EXPECT_EQ(char_class(0xAA), CharClass::kLetter);     // ª, Lo
  EXPECT_EQ(char_class(0x4E2D), CharClass::kLetter);   // 中
  EXPECT_EQ(char_class(0x10400), CharClass::kLetter);  // Deseret, outside the BMP
  EXPECT_EQ(char_class('7'), CharClass::kNumber);
  EXPECT_EQ(char_class(0xB2), CharClass::kNumber);     // ², No
  EXPECT_EQ(char_class(0x2162), CharClass::kNumber);   // Ⅲ, Nl
  EXPECT_EQ(char_class(0x0966), CharClass::kNumber);   // Devanagari 0, Nd
  EXPECT_EQ(char_class(0x1D7CE), CharClass::kNumber);  // mathematical bold 0
  for (uint32_t ws : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                      0x2029u, 0x202Fu, 0x205Fu, 0x3000u})
    EXPECT_EQ(char_class(ws), CharClass::kSpace) << ws;
  for (uint32_t other : {0x1Cu, 0x200Bu, 0xFEFFu, 0x180Eu, 0x21u, 0x27u, 0x0301u, 0x1F600u, 0xE000u, 0x10FFFFu})
    EXPECT_EQ(char_class(other), CharClass::kOther) << other;
  // The inline ASCII path agrees with the table.
  for (uint32_t b = 0; b < 0x80; ++b) {
    const unsigned char c = static_cast<unsigned char>(b);
    EXPECT_EQ(next_char(&c, 1).cls, char_class(b)) << b;
  }
}

}  // namespace
}  // namespace mt::data
