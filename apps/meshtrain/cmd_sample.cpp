// meshtrain prepare (text -> token shard, bytes or GPT-2's BPE) and meshtrain sample (generate text from weights).
#include <sys/stat.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/sample.h"
#include "tensor/blas.h"

namespace mt::cli {

void add_prepare_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> text;
    std::string out, tokenizer = "byte", tokenizer_dir, doc_sep;
    bool eot = false;
    int threads = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("prepare", "turn text files into a token shard (bytes, or GPT-2's BPE)");
  sub->add_option("--text", a->text, "input text files; each is one document unless --doc-sep cuts it")->required();
  sub->add_option("--out", a->out, "output token shard (.bin)")->required();
  sub->add_option("--tokenizer", a->tokenizer, "byte (vocabulary 256) or gpt2 (GPT-2's BPE, vocabulary 50257)")
      ->capture_default_str();
  sub->add_option("--tokenizer-dir", a->tokenizer_dir, "directory with encoder.json and vocab.bpe (--tokenizer gpt2)");
  sub->add_option("--doc-sep", a->doc_sep, "string that separates documents inside a file (dropped; \\n = newline)");
  sub->add_flag("--eot", a->eot, "put <|endoftext|> between documents (--tokenizer gpt2)");
  sub->add_option("--threads", a->threads, "encoding threads (the tokens do not depend on it)")
      ->capture_default_str()
      ->check(kPositiveInt);
  sub->callback([a] {
    for (const std::string& t : a->text)
      MT_CHECK_INPUT(!same_file(t, a->out), "--out ", a->out, " is the same file as --text ", t,
                     ": writing it would destroy the input; choose another path");
    check_output_path("--out", a->out);
    // The shard's count field is int32 and the byte tokenizer makes one token per byte: refuse a larger text
    // from its size, before reading it (other tokenizers are checked on their token count below).
    if (a->tokenizer == "byte") {
      long long total = 0;
      std::string names;
      for (const std::string& t : a->text) {
        struct stat st {};
        if (::stat(t.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += (long long)st.st_size;
        names += (names.empty() ? "" : ", ") + t;
      }
      MT_CHECK_INPUT(total <= INT32_MAX, "--text ", names, " has ", total,
                     " bytes; a token shard holds at most 2^31 - 1 tokens (one per byte): split the text");
    }
    data::Tokenizer tok(a->tokenizer, a->tokenizer_dir);
    std::string sep;  // "\\n" in the flag is a newline, "\\\\" a backslash
    for (size_t i = 0; i < a->doc_sep.size(); ++i)
      if (a->doc_sep[i] == '\\' && i + 1 < a->doc_sep.size() && (a->doc_sep[i + 1] == 'n' || a->doc_sep[i + 1] == '\\'))
        sep += a->doc_sep[++i] == 'n' ? '\n' : '\\';
      else
        sep += a->doc_sep[i];
    std::vector<std::string> files;
    std::vector<std::string_view> docs;
    for (const std::string& t : a->text) files.push_back(read_file(t));
    for (const std::string& f : files)
      for (std::string_view d : data::split_documents(f, sep)) docs.push_back(d);
    std::vector<int32_t> ids = tok.encode(docs, a->eot, a->threads);
    MT_CHECK_INPUT(ids.size() <= (size_t)INT32_MAX, "--text gives ", ids.size(),
                   " tokens; a token shard holds at most 2^31 - 1: split the text");
    MT_CHECK_INPUT(ids.size() >= 2, "--text gives ", ids.size(), " tokens; a token shard needs at least 2 tokens");
    std::vector<uint16_t> tokens(ids.begin(), ids.end());  // ids < vocab_size <= 65536
    write_token_shard(a->out, tokens);
    std::fprintf(stderr, "wrote %s: %zu tokens (%s) from %zu documents\n", a->out.c_str(), tokens.size(),
                 tok.name().c_str(), docs.size());
  });
}

void add_sample_command(CLI::App& app) {
  struct Args {
    std::string init, prompt = "\n";
    model::GptConfig shape{0, 0, 0, 0, 0, 0, 0, 0, 0};  // all 0: from the file (moe_top_k too)
    model::SampleOptions opt;
    int threads = 1;
    std::string tokenizer = "byte", tokenizer_dir;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("sample", "generate text from GPT weights");
  sub->add_option("--tokenizer", a->tokenizer, "byte or gpt2 (encodes the prompt, decodes the output)")
      ->capture_default_str();
  sub->add_option("--tokenizer-dir", a->tokenizer_dir, "directory with encoder.json and vocab.bpe (--tokenizer gpt2)");
  sub->add_option("--init", a->init, "safetensors weights")->required();
  sub->add_option("--prompt", a->prompt, "prompt text")->capture_default_str();
  sub->add_option("--max-new-tokens", a->opt.max_new_tokens, "tokens to generate")->capture_default_str()->check(kNonNegativeInt);
  sub->add_option("--temperature", a->opt.temperature, "0 = greedy")->capture_default_str()->check(finite_non_negative("temperature"));
  sub->add_option("--top-k", a->opt.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str()->check(kNonNegativeInt);
  sub->add_option("--seed", a->opt.seed, "sampling seed")->capture_default_str();
  sub->add_option("--n-layer", a->shape.n_layer, "override/verify the file's n_layer")->check(kPositiveInt);
  sub->add_option("--n-head", a->shape.n_head, "n_head, when the file's metadata lacks it")->check(kPositiveInt);
  sub->add_option("--n-embd", a->shape.n_embd, "override/verify the file's n_embd")->check(kPositiveInt);
  sub->add_option("--vocab-size", a->shape.vocab_size, "override/verify the file's vocab_size")->check(kPositiveInt);
  sub->add_option("--n-positions", a->shape.n_positions, "override/verify the file's n_positions")->check(kPositiveInt);
  sub->add_option("--threads", a->threads, "threads")->capture_default_str()->check(kThreads);
  sub->callback([a] {
    set_num_threads(a->threads);
    const data::Tokenizer tok(a->tokenizer, a->tokenizer_dir);
    SafetensorsReader file(a->init);
    model::GptConfig cfg = checkpoint::gpt_config_from_file(file, a->shape);
    nn::ParamRegistry params;
    // MoE blocks route dropless when sampling: a token's output then does not depend on which other
    // positions of the context compete for an expert's capacity.
    model::MoeOptions moe;
    moe.capacity_factor = 0;
    model::Gpt gpt(cfg, params, nullptr, {}, moe);
    checkpoint::check_tensors(file, params);  // before allocating what the metadata claims
    params.finalize(true, false);             // no gradients: sampling does not train
    checkpoint::load_params(file, params);
    for (const nn::Param& p : params.params())
      for (size_t i = 0; i < p.numel; i++)
        MT_CHECK_INPUT(std::isfinite(p.data[i]), a->init, ": tensor ", p.name, " holds a non-finite value (",
                       p.data[i], ") at element ", i, "; the weights are unusable (a diverged run?)");
    std::vector<int32_t> prompt = tok.encode(a->prompt);
    for (int32_t t : prompt)
      MT_CHECK_INPUT(t < cfg.vocab_size, "prompt token ", t, " (", a->tokenizer,
                     ") is outside the model's vocabulary of ", cfg.vocab_size);
    // Streamed: the prompt, then each token as it is drawn, flushed at once (a pipe is block-buffered otherwise;
    // a few thousand tokens per second make the write per token cheap beside the forward pass).
    std::fwrite(a->prompt.data(), 1, a->prompt.size(), stdout);
    std::fflush(stdout);
    model::generate(gpt, prompt, a->opt, [&tok](int32_t t) {
      const std::string s = t < tok.vocab_size() ? tok.decode(t) : "<|" + std::to_string(t) + "|>";
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
  });
}

}  // namespace mt::cli
