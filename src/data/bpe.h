// GPT-2's byte-level BPE: the vocabulary (encoder.json: token -> id; vocab.bpe: the merges in rank order),
// the merge loop, encoding through a cache of encoded pieces (bpe_cache.h), and whole-text encoding on
// several threads.
//
// Files: encoder.json maps 50257 tokens to ids; a token is written with bytes_to_unicode's printable
// stand-ins (byte b -> one code point; ' ' is 'Ġ', '\n' is 'Ċ'); vocab.bpe holds one merge "a b" per line
// after a "#version" line, rank = line index. Both are read once into byte strings and integer tables.
//
// Encoding a piece (pretokenize.h): start from one token per byte; repeatedly merge the adjacent pair with
// the lowest merge rank, the leftmost one on a tie, until no adjacent pair has a merge (GPT-2's encoder.py
// merges every occurrence of the best pair in one left-to-right sweep; merging the leftmost one at a time
// gives the same result because a merge's product only takes part in merges of higher rank). Short pieces
// (most of them) scan an array for the lowest rank; longer ones keep a binary heap of candidate pairs, which
// makes them O(n log n) in the piece's length n, so a several-MB run of letters is fine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe_cache.h"

namespace mt::data {

class Gpt2Vocab {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe; InputError naming the file and what is wrong (missing file,
  // bad JSON, a merge whose parts or product are not tokens, a byte without a token).
  explicit Gpt2Vocab(const std::string& dir);

  int size() const { return static_cast<int>(tokens_.size()); }
  int eot() const { return eot_; }  // <|endoftext|>, 50256 in GPT-2's files
  int byte_token(unsigned char b) const { return byte_token_[b]; }
  // The bytes a token stands for ("<|endoftext|>" for the end-of-text token). id must be < size().
  const std::string& bytes(int id) const { return tokens_[static_cast<size_t>(id)]; }
  // The merge of tokens (a, b): rank and product id; rank < 0 when there is none.
  struct Merge {
    int32_t rank = -1;
    int32_t id = -1;
  };
  Merge merge(int a, int b) const {
    const uint64_t k = key(a, b);
    for (size_t s = slot(k);; s = (s + 1) & mask_) {
      if (table_[s].key == k) return table_[s].merge;
      if (table_[s].key == kEmpty) return Merge{};
    }
  }

 private:
  // Merges in an open-addressing table (linear probing, at most half full): the merge loop's one hot lookup.
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  static uint64_t key(int a, int b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  void add_merge(uint64_t k, Merge m);

  std::vector<std::string> tokens_;  // id -> bytes
  std::vector<Slot> table_;
  size_t mask_ = 0, merges_ = 0;
  int shift_ = 64;
  int byte_token_[256] = {};
  int eot_ = -1;
};

// Encodes text with one vocabulary and a cache of encoded pieces (bpe_cache.h), its own or one shared with
// the encoders of other threads. One encoder per thread.
class BpeEncoder {
 public:
  explicit BpeEncoder(const Gpt2Vocab& vocab);  // with a cache of its own (2^16 slots)
  BpeEncoder(const Gpt2Vocab& vocab, PieceCache& shared);

  // Appends the ids of text (pre-tokenized, then each piece merged) to out.
  void encode(std::string_view text, std::vector<int32_t>& out);
  // Appends the ids of one piece, without the cache (the merge loop itself).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);
  // Pieces up to this many bytes are merged by a scan over an array (encode_short), longer ones with a heap.
  static constexpr int32_t kShortPiece = 32;

 private:
  void encode_short(std::string_view piece, std::vector<int32_t>& out) const;
  const Gpt2Vocab& vocab_;
  std::unique_ptr<PieceCache> own_;  // null when shared
  PieceCache& cache_;
  PieceCache::Writer writer_;
  // encode_piece's linked list over byte positions and its heap of candidate merges, kept between calls.
  struct Cand {
    int32_t rank, pos, a, b;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> id_, next_, prev_;
  std::vector<Cand> heap_;
};

// The ids of docs, in order, with <|endoftext|> between consecutive documents when `eot`. `threads` threads
// share the work: the documents are cut at split_points (pretokenize.h) into parts of about kWorkBytes and
// grouped into work units of at least that size, which the threads take in turn; all threads share one
// PieceCache. The ids do not depend on the thread count.
std::vector<int32_t> encode_gpt2(const Gpt2Vocab& vocab, const std::vector<std::string_view>& docs, bool eot,
                                 int threads);
// The ids of one text: encode_gpt2(vocab, {text}, false, threads).
std::vector<int32_t> encode_gpt2(const Gpt2Vocab& vocab, std::string_view text, int threads);
inline constexpr size_t kWorkBytes = 32 << 10;

// The bytes of ids, concatenated; InputError naming the position of an id outside the vocabulary.
std::string decode_gpt2(const Gpt2Vocab& vocab, const std::vector<int32_t>& ids);

}  // namespace mt::data
