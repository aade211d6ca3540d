// GPT-2's byte-level BPE: vocabulary loading, the merge loop, cached and multi-threaded encoding; see bpe.h.
#include "data/bpe.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <atomic>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/fs.h"
#include "data/pretokenize.h"

namespace mt::data {

namespace {

// GPT-2's bytes_to_unicode: bytes that print ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other
// 68, in increasing order, for U+0100, U+0101, ... Returns code point -> byte (-1 for none), over U+0000..U+01FF.
std::vector<int> unicode_to_byte() {
  std::vector<int> inv(512, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool prints = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[static_cast<size_t>(prints ? b : 256 + n++)] = b;
  }
  return inv;
}

// A token as written in the files -> its bytes; false if a character is not one of the 256 stand-ins.
bool token_bytes(const std::string& written, const std::vector<int>& inv, std::string& out) {
  out.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(written.data());
  for (size_t i = 0; i < written.size();) {
    uint32_t cp = 0;
    if (s[i] < 0x80) {
      cp = s[i++];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < written.size()) {
      cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out.push_back(static_cast<char>(inv[cp]));
  }
  return true;
}

}  // namespace

Gpt2Vocab::Gpt2Vocab(const std::string& dir) {
  const std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  const std::string hint =
      " (GPT-2's tokenizer files: `bash scripts/gpt2_tokenizer.sh` fetches them, see docs/tokenizer.md)";
  std::string text;
  try {
    text = read_file(enc_path);
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + hint);
  }
  nlohmann::json enc = nlohmann::json::parse(text, nullptr, false);
  MT_CHECK_INPUT(enc.is_object() && !enc.empty(), enc_path, ": not a JSON object of token -> id", hint);
  const std::vector<int> inv = unicode_to_byte();
  std::unordered_map<std::string, int> id_of;
  tokens_.resize(enc.size());
  std::vector<bool> seen(enc.size(), false);
  std::string bytes;
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    MT_CHECK_INPUT(it.value().is_number_integer(), enc_path, ": token \"", it.key(), "\" has a non-integer id");
    const int64_t id = it.value().get<int64_t>();
    MT_CHECK_INPUT(id >= 0 && id < static_cast<int64_t>(enc.size()) && !seen[static_cast<size_t>(id)], enc_path,
                   ": token \"", it.key(), "\" has id ", id, "; ids must be 0..", enc.size() - 1, ", each once");
    seen[static_cast<size_t>(id)] = true;
    if (it.key() == "<|endoftext|>") {
      eot_ = static_cast<int>(id);
      bytes = it.key();
    } else {
      MT_CHECK_INPUT(token_bytes(it.key(), inv, bytes), enc_path, ": token \"", it.key(), "\" (id ", id,
                     ") uses a character outside GPT-2's 256 byte stand-ins");
      id_of.emplace(bytes, static_cast<int>(id));
    }
    tokens_[static_cast<size_t>(id)] = bytes;
  }
  MT_CHECK_INPUT(eot_ >= 0, enc_path, ": no <|endoftext|> token", hint);
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, static_cast<char>(b)));
    MT_CHECK_INPUT(it != id_of.end(), enc_path, ": no token for byte ", b, hint);
    byte_token_[b] = it->second;
  }

  std::string merges;
  try {
    merges = read_file(bpe_path);
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + hint);
  }
  size_t lines = 1;
  for (char c : merges) lines += c == '\n';
  shift_ = 64;
  while ((size_t{1} << (64 - shift_)) < 2 * lines) --shift_;
  table_.assign(size_t{1} << (64 - shift_), Slot{});
  mask_ = table_.size() - 1;
  size_t pos = 0, line = 0;
  std::string a, b;
  while (pos < merges.size()) {
    size_t end = merges.find('\n', pos);
    if (end == std::string::npos) end = merges.size();
    const std::string_view l(merges.data() + pos, end - pos);
    pos = end + 1;
    ++line;
    if (l.empty() || (line == 1 && l.starts_with("#version"))) continue;
    const size_t sp = l.find(' ');
    MT_CHECK_INPUT(sp != std::string_view::npos && sp > 0 && sp + 1 < l.size() && l.find(' ', sp + 1) == l.npos,
                   bpe_path, ":", line, ": expected two tokens separated by one space, got \"", l, "\"");
    const bool ok =
        token_bytes(std::string(l.substr(0, sp)), inv, a) && token_bytes(std::string(l.substr(sp + 1)), inv, b);
    auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
    MT_CHECK_INPUT(ok && ia != id_of.end() && ib != id_of.end() && im != id_of.end(), bpe_path, ":", line, ": merge \"",
                   l, "\": its parts and their concatenation must all be tokens of ", enc_path);
    MT_CHECK_INPUT(merge(ia->second, ib->second).rank < 0, bpe_path, ":", line, ": merge \"", l,
                   "\" is listed a second time");
    add_merge(key(ia->second, ib->second), Merge{static_cast<int32_t>(merges_), im->second});
  }
  MT_CHECK_INPUT(merges_ > 0, bpe_path, ": no merges", hint);
}

void Gpt2Vocab::add_merge(uint64_t k, Merge m) {
  size_t s = slot(k);
  while (table_[s].key != kEmpty) s = (s + 1) & mask_;
  table_[s] = Slot{k, m};
  ++merges_;
}

BpeEncoder::BpeEncoder(const Gpt2Vocab& vocab)
    : vocab_(vocab), own_(std::make_unique<PieceCache>(size_t{1} << 16)), cache_(*own_), writer_(cache_) {}

BpeEncoder::BpeEncoder(const Gpt2Vocab& vocab, PieceCache& shared)
    : vocab_(vocab), cache_(shared), writer_(cache_) {}

void BpeEncoder::encode_short(std::string_view piece, std::vector<int32_t>& out) const {
  // The tokens in an array, with the merge of each adjacent pair beside it (rank[k], product[k] for tokens k
  // and k + 1; rank INT32_MAX when there is none). Each step scans for the lowest rank (the first on a tie),
  // merges, closes the gap, and looks up the two pairs the new token is in. Same lookups as the heap below,
  // without its bookkeeping: for short pieces the scan is cheaper.
  constexpr int32_t kNone = INT32_MAX;
  int32_t id[kShortPiece], rank[kShortPiece], product[kShortPiece];
  int32_t m = static_cast<int32_t>(piece.size());
  auto look = [&](int32_t k) {
    const Gpt2Vocab::Merge g = vocab_.merge(id[k], id[k + 1]);
    rank[k] = g.rank < 0 ? kNone : g.rank;
    product[k] = g.id;
  };
  for (int32_t k = 0; k < m; ++k) id[k] = vocab_.byte_token(static_cast<unsigned char>(piece[static_cast<size_t>(k)]));
  for (int32_t k = 0; k + 1 < m; ++k) look(k);
  while (m > 1) {
    int32_t best = 0;
    for (int32_t k = 1; k + 1 < m; ++k)
      if (rank[k] < rank[best]) best = k;
    if (rank[best] == kNone) break;
    id[best] = product[best];
    for (int32_t k = best + 1; k + 1 < m; ++k) id[k] = id[k + 1];
    for (int32_t k = best + 1; k + 2 < m; ++k) {
      rank[k] = rank[k + 1];
      product[k] = product[k + 1];
    }
    --m;
    if (best + 1 < m) look(best);
    if (best > 0) look(best - 1);
  }
  out.insert(out.end(), id, id + m);
}

void BpeEncoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  const int32_t n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out.push_back(vocab_.byte_token(static_cast<unsigned char>(piece[0])));
    return;
  }
  if (n <= kShortPiece) {
    encode_short(piece, out);
    return;
  }
  // Tokens as a linked list over byte positions (a token lives at the position of its first byte); id -1
  // marks a position merged into the token on its left. Candidates are pushed for every adjacent pair that
  // has a merge and checked when popped (a stale one no longer matches the ids at its position).
  id_.resize(static_cast<size_t>(n));
  next_.resize(static_cast<size_t>(n));
  prev_.resize(static_cast<size_t>(n));
  heap_.clear();
  int32_t* id = id_.data();
  int32_t* next = next_.data();
  int32_t* prev = prev_.data();
  auto push = [&](int32_t i) {
    const int32_t j = next[i];
    if (j < 0) return;
    const Gpt2Vocab::Merge m = vocab_.merge(id[i], id[j]);
    if (m.rank < 0) return;
    heap_.push_back({m.rank, i, id[i], id[j]});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<Cand>());
  };
  for (int32_t i = 0; i < n; ++i) {
    id[i] = vocab_.byte_token(static_cast<unsigned char>(piece[static_cast<size_t>(i)]));
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<Cand>());
    const Cand c = heap_.back();
    heap_.pop_back();
    const int32_t i = c.pos, j = next[i];
    if (id[i] != c.a || j < 0 || id[j] != c.b) continue;
    id[i] = vocab_.merge(c.a, c.b).id;
    id[j] = -1;
    next[i] = next[j];
    if (next[i] >= 0) prev[next[i]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void BpeEncoder::encode(std::string_view text, std::vector<int32_t>& out) {
  for_each_piece(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(vocab_.byte_token(static_cast<unsigned char>(piece[0])));
      return;
    }
    if (piece.size() > PieceCache::kMaxBytes) {
      encode_piece(piece, out);
      return;
    }
    const uint64_t h = PieceCache::hash(piece);
    const std::span<const int32_t> hit = cache_.find(piece, h);
    if (!hit.empty()) {
      out.insert(out.end(), hit.begin(), hit.end());
      return;
    }
    const size_t before = out.size();
    encode_piece(piece, out);
    writer_.insert(piece, h, std::span<const int32_t>(out).subspan(before));
  });
}

namespace {

// A stretch of one document, and whether <|endoftext|> goes before it.
struct Segment {
  std::string_view text;
  bool eot_before;
};

}  // namespace

std::vector<int32_t> encode_gpt2(const Gpt2Vocab& vocab, const std::vector<std::string_view>& docs, bool eot,
                                 int threads) {
  size_t total = 0;
  for (std::string_view d : docs) total += d.size();
  PieceCache cache(PieceCache::slots_for_text(total));
  std::vector<int32_t> all;
  if (threads <= 1 || total <= kWorkBytes) {
    BpeEncoder enc(vocab, cache);
    all.reserve(total / 3);
    for (size_t i = 0; i < docs.size(); ++i) {
      if (eot && i > 0) all.push_back(vocab.eot());
      enc.encode(docs[i], all);
    }
    return all;
  }
  // Segments: documents cut into parts of about kWorkBytes (an empty document is one empty segment); units:
  // runs of consecutive segments of at least kWorkBytes (the last may be shorter), first[u] .. first[u + 1].
  std::vector<Segment> segs;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::vector<size_t> cuts = split_points(docs[i], std::max<size_t>(1, docs[i].size() / kWorkBytes));
    for (size_t p = 0; p + 1 < cuts.size(); ++p)
      segs.push_back({docs[i].substr(cuts[p], cuts[p + 1] - cuts[p]), eot && i > 0 && p == 0});
  }
  std::vector<size_t> first{0};
  size_t bytes = 0;
  for (size_t k = 0; k < segs.size(); ++k) {
    bytes += segs[k].text.size();
    if (bytes >= kWorkBytes && k + 1 < segs.size()) {
      first.push_back(k + 1);
      bytes = 0;
    }
  }
  first.push_back(segs.size());
  const size_t units = first.size() - 1;
  std::vector<std::vector<int32_t>> ids(units);
  std::atomic<size_t> next{0};
  auto work = [&] {
    BpeEncoder enc(vocab, cache);
    for (size_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      size_t unit_bytes = 0;
      for (size_t k = first[u]; k < first[u + 1]; ++k) unit_bytes += segs[k].text.size();
      ids[u].reserve(unit_bytes / 3 + 16);
      for (size_t k = first[u]; k < first[u + 1]; ++k) {
        if (segs[k].eot_before) ids[u].push_back(vocab.eot());
        enc.encode(segs[k].text, ids[u]);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < units; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  size_t n = 0;
  for (const auto& v : ids) n += v.size();
  all.reserve(n);
  for (const auto& v : ids) all.insert(all.end(), v.begin(), v.end());
  return all;
}

std::vector<int32_t> encode_gpt2(const Gpt2Vocab& vocab, std::string_view text, int threads) {
  return encode_gpt2(vocab, std::vector<std::string_view>{text}, false, threads);
}

std::string decode_gpt2(const Gpt2Vocab& vocab, const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK_INPUT(ids[i] >= 0 && ids[i] < vocab.size(), "token ", ids[i], " at position ", i,
                   " is outside GPT-2's vocabulary of ", vocab.size());
    s += vocab.bytes(ids[i]);
  }
  return s;
}

}  // namespace mt::data
