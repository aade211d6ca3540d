// meshtrain decode: a token shard back to text (the inverse of `meshtrain prepare`), to read what a shard holds.
#include <cstdio>
#include <string>

#include "apps/meshtrain/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace mt::cli {

void add_decode_command(CLI::App& app) {
  struct Args {
    std::string tokens, out, tokenizer = "byte", tokenizer_dir;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("decode", "turn a token shard back into text");
  sub->add_option("--tokens", a->tokens, "token shard (.bin) written by meshtrain prepare")->required();
  sub->add_option("--out", a->out, "output text file")->required();
  sub->add_option("--tokenizer", a->tokenizer, "byte or gpt2, as given to prepare")->capture_default_str();
  sub->add_option("--tokenizer-dir", a->tokenizer_dir, "directory with encoder.json and vocab.bpe (--tokenizer gpt2)");
  sub->callback([a] {
    MT_CHECK_INPUT(!same_file(a->tokens, a->out), "--out ", a->out, " is the same file as --tokens ", a->tokens,
                   ": writing it would destroy the input; choose another path");
    check_output_path("--out", a->out);
    const data::Tokenizer tok(a->tokenizer, a->tokenizer_dir);
    TokenShard shard(a->tokens);
    shard.check_vocab(tok.vocab_size());
    std::string text;
    for (int64_t i = 0; i < shard.size(); ++i) text += tok.decode(shard[i]);
    write_file_atomic(a->out, text);
    std::fprintf(stderr, "wrote %s: %zu bytes from %lld tokens (%s)\n", a->out.c_str(), text.size(),
                 static_cast<long long>(shard.size()), tok.name().c_str());
  });
}

}  // namespace mt::cli
