// Files: atomic writes (temp + fsync + rename + directory fsync), whole-file reads, read-only mmaps.
#include "core/fs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace mt {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// The directory whose entry the rename changes; its fsync makes the rename itself durable.
std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void fsync_dir(const std::string& path) {
  std::string dir = parent_dir(path);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(str("cannot open directory ", dir, " to sync the write of ", path, ": ", errno_text(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename has happened, so that is not a failure.
  if (rc != 0 && err != EINVAL) throw Error(str("cannot sync directory ", dir, " after writing ", path, ": ", errno_text(err)));
}

const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "regular file";
  if (S_ISDIR(m)) return "directory";
  if (S_ISFIFO(m)) return "FIFO";
  if (S_ISCHR(m)) return "character device";
  if (S_ISBLK(m)) return "block device";
  if (S_ISSOCK(m)) return "socket";
  return "special file";
}

}  // namespace

std::string resolve_symlinks(const std::string& path) {
  std::string p = path;
  for (int hop = 0; hop < 40; hop++) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    char buf[PATH_MAX];
    ssize_t n = ::readlink(p.c_str(), buf, sizeof buf - 1);
    if (n < 0) return p;
    std::string target(buf, static_cast<size_t>(n));
    p = target.front() == '/' ? target : parent_dir(p) + "/" + target;
  }
  throw InputError(str(path, ": too many levels of symbolic links"));
}

std::string file_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

void check_output_path(const std::string& flag, const std::string& path) {
  MT_CHECK_INPUT(!path.empty(), flag, " is empty: give a file name");
  const std::string target = resolve_symlinks(path);
  const std::string via = target == path ? "" : str(" (a symlink to ", target, ")");
  const std::string kind = file_kind(path);  // what opening the path reaches (see AtomicFileWriter)
  MT_CHECK_INPUT(kind != "directory", flag, " ", path, via, ": is a directory; give a file name inside it");
  MT_CHECK_INPUT(kind == "" || kind == "regular file" || kind == "character device" || kind == "FIFO", flag, " ",
                 path, via, ": is a ", kind, "; meshtrain writes only regular files, character devices and FIFOs");
  if (kind == "FIFO") {
    // Held open to the end (see the header); one descriptor per checked output, never closed.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    MT_CHECK_INPUT(fd >= 0, flag, " ", path, via, ": ",
                   errno == ENXIO ? "no process is reading the FIFO; start its reader first" : errno_text(errno));
  }
  if (kind == "" || (kind == "regular file" && same_file(path, target))) {
    const std::string dir = parent_dir(target);
    struct stat st;
    MT_CHECK_INPUT(::stat(dir.c_str(), &st) == 0, flag, " ", path, via, ": directory ", dir,
                   " does not exist: ", errno_text(errno));
    MT_CHECK_INPUT(S_ISDIR(st.st_mode), flag, " ", path, via, ": ", dir, " is not a directory");
    MT_CHECK_INPUT(::access(dir.c_str(), W_OK | X_OK) == 0, flag, " ", path, via, ": cannot write in directory ",
                   dir, ": ", errno_text(errno));
  }
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  // Neither exists: compare where they would be created (directory identity + final name).
  const std::string ta = resolve_symlinks(a), tb = resolve_symlinks(b);
  const std::string na = ta.substr(ta.find_last_of('/') + 1), nb = tb.substr(tb.find_last_of('/') + 1);
  return na == nb && same_file(parent_dir(ta), parent_dir(tb));
}

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path) {
  MT_REQUIRE(Error, !path.empty(), "cannot write a file with an empty path");
  target_ = resolve_symlinks(path);
  // stat the path as given (following links the kernel's way): /dev/stdout -> /proc/self/fd/1 -> "pipe:[..]"
  // names no file, yet opening the path reaches the pipe. A regular file reached through such a link (not
  // the file the link text names) is written in place too.
  struct stat st, tst;
  const bool exists = ::stat(path.c_str(), &st) == 0;
  const bool renamable = !exists || (S_ISREG(st.st_mode) && ::stat(target_.c_str(), &tst) == 0 &&
                                     tst.st_dev == st.st_dev && tst.st_ino == st.st_ino);
  if (!renamable) {
    const std::string via = target_ == path ? "" : str(" (a symlink to ", target_, ")");
    MT_REQUIRE(Error, S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode), "cannot write ", path, via,
               ": it is a ", kind_of(st.st_mode), S_ISDIR(st.st_mode) ? "; give a file name inside it" : "");
    // O_NONBLOCK: a FIFO nobody reads fails with ENXIO now instead of blocking open() forever.
    fd_ = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | (S_ISREG(st.st_mode) ? O_TRUNC : 0));
    if (fd_ < 0 && errno == ENXIO) throw Error(str("cannot write ", path, via, ": no process is reading the FIFO"));
    if (fd_ < 0) throw Error(str("cannot write ", path, via, ": ", errno_text(errno)));
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // writes then wait for the reader as usual
    in_place_ = true;
    return;
  }
  tmp_path_ = target_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(str("cannot write ", path_, ": cannot create ", tmp_path_, ": ", errno_text(errno)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!tmp_path_.empty()) {
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }
}

void AtomicFileWriter::write(const void* data, size_t size) {
  MT_ASSERT(fd_ >= 0 && !committed_, "AtomicFileWriter::write after commit or failure for ", path_);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GB per call; a short write is not an error, so loop.
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      discard();
      throw Error(str("cannot write ", path_, ": ", errno_text(err)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  MT_ASSERT(fd_ >= 0 && !committed_, "AtomicFileWriter::commit twice or after failure for ", path_);
  if (in_place_) {  // nothing to rename; devices and pipes do not fsync (EINVAL)
    int rc = ::close(fd_);
    fd_ = -1;
    committed_ = true;
    if (rc != 0) throw Error(str("cannot write ", path_, ": close failed: ", errno_text(errno)));
    return;
  }
  // Without this fsync a crash after the rename can leave a zero-length file at path on ext4/xfs.
  if (::fsync(fd_) != 0) {
    int err = errno;
    discard();
    throw Error(str("cannot write ", path_, ": fsync failed: ", errno_text(err)));
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    int err = errno;
    discard();
    throw Error(str("cannot write ", path_, ": close failed: ", errno_text(err)));
  }
  if (::rename(tmp_path_.c_str(), target_.c_str()) != 0) {
    int err = errno;
    discard();
    throw Error(str("cannot write ", path_, ": rename failed: ", errno_text(err)));
  }
  committed_ = true;
  tmp_path_.clear();
  fsync_dir(target_);
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  AtomicFileWriter w(path);
  w.write(data, size);
  w.commit();
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, contents.data(), contents.size());
}

namespace {
// Opens an input without blocking (a FIFO would wait for a writer in open()) and requires a regular file, so
// /dev/zero cannot feed an unbounded read. Returns the fd and fills st.
int open_input(const std::string& path, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(str("cannot open ", path, ": ", errno_text(errno)));
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(str("cannot open ", path, ": ", errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(str("cannot open ", path, ": it is a ", kind_of(st.st_mode), ", not a regular file"));
  }
  return fd;
}
}  // namespace

std::string read_file(const std::string& path) {
  struct stat st;
  int fd = open_input(path, st);
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  // Read to EOF instead of trusting st_size: /proc files report 0.
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw InputError(str("cannot read ", path, ": ", errno_text(err)));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

namespace {
// A 64-bit hash of bytes in 8-byte words (multiply-xorshift, as in MurmurHash's finalizer): not for
// adversaries, for noticing a changed file. Chained through h.
uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t h) {
  auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
  };
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h ^ w) * 0xc4ceb9fe1a85ec53ULL + i;
  }
  for (; i < n; i++) h = mix(h ^ p[i]) * 0xc4ceb9fe1a85ec53ULL + i;
  return mix(h);
}
}  // namespace

std::string file_fingerprint(const std::string& path) {
  constexpr size_t kWhole = 64 << 20, kEnd = 1 << 20, kBlock = 64 << 10, kBlocks = 224;
  const MappedFile f(path);
  const size_t n = f.size();
  uint64_t h = hash_bytes(reinterpret_cast<const uint8_t*>(&n), sizeof n, 0x9e3779b97f4a7c15ULL);
  if (n <= kWhole) {
    h = hash_bytes(f.data(), n, h);
  } else {
    h = hash_bytes(f.data(), kEnd, h);
    for (size_t b = 0; b < kBlocks; b++) {
      const size_t at = kEnd + (n - 2 * kEnd - kBlock) / (kBlocks - 1) * b;
      h = hash_bytes(f.data() + at, kBlock, h);
    }
    h = hash_bytes(f.data() + n - kEnd, kEnd, h);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return str(n, ":", hex);
}

// ---- SIGBUS on a file that shrank under its mapping ----
// A fixed table the signal handler can read without locks: a slot is published by storing its base last.
namespace {
constexpr int kMaxMappings = 256;
struct MappingSlot {
  std::atomic<const uint8_t*> base{nullptr};
  size_t size = 0;
  char path[512] = {};
};
MappingSlot g_mappings[kMaxMappings];
std::mutex g_mappings_mu;  // writers only
struct sigaction g_old_bus;

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const uint8_t* a = static_cast<const uint8_t*>(info->si_addr);
  for (MappingSlot& m : g_mappings) {
    const uint8_t* b = m.base.load(std::memory_order_acquire);
    if (b != nullptr && a >= b && a < b + m.size) {
      const char* parts[] = {m.path,
                             " shrank or was truncated while meshtrain was reading it (another process "
                             "rewrote it?); an input must not change during a run"};
      fatal_message(parts, 2);
      ::_exit(1);
    }
  }
  // Not ours: the previous disposition.
  if (g_old_bus.sa_flags & SA_SIGINFO) {
    if (g_old_bus.sa_sigaction) return g_old_bus.sa_sigaction(sig, info, ctx);
  } else if (g_old_bus.sa_handler != SIG_DFL && g_old_bus.sa_handler != SIG_IGN) {
    return g_old_bus.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}
}  // namespace

void register_mapping(const uint8_t* base, size_t size, const std::string& path) {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_old_bus);
  });
  std::lock_guard<std::mutex> lk(g_mappings_mu);
  for (MappingSlot& m : g_mappings) {
    if (m.base.load(std::memory_order_relaxed) != nullptr) continue;
    m.size = size;
    std::snprintf(m.path, sizeof m.path, "%s", path.c_str());
    m.base.store(base, std::memory_order_release);
    return;
  }
  // More than kMaxMappings live maps: the extra ones keep the default SIGBUS (a crash without a message).
}

void unregister_mapping(const uint8_t* base) noexcept {
  std::lock_guard<std::mutex> lk(g_mappings_mu);
  for (MappingSlot& m : g_mappings)
    if (m.base.load(std::memory_order_relaxed) == base) m.base.store(nullptr, std::memory_order_release);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st;
  int fd = open_input(path, st);
  size_ = static_cast<size_t>(st.st_size);
#ifdef MESHTRAIN_MAPPED_FILE_COPY
  // The fuzz build (fuzz/CMakeLists.txt): the file is read into heap memory of exactly its size, so that
  // AddressSanitizer sees a read past its end (in a mapping it lands in the last page's padding, unseen).
  if (size_ > 0) {
    uint8_t* copy = new uint8_t[size_];
    for (size_t got = 0; got < size_;) {
      const ssize_t n = ::pread(fd, copy + got, size_ - got, static_cast<off_t>(got));
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        delete[] copy;
        ::close(fd);
        throw InputError(str("cannot read ", path, " (", size_, " bytes): ", errno_text(err)));
      }
      got += static_cast<size_t>(n);
    }
    data_ = copy;
  }
#else
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw InputError(str("cannot map ", path, " (", size_, " bytes): ", errno_text(err)));
    }
    data_ = static_cast<const uint8_t*>(p);
    register_mapping(data_, size_, path_);
  }
#endif
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_ != nullptr) {
#ifdef MESHTRAIN_MAPPED_FILE_COPY
    delete[] data_;
#else
    unregister_mapping(data_);
    ::munmap(const_cast<uint8_t*>(data_), size_);
#endif
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace mt
