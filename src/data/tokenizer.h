// The text <-> token mapping of a run: "byte" (each byte is a token, vocabulary 256, no end-of-text token)
// or "gpt2" (GPT-2's byte-level BPE from encoder.json + vocab.bpe in a directory, vocabulary 50257, with
// <|endoftext|>). `meshtrain prepare` encodes with it, `meshtrain sample` encodes the prompt and decodes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"

namespace mt::data {

class Tokenizer {
 public:
  // name "byte" or "gpt2"; dir holds encoder.json and vocab.bpe for gpt2 and must be empty for byte.
  // InputError naming the flag (--tokenizer, --tokenizer-dir) for a bad name or a missing/extra directory.
  Tokenizer(const std::string& name, const std::string& dir);

  const std::string& name() const { return name_; }
  int vocab_size() const { return gpt2_ ? gpt2_->size() : 256; }
  bool has_eot() const { return gpt2_ != nullptr; }

  // The ids of documents, in order, with <|endoftext|> between consecutive documents when `eot` (which needs
  // has_eot()). Documents are encoded independently; `threads` threads share the work (encode_gpt2 in bpe.h),
  // and the ids do not depend on it.
  std::vector<int32_t> encode(const std::vector<std::string_view>& docs, bool eot, int threads) const;
  std::vector<int32_t> encode(std::string_view text) const { return encode({text}, false, 1); }
  // The bytes of one token; InputError for an id outside the vocabulary.
  std::string decode(int32_t id) const;

 private:
  std::string name_;
  std::unique_ptr<Gpt2Vocab> gpt2_;  // null for "byte"
};

// Cuts text at every occurrence of sep (not kept) into documents; empty documents are dropped. sep "" gives
// the whole text as one document (none if it is empty).
std::vector<std::string_view> split_documents(std::string_view text, std::string_view sep);

}  // namespace mt::data
