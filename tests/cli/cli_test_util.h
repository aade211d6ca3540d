// Helpers for the end-to-end CLI tests: run the real `meshtrain` binary as a subprocess with a timeout,
// scratch directories, and small inputs (token shards, IDX files, safetensors inits) made on the spot.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "data/idx.h"
#include "data/token_shard.h"

namespace mt::clitest {

namespace fs = std::filesystem;

inline std::string meshtrain_bin() { return MESHTRAIN_BIN; }

// ---------------------------------------------------------------------------------------------------------
// Running commands

struct RunResult {
  int exit_code = -1;   // exit status, or -1 when killed by a signal
  int term_signal = 0;  // signal that ended the process, 0 if it exited
  bool timed_out = false;
  std::string out, err;

  // For assertion messages.
  std::string describe() const {
    std::ostringstream os;
    os << "exit_code=" << exit_code << " signal=" << term_signal << (timed_out ? " TIMED OUT" : "")
       << "\n--- stdout ---\n"
       << out << "\n--- stderr ---\n"
       << err;
    return os.str();
  }
};

// Runs argv (argv[0] is a path, no PATH search) with stdin = /dev/null, captures stdout and stderr, and kills
// the process with SIGKILL after timeout_s seconds.
inline RunResult run_command(const std::vector<std::string>& argv, double timeout_s = 30.0) {
  RunResult r;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    r.err = std::string("pipe failed: ") + std::strerror(errno);
    return r;
  }
  pid_t pid = fork();
  if (pid < 0) {
    r.err = std::string("fork failed: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    const char msg[] = "execv failed\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* bufs[2] = {&r.out, &r.err};
  int open_fds = 2;
  char chunk[65536];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    int n = poll(fds, 2, (int)std::min<int64_t>(left.count(), 1000));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t k = read(fds[i].fd, chunk, sizeof chunk);
      if (k > 0) {
        bufs[i]->append(chunk, (size_t)k);
      } else if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.term_signal = WTERMSIG(status);
  }
  return r;
}

// `meshtrain <args...>`.
inline RunResult run_meshtrain(const std::vector<std::string>& args, double timeout_s = 30.0) {
  std::vector<std::string> argv{meshtrain_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, timeout_s);
}

// A child running in the background with stdout/stderr sent to files (for the kill test).
class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path) {
    pid_ = fork();
    if (pid_ == 0) {
      int devnull = open("/dev/null", O_RDONLY);
      if (devnull >= 0) dup2(devnull, 0);
      int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (o >= 0) dup2(o, 1);
      if (e >= 0) dup2(e, 2);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~BackgroundProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      wait();
    }
  }
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }
  // True once the child has exited (reaps it).
  bool exited() {
    if (reaped_) return true;
    int st = 0;
    pid_t w = waitpid(pid_, &st, WNOHANG);
    if (w == pid_) {
      reaped_ = true;
      status_ = st;
    }
    return reaped_;
  }
  void kill_now() {
    if (pid_ > 0 && !reaped_) kill(pid_, SIGKILL);
  }
  int wait() {
    if (!reaped_) {
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      reaped_ = true;
      status_ = st;
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// Files and directories

// A fresh directory under /tmp, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/meshtrain_cli_XXXXXX";
    char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) lines.push_back(line);
  return lines;
}

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------------------
// Inputs

// n uniform random token ids in [0, vocab), deterministic in seed.
inline std::vector<uint16_t> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<uint16_t> t(n);
  for (auto& x : t) x = (uint16_t)d(gen);
  return t;
}

inline void make_random_shard(const std::string& path, size_t n, int vocab, uint32_t seed = 1) {
  mt::write_token_shard(path, random_tokens(n, vocab, seed));
}

// A raw llm.c shard header (256 int32) followed by `payload_tokens` tokens; lets a test lie in the header.
inline void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                            size_t payload_tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes((const char*)header.data(), header.size() * 4);
  std::vector<uint16_t> toks = random_tokens(payload_tokens, 64, 7);
  bytes.append((const char*)toks.data(), toks.size() * 2);
  write_bytes(path, bytes);
}

// The GPT-2 (Hugging Face) tensor names and shapes of a model.
struct GptShape {
  int n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 64, n_positions = 32;
};

inline std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_tensor_shapes(const GptShape& s) {
  const int64_t C = s.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  t.push_back({"wte.weight", {s.vocab_size, C}});
  t.push_back({"wpe.weight", {s.n_positions, C}});
  for (int l = 0; l < s.n_layer; l++) {
    std::string h = "h." + std::to_string(l) + ".";
    t.push_back({h + "ln_1.weight", {C}});
    t.push_back({h + "ln_1.bias", {C}});
    t.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    t.push_back({h + "attn.c_attn.bias", {3 * C}});
    t.push_back({h + "attn.c_proj.weight", {C, C}});
    t.push_back({h + "attn.c_proj.bias", {C}});
    t.push_back({h + "ln_2.weight", {C}});
    t.push_back({h + "ln_2.bias", {C}});
    t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    t.push_back({h + "mlp.c_fc.bias", {4 * C}});
    t.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    t.push_back({h + "mlp.c_proj.bias", {C}});
  }
  t.push_back({"ln_f.weight", {C}});
  t.push_back({"ln_f.bias", {C}});
  return t;
}

struct InitOptions {
  bool with_n_head_metadata = true;
  bool with_other_metadata = true;
  std::string omit;     // leave this tensor out
  std::string reshape;  // give this tensor `new_shape` instead
  std::vector<int64_t> new_shape;
};

// Writes a GPT init file with small random weights (LayerNorm weights 1) in Hugging Face names.
inline void write_gpt_init(const std::string& path, const GptShape& s, const InitOptions& o = {}) {
  mt::SafetensorsWriter w;
  if (o.with_other_metadata) {
    w.set_metadata("n_layer", std::to_string(s.n_layer));
    w.set_metadata("n_embd", std::to_string(s.n_embd));
    w.set_metadata("vocab_size", std::to_string(s.vocab_size));
    w.set_metadata("n_positions", std::to_string(s.n_positions));
  }
  if (o.with_n_head_metadata) w.set_metadata("n_head", std::to_string(s.n_head));
  std::vector<std::vector<float>> store;  // must outlive write()
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto shapes = gpt_tensor_shapes(s);
  store.reserve(shapes.size());
  for (auto& [name, shape0] : shapes) {
    if (name == o.omit) continue;
    std::vector<int64_t> shape = name == o.reshape ? o.new_shape : shape0;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v((size_t)n);
    bool is_ln_weight = name.find("ln_") != std::string::npos && name.ends_with(".weight");
    for (auto& x : v) x = is_ln_weight ? 1.0f : nd(gen);
    store.push_back(std::move(v));
    w.add_f32(name, shape, store.back().data());
  }
  w.write(path);
}

// A hand-made safetensors file: header JSON text as given, then `data_bytes` zero bytes.
inline void write_raw_safetensors(const std::string& path, const std::string& header_json, size_t data_bytes) {
  uint64_t n = header_json.size();
  std::string bytes((const char*)&n, 8);
  bytes += header_json;
  bytes.append(data_bytes, '\0');
  write_bytes(path, bytes);
}

// Flags of the tiny GPT used throughout (shape only).
inline std::vector<std::string> tiny_gpt_flags() {
  return {"--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--vocab-size", "64", "--n-positions", "32"};
}

inline std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `meshtrain simulate args...`
inline RunResult run_simulate(const std::vector<std::string>& args, double timeout_s = 30.0) {
  return run_meshtrain(concat({"simulate"}, args), timeout_s);
}

// The raw text of the number after "key": in a JSON line (as printed by meshtrain), or "" when absent.
inline std::string raw_json_number(const std::string& line, const std::string& key) {
  std::string pat = "\"" + key + "\":";
  size_t p = line.find(pat);
  if (p == std::string::npos) return "";
  p += pat.size();
  size_t e = line.find_first_of(",}", p);
  return line.substr(p, e - p);
}

// Reads all tensors of a safetensors file as float32, by name.
inline std::map<std::string, std::vector<float>> read_all_f32(const std::string& path) {
  mt::SafetensorsReader r(path);
  std::map<std::string, std::vector<float>> out;
  for (const mt::TensorInfo& t : r.tensors()) {
    std::vector<float> v((size_t)t.numel());
    r.read_f32(t.name, v.data(), t.numel());
    out[t.name] = std::move(v);
  }
  return out;
}

// A checkpoint directory holds all three files and a parsable state.json with an integer step.
inline ::testing::AssertionResult is_complete_checkpoint(const fs::path& dir) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"})
    if (!fs::exists(dir / f)) return ::testing::AssertionFailure() << dir << " lacks " << f;
  try {
    auto st = nlohmann::json::parse(slurp((dir / "state.json").string()));
    if (!st.contains("step") || !st["step"].is_number_integer())
      return ::testing::AssertionFailure() << dir << "/state.json has no integer step";
    mt::SafetensorsReader m((dir / "model.safetensors").string());
    mt::SafetensorsReader o((dir / "optimizer.safetensors").string());
    if (m.tensors().empty()) return ::testing::AssertionFailure() << dir << "/model.safetensors has no tensors";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << dir << ": " << e.what();
  }
  return ::testing::AssertionSuccess();
}

inline std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace mt::clitest
