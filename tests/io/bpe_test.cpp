// GPT-2 BPE (src/data/bpe.*) and documents (src/data/tokenizer.*) over a small vocabulary written by the test:
// the merge loop against GPT-2's encoder.py algorithm written out plainly here, the cache, thread counts,
// decode(encode(x)) == x for any bytes, and the vocabulary files' errors. The real GPT-2 files and the
// reference encoders are in test_gpt2_tokenizer.py.
#include "data/bpe.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "tests/io/io_test_util.h"

namespace mt::data {
namespace {

using testing_io::ScratchDir;
using testing_io::throws_input_error;
using testing_io::write_raw;

// GPT-2's bytes_to_unicode stand-in of byte b, as UTF-8.
std::string stand_in(unsigned char b) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool prints = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    const int c = prints ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}
std::string written(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += stand_in(b);
  return s;
}

// Ids: byte b is token b, then the merges' products in order; <|endoftext|> is last. Merges chain on themselves and
// overlap ("a a", "aa a", "aa aa") so that ties and the order of merges matter.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"a", "a"},  {"b", "c"}, {"aa", "a"},  {"aa", "aa"},     {"a", "bc"},  {"c", "c"}, {" ", "a"}, {"aaa", "bc"},
    {"cc", "c"}, {"b", "b"}, {" a", "bb"}, {"\xff", "\xfe"}, {"bb", "bb"}, {"a", "b"}, {"ab", "c"}};

struct ToyVocab {
  ScratchDir dir;
  std::map<std::string, int> ids;
  ToyVocab() {
    std::string json = "{";
    auto add = [&](const std::string& bytes, const std::string& key) {
      if (ids.count(bytes)) return;  // "a"+"bc" and "ab"+"c" both make "abc"
      const int id = static_cast<int>(ids.size());
      ids[bytes] = id;
      json += (id ? ", \"" : "\"") + (key == "\"" ? "\\\"" : key == "\\" ? "\\\\" : key) + "\": " + std::to_string(id);
    };
    for (int b = 0; b < 256; ++b)
      add(std::string(1, static_cast<char>(b)), written(std::string(1, static_cast<char>(b))));
    std::string bpe = "#version: 0.2\n";
    for (const auto& [x, y] : kMerges) {
      add(x + y, written(x + y));
      bpe += written(x) + " " + written(y) + "\n";
    }
    add("<|endoftext|>", "<|endoftext|>");
    write_raw(dir.file("encoder.json"), json + "}");
    write_raw(dir.file("vocab.bpe"), bpe);
  }
};

// GPT-2's encoder.py bpe(): merge every occurrence of the lowest-ranked pair in one left-to-right sweep.
std::vector<int32_t> reference_bpe(const std::string& piece, const std::map<std::string, int>& ids) {
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t r = 0; r < kMerges.size(); ++r) rank[kMerges[r]] = static_cast<int>(r);
  std::vector<std::string> word;
  for (char c : piece) word.emplace_back(1, c);
  while (word.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> bigram;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = rank.find({word[i], word[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        bigram = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == bigram.first && word[i + 1] == bigram.second) {
        merged.push_back(bigram.first + bigram.second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> out;
  for (const std::string& w : word) out.push_back(ids.at(w));
  return out;
}

std::string random_piece(std::mt19937& rng, size_t n) {
  std::string s(n, 'a');
  for (char& c : s) c = "aaabbc \xff\xfe"[rng() % 9];
  return s;
}

TEST(Bpe, MergeLoopEqualsGpt2Algorithm) {
  ToyVocab v;
  const Gpt2Vocab vocab(v.dir.path().string());
  ASSERT_EQ(vocab.size(), 256 + static_cast<int>(kMerges.size()));  // one product made twice
  EXPECT_EQ(vocab.eot(), vocab.size() - 1);
  BpeEncoder enc(vocab);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string piece = random_piece(rng, 1 + rng() % (trial < 2900 ? 40 : 3000));
    std::vector<int32_t> got;
    enc.encode_piece(piece, got);
    ASSERT_EQ(got, reference_bpe(piece, v.ids)) << "piece \"" << piece << "\"";
  }
  std::vector<int32_t> got;
  enc.encode_piece("aaaaa", got);  // "aa" "aa" "a" (rank 0, leftmost first), then "aa"+"a" (rank 2) beats "aa"+"aa" (3)
  EXPECT_EQ(got, (std::vector<int32_t>{v.ids.at("aa"), v.ids.at("aaa")}));
  got.clear();
  enc.encode_piece("abcc", got);  // "bc" (rank 1) before "cc" (rank 5), then "a"+"bc" (rank 4)
  EXPECT_EQ(got, (std::vector<int32_t>{v.ids.at("abc"), v.ids.at("c")}));
}

TEST(Bpe, CacheThreadsAndRoundTrip) {
  ToyVocab v;
  const Gpt2Vocab vocab(v.dir.path().string());
  std::mt19937 rng(5);
  std::string text;
  while (text.size() < 200000) text += random_piece(rng, 1 + rng() % 12) + (rng() % 3 ? " " : "\n") + "ab cd ";
  // Without the cache, piece by piece: the reference for the cached and threaded paths.
  std::vector<int32_t> plain;
  BpeEncoder fresh(vocab);
  for_each_piece(text, [&](std::string_view p) { fresh.encode_piece(p, plain); });
  BpeEncoder enc(vocab);
  std::vector<int32_t> cached;
  enc.encode(text, cached);
  EXPECT_EQ(cached, plain);
  cached.clear();
  enc.encode(text, cached);  // second time from the cache
  EXPECT_EQ(cached, plain);
  for (int threads : {1, 2, 3, 8}) EXPECT_EQ(encode_gpt2(vocab, text, threads), plain) << threads << " threads";
  EXPECT_EQ(decode_gpt2(vocab, plain), text);
  for (int trial = 0; trial < 500; ++trial) {  // any bytes at all
    std::string s(rng() % 30, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(decode_gpt2(vocab, encode_gpt2(vocab, s, 1)), s);
  }
  EXPECT_TRUE(encode_gpt2(vocab, "", 4).empty());
  EXPECT_TRUE(throws_input_error([&] { decode_gpt2(vocab, {1, vocab.size()}); }, {"position 1", "outside"}));
}

TEST(Bpe, DocumentsWithEndOfText) {
  ToyVocab v;
  const Tokenizer tok("gpt2", v.dir.path().string());
  const int eot = tok.vocab_size() - 1;
  const int aa = v.ids.at("aa"), bc = v.ids.at("bc");
  EXPECT_EQ(tok.encode({"aa", "bc", "a"}, true, 1), (std::vector<int32_t>{aa, eot, bc, eot, 'a'}));
  EXPECT_EQ(tok.encode({"aa", "bc"}, false, 1), (std::vector<int32_t>{aa, bc}));
  std::mt19937 rng(9);
  std::vector<std::string> docs;
  for (int i = 0; i < 300; ++i) docs.push_back(random_piece(rng, 1 + rng() % 200));
  const std::vector<std::string_view> views(docs.begin(), docs.end());
  const std::vector<int32_t> one = tok.encode(views, true, 1);
  for (int threads : {2, 3, 7, 1000}) EXPECT_EQ(tok.encode(views, true, threads), one) << threads << " threads";
  std::vector<int32_t> expect;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) expect.push_back(eot);
    for (int32_t id : tok.encode(docs[i])) expect.push_back(id);
  }
  EXPECT_EQ(one, expect);

  const Tokenizer bytes("byte", "");
  EXPECT_EQ(bytes.encode({"ab", "\xff"}, false, 2), (std::vector<int32_t>{'a', 'b', 0xff}));
  EXPECT_TRUE(throws_input_error([&] { bytes.encode({"a"}, true, 1); }, {"--eot", "--tokenizer gpt2"}));
  EXPECT_TRUE(throws_input_error([] { Tokenizer("gpt3", ""); }, {"--tokenizer", "byte, gpt2", "gpt3"}));
  EXPECT_TRUE(throws_input_error([] { Tokenizer("gpt2", ""); }, {"--tokenizer-dir"}));
  EXPECT_TRUE(throws_input_error([] { Tokenizer("byte", "/x"); }, {"--tokenizer-dir /x"}));
}

TEST(Bpe, WorkUnitsAcrossDocuments) {
  // Enough text for several work units (kWorkBytes each): small documents grouped into one unit, documents
  // cut into several, empty ones; the threads' units concatenate to each document encoded alone, joined by
  // <|endoftext|>.
  ToyVocab v;
  const Gpt2Vocab vocab(v.dir.path().string());
  const int32_t eot = vocab.eot();
  std::mt19937 rng(11);
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) {
    const size_t target = i % 9 == 4 ? 0 : i % 10 == 0 ? 2 * kWorkBytes + rng() % 1000 : 1 + rng() % 3000;
    std::string d;
    while (d.size() < target) d += random_piece(rng, 1 + rng() % 12) + (rng() % 4 ? " " : "\n") + "ab ";
    docs.push_back(d);
  }
  const std::vector<std::string_view> views(docs.begin(), docs.end());
  std::vector<int32_t> expect_eot, expect_plain;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) expect_eot.push_back(eot);
    BpeEncoder alone(vocab);
    std::vector<int32_t> ids;
    for_each_piece(docs[i], [&](std::string_view p) { alone.encode_piece(p, ids); });
    expect_eot.insert(expect_eot.end(), ids.begin(), ids.end());
    expect_plain.insert(expect_plain.end(), ids.begin(), ids.end());
  }
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  ASSERT_GT(bytes, 8 * kWorkBytes);  // four documents of more than 2 units, and the small ones
  for (int threads : {1, 2, 3, 8}) {
    EXPECT_EQ(encode_gpt2(vocab, views, true, threads), expect_eot) << threads << " threads";
    EXPECT_EQ(encode_gpt2(vocab, views, false, threads), expect_plain) << threads << " threads";
  }
}

TEST(Bpe, SplitDocuments) {
  using D = std::vector<std::string_view>;
  EXPECT_EQ(split_documents("a%\nb%\n%\nc", "%\n"), (D{"a", "b", "c"}));
  EXPECT_EQ(split_documents("%\nab%\n", "%\n"), (D{"ab"}));
  EXPECT_EQ(split_documents("abc", ""), (D{"abc"}));
  EXPECT_EQ(split_documents("", ""), D{});
  EXPECT_EQ(split_documents("x\n\ny", "\n\n"), (D{"x", "y"}));
}

TEST(Bpe, VocabularyFileErrorsNameFileAndLine) {
  ToyVocab v;
  const std::string dir = v.dir.path().string();
  EXPECT_TRUE(throws_input_error([] { Gpt2Vocab("/nonexistent-dir"); },
                                 {"/nonexistent-dir/encoder.json", "scripts/gpt2_tokenizer.sh"}));
  write_raw(v.dir.file("vocab.bpe"), "#version: 0.2\na a\nq zz\n");
  EXPECT_TRUE(throws_input_error([&] { Gpt2Vocab{dir}; }, {"vocab.bpe:3", "q zz", "encoder.json"}));
  write_raw(v.dir.file("vocab.bpe"), "#version: 0.2\na a\nb c\na a\n");
  EXPECT_TRUE(throws_input_error([&] { Gpt2Vocab{dir}; }, {"vocab.bpe:4", "second time"}));
  write_raw(v.dir.file("vocab.bpe"), "#version: 0.2\naa\n");
  EXPECT_TRUE(throws_input_error([&] { Gpt2Vocab{dir}; }, {"vocab.bpe:2", "two tokens"}));
  write_raw(v.dir.file("encoder.json"), "{\"a\": 0");
  EXPECT_TRUE(throws_input_error([&] { Gpt2Vocab{dir}; }, {"encoder.json", "JSON"}));
  write_raw(v.dir.file("encoder.json"), "{\"a\": 0, \"<|endoftext|>\": 1}");
  EXPECT_TRUE(throws_input_error([&] { Gpt2Vocab{dir}; }, {"encoder.json", "no token for byte 0"}));
}

}  // namespace
}  // namespace mt::data
