#include "comm/flight_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace mt::comm::flight {

namespace {

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o;
}

// A buffered writer to a file descriptor using only async-signal-safe calls.
class SafeOut {
 public:
  explicit SafeOut(int fd) : fd_(fd) {}
  void put(const char* s) {
    for (; s && *s; ++s) byte(*s);
  }
  void esc(const char* s) {  // a JSON string's body: quotes and backslashes escaped, control characters as ' '
    for (; s && *s; ++s) {
      const char c = *s;
      if (c == '"' || c == '\\')
        byte('\\'), byte(c);
      else if (static_cast<unsigned char>(c) < 0x20)
        byte(' ');
      else
        byte(c);
    }
  }
  void u(uint64_t v) {
    char d[24];
    int n = 0;
    do d[n++] = static_cast<char>('0' + v % 10), v /= 10;
    while (v);
    while (n) byte(d[--n]);
  }
  void i(int64_t v) {
    if (v < 0) {
      byte('-');
      u(static_cast<uint64_t>(-(v + 1)) + 1);
    } else {
      u(static_cast<uint64_t>(v));
    }
  }
  bool finish() {
    flush();
    return ok_;
  }

 private:
  void byte(char c) {
    if (n_ == sizeof buf_) flush();
    buf_[n_++] = c;
  }
  void flush() {
    size_t off = 0;
    while (off < n_ && ok_) {
      const ssize_t w = ::write(fd_, buf_ + off, n_ - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        ok_ = false;
      else
        off += static_cast<size_t>(w);
    }
    n_ = 0;
  }
  int fd_;
  char buf_[4096];
  size_t n_ = 0;
  bool ok_ = true;
};

}  // namespace

std::string rank_file_path(const std::string& flight_file, int rank) {
  std::string base = flight_file;
  if (base.size() >= 5 && base.compare(base.size() - 5, 5, ".json") == 0) base.resize(base.size() - 5);
  return str(base, ".rank", rank, ".json");
}

bool write_rank_file(const char* path, const Ring& ring, int world_size, const char* hosts_json, const char* fate,
                     int waited_world, const char* error) {
  const int saved_errno = errno;
  char tmp[4096];
  const size_t len = std::strlen(path);
  if (len + 5 > sizeof tmp) return false;
  std::memcpy(tmp, path, len);
  std::memcpy(tmp + len, ".tmp", 5);
  const int fd = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    errno = saved_errno;
    return false;
  }
  SafeOut o(fd);
  o.put("{\"rank\": ");
  o.i(ring.world_rank);
  o.put(", \"size\": ");
  o.i(world_size);
  o.put(", \"host\": \"");
  char host[kHostChars + 1] = {};
  std::memcpy(host, ring.host, kHostChars);
  o.esc(host);
  o.put("\", \"pid\": ");
  o.i(ring.pid);
  o.put(", \"fate\": \"");
  o.esc(fate);
  o.put("\", \"waited_for\": ");
  o.i(waited_world);
  o.put(", \"error\": \"");
  o.esc(error);
  o.put("\",\n \"hosts\": ");
  o.put(hosts_json && *hosts_json ? hosts_json : "[]");
  o.put(",\n \"ops\": [");
  const uint64_t next = ring.next.load(std::memory_order_acquire);
  const uint64_t first = next > kFlightEntries ? next - kFlightEntries : 0;
  bool any = false;
  for (uint64_t index = first; index < next; index++) {
    const Entry& e = ring.e[index % kFlightEntries];
    const uint64_t id = e.id.load(std::memory_order_acquire);
    if (id != index + 1) continue;  // being rewritten, or not yet published
    const uint32_t state = e.state.load(std::memory_order_acquire);
    const uint32_t kind = e.kind.load(std::memory_order_relaxed);
    const uint64_t seq = e.seq.load(std::memory_order_relaxed), bytes = e.bytes.load(std::memory_order_relaxed);
    const int32_t peer = e.peer.load(std::memory_order_relaxed), root = e.root.load(std::memory_order_relaxed);
    const int64_t tq = e.t_queued_ns.load(std::memory_order_relaxed),
                  ts = e.t_started_ns.load(std::memory_order_relaxed), td = e.t_done_ns.load(std::memory_order_relaxed);
    char name[kGroupChars + 1] = {};
    for (int w = 0; w < kGroupChars / 8; w++) {
      const uint64_t word = e.group[w].load(std::memory_order_relaxed);
      std::memcpy(name + 8 * w, &word, 8);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.id.load(std::memory_order_relaxed) != id) continue;  // rewritten while copied
    if (kind >= static_cast<uint32_t>(kNumOpKinds)) continue;
    o.put(any ? ",\n  " : "\n  ");
    any = true;
    o.put("{\"id\": ");
    o.u(id);
    o.put(", \"group\": \"");
    o.esc(name);
    o.put("\", \"op\": \"");
    o.put(op_kind_name(static_cast<OpKind>(kind)));
    o.put("\", \"seq\": ");
    o.u(seq);
    o.put(", \"bytes\": ");
    o.u(bytes);
    o.put(", \"peer\": ");
    o.i(peer);
    o.put(", \"root\": ");
    o.i(root);
    o.put(", \"state\": \"");
    o.put(state_name(static_cast<State>(state)));
    o.put("\", \"t_queued_ns\": ");
    o.i(tq);
    o.put(", \"t_started_ns\": ");
    o.i(ts);
    o.put(", \"t_done_ns\": ");
    o.i(td);
    o.put("}");
  }
  o.put("\n]}\n");
  bool ok = o.finish();
  ok = ::close(fd) == 0 && ok;
  ok = ok && ::rename(tmp, path) == 0;
  if (!ok) ::unlink(tmp);
  errno = saved_errno;
  return ok;
}

namespace {

State parse_state(const std::string& s, const std::string& file) {
  for (State st : {State::empty, State::queued, State::started, State::done, State::failed, State::waiting})
    if (s == state_name(st)) return st;
  throw InputError(str(file, ": unknown operation state '", s, "'"));
}

OpKind parse_kind(const std::string& s, const std::string& file) {
  for (int k = 0; k < kNumOpKinds; k++)
    if (s == op_kind_name(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
  throw InputError(str(file, ": unknown operation '", s, "'"));
}

}  // namespace

Gathered gather_rank_files(const std::string& flight_file) {
  Gathered g;
  struct Read {
    bool found = false;
    nlohmann::json j;
  };
  std::vector<Read> files;
  // The size comes from the first file found; probe ranks until one exists (bounded).
  int size = 0;
  for (int r = 0; r < kMaxGatherRanks && (size == 0 || r < size); r++) {
    const std::string path = rank_file_path(flight_file, r);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      files.emplace_back();
      continue;
    }
    Read rd;
    rd.found = true;
    try {
      rd.j = nlohmann::json::parse(read_file(path));
      const int rank = rd.j.at("rank").get<int>(), n = rd.j.at("size").get<int>();
      MT_CHECK_INPUT(rank == r, path, ": holds rank ", rank, ", expected ", r);
      MT_CHECK_INPUT(n >= 1 && n <= kMaxGatherRanks && r < n, path, ": size ", n, " out of range for rank ", r);
      MT_CHECK_INPUT(size == 0 || n == size, path, ": size ", n, " disagrees with an earlier file's ", size,
                     " (files of two jobs? remove the old ones)");
      size = n;
    } catch (const nlohmann::json::exception& e) {
      throw InputError(str(path, ": not a flight recorder rank file: ", e.what()));
    }
    files.push_back(std::move(rd));
  }
  if (size == 0) return g;
  files.resize(static_cast<size_t>(size));
  g.size = size;
  std::vector<std::string> hosts(static_cast<size_t>(size));
  for (const Read& rd : files) {  // every rank's host, from any file that knows it
    if (!rd.found || !rd.j.contains("hosts")) continue;
    const auto& h = rd.j.at("hosts");
    for (int r = 0; r < size && r < static_cast<int>(h.size()); r++)
      if (hosts[r].empty()) hosts[r] = h[r].get<std::string>();
  }
  g.views.resize(static_cast<size_t>(size));
  g.errors.resize(static_cast<size_t>(size));
  g.waited.assign(static_cast<size_t>(size), -1);
  for (int r = 0; r < size; r++) {
    RankView& v = g.views[r];
    v.rank = r;
    v.host = hosts[r];
    const Read& rd = files[r];
    if (!rd.found) {
      g.missing.push_back(r);
      v.fate = "wrote no ring (killed, stopped, or cut off from the filesystem or the launcher)";
      continue;
    }
    const std::string path = rank_file_path(flight_file, r);
    try {
      const auto& j = rd.j;
      if (j.at("host").get<std::string>() != "") v.host = j.at("host").get<std::string>();
      v.fate = j.at("fate").get<std::string>();
      g.errors[r] = j.at("error").get<std::string>();
      g.waited[r] = j.at("waited_for").get<int>();
      v.waited = g.waited[r];
      for (const auto& e : j.at("ops")) {
        Op op;
        op.id = e.at("id").get<uint64_t>();
        op.group = e.at("group").get<std::string>();
        op.kind = parse_kind(e.at("op").get<std::string>(), path);
        op.seq = e.at("seq").get<uint64_t>();
        op.bytes = e.at("bytes").get<uint64_t>();
        op.peer = e.at("peer").get<int>();
        op.root = e.at("root").get<int>();
        op.state = parse_state(e.at("state").get<std::string>(), path);
        op.t_queued_ns = e.at("t_queued_ns").get<int64_t>();
        op.t_started_ns = e.at("t_started_ns").get<int64_t>();
        op.t_done_ns = e.at("t_done_ns").get<int64_t>();
        v.ops.push_back(std::move(op));
      }
    } catch (const nlohmann::json::exception& e) {
      throw InputError(str(path, ": not a flight recorder rank file: ", e.what()));
    }
  }
  g.verdict = verdict(g.views);
  for (const RankView& v : g.views) g.inside = g.inside || position(v.ops) >= 0;
  return g;
}

void write_flight_file(const std::string& path, const std::vector<RankView>& views, const std::string& verdict) {
  std::string t = str("{\"verdict\": \"", json_escape(verdict), "\",\n \"ranks\": [");
  for (size_t i = 0; i < views.size(); i++) {
    const RankView& v = views[i];
    t += str(i ? ",\n  " : "\n  ", "{\"rank\": ", v.rank, ", \"host\": \"", json_escape(v.host), "\", \"fate\": \"",
             json_escape(v.fate), "\", \"ops\": [");
    for (size_t j = 0; j < v.ops.size(); j++) {
      const Op& op = v.ops[j];
      t +=
          str(j ? ",\n    " : "\n    ", "{\"id\": ", op.id, ", \"group\": \"", json_escape(op.group), "\", \"op\": \"",
              op_kind_name(op.kind), "\", \"seq\": ", op.seq, ", \"bytes\": ", op.bytes, ", \"peer\": ", op.peer,
              ", \"root\": ", op.root, ", \"state\": \"", state_name(op.state), "\", \"t_queued_ns\": ", op.t_queued_ns,
              ", \"t_started_ns\": ", op.t_started_ns, ", \"t_done_ns\": ", op.t_done_ns, "}");
    }
    t += "]}";
  }
  t += "\n]}\n";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(t.c_str(), f);
    std::fclose(f);
  }
}

}  // namespace mt::comm::flight
