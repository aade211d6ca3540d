// meshtrain prepare (text -> byte-level token shard) and meshtrain sample (generate text from weights).
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
#include "model/gpt.h"
#include "model/sample.h"
#include "tensor/blas.h"

namespace mt::cli {

void add_prepare_command(CLI::App& app) {
  auto text = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("prepare", "turn a text file into a token shard (byte-level, vocabulary 256)");
  sub->add_option("--text", *text, "input text file")->required();
  sub->add_option("--out", *out, "output token shard (.bin)")->required();
  sub->callback([text, out] {
    MT_CHECK_INPUT(!same_file(*text, *out), "--out ", *out, " is the same file as --text ", *text,
                   ": writing it would destroy the input; choose another path");
    check_output_path("--out", *out);
    // The shard's count field is int32: refuse a larger text from its size, before reading it.
    struct stat st {};
    MT_CHECK_INPUT(::stat(text->c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= INT32_MAX, "--text ", *text,
                   " has ", (long long)st.st_size,
                   " bytes; a token shard holds at most 2^31 - 1 tokens (one per byte): split the text");
    std::string s = read_file(*text);
    MT_CHECK_INPUT(s.size() >= 2, *text, " has ", s.size(), " bytes; a token shard needs at least 2 tokens");
    std::vector<uint16_t> tokens(s.begin(), s.end());
    for (size_t i = 0; i < s.size(); i++) tokens[i] = (uint8_t)s[i];
    write_token_shard(*out, tokens);
    std::fprintf(stderr, "wrote %s: %zu tokens (bytes of %s)\n", out->c_str(), tokens.size(), text->c_str());
  });
}

void add_sample_command(CLI::App& app) {
  struct Args {
    std::string init, prompt = "\n";
    model::GptConfig shape{0, 0, 0, 0, 0, 0, 0, 0, 0};  // all 0: from the file (moe_top_k too)
    model::SampleOptions opt;
    int threads = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("sample", "generate text from GPT weights (byte-level tokens)");
  sub->add_option("--init", a->init, "safetensors weights")->required();
  sub->add_option("--prompt", a->prompt, "prompt text; each byte is one token")->capture_default_str();
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
    std::vector<int32_t> prompt;
    for (unsigned char ch : a->prompt) {
      MT_CHECK_INPUT(ch < cfg.vocab_size, "prompt byte ", (int)ch, " is outside the model's vocabulary of ",
                     cfg.vocab_size);
      prompt.push_back(ch);
    }
    // Streamed: the prompt, then each token as it is drawn, flushed at once (a pipe is block-buffered otherwise;
    // a few thousand tokens per second make the write per token cheap beside the forward pass).
    std::fwrite(a->prompt.data(), 1, a->prompt.size(), stdout);
    std::fflush(stdout);
    model::generate(gpt, prompt, a->opt, [](int32_t t) {
      const std::string s = t < 256 ? std::string(1, (char)t) : "<|" + std::to_string(t) + "|>";
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
  });
}

}  // namespace mt::cli
