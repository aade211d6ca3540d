// Byte and GPT-2 tokenizers behind one interface, and documents; see tokenizer.h.
#include "data/tokenizer.h"

#include "core/error.h"

namespace mt::data {

Tokenizer::Tokenizer(const std::string& name, const std::string& dir) : name_(name) {
  if (name == "byte") {
    MT_CHECK_INPUT(dir.empty(), "--tokenizer-dir ", dir, " is given but --tokenizer is byte, which reads no files; ",
                   "add --tokenizer gpt2 or drop --tokenizer-dir");
  } else if (name == "gpt2") {
    MT_CHECK_INPUT(!dir.empty(), "--tokenizer gpt2 needs --tokenizer-dir DIR, a directory holding GPT-2's ",
                   "encoder.json and vocab.bpe (see docs/tokenizer.md)");
    gpt2_ = std::make_unique<Gpt2Vocab>(dir);
  } else {
    MT_CHECK_INPUT(false, "--tokenizer must be one of byte, gpt2; got '", name, "'");
  }
}

std::vector<int32_t> Tokenizer::encode(const std::vector<std::string_view>& docs, bool eot, int threads) const {
  MT_CHECK_INPUT(!eot || has_eot(), "--eot needs a tokenizer with an end-of-text token (--tokenizer gpt2); ", name_,
                 " has none");
  std::vector<int32_t> out;
  if (!gpt2_) {
    for (std::string_view d : docs)
      for (unsigned char c : d) out.push_back(c);
    return out;
  }
  return encode_gpt2(*gpt2_, docs, eot, threads);
}

std::string Tokenizer::decode(int32_t id) const {
  MT_CHECK_INPUT(id >= 0 && id < vocab_size(), "token ", id, " is outside the ", name_, " tokenizer's vocabulary of ",
                 vocab_size());
  return gpt2_ ? gpt2_->bytes(id) : std::string(1, static_cast<char>(id));
}

std::vector<std::string_view> split_documents(std::string_view text, std::string_view sep) {
  std::vector<std::string_view> docs;
  if (sep.empty()) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find(sep, pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) docs.push_back(text.substr(pos, end - pos));
    pos = end + sep.size();
  }
  return docs;
}

}  // namespace mt::data
