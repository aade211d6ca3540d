// Files: atomic writes (temp + fsync + rename + directory fsync), whole-file reads, read-only mmaps.
#include "core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_path_(path + ".tmp." + std::to_string(::getpid())) {
  MT_REQUIRE(Error, !path.empty(), "cannot write a file with an empty path");
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
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    discard();
    throw Error(str("cannot write ", path_, ": rename failed: ", errno_text(err)));
  }
  committed_ = true;
  tmp_path_.clear();
  fsync_dir(path_);
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  AtomicFileWriter w(path);
  w.write(data, size);
  w.commit();
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, contents.data(), contents.size());
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(str("cannot open ", path, ": ", errno_text(errno)));
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  // Read to EOF instead of trusting st_size: pipes and /proc files report 0.
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

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(str("cannot open ", path, ": ", errno_text(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(str("cannot open ", path, ": ", errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(str("cannot open ", path, ": ", S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file"));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw InputError(str("cannot map ", path, " (", size_, " bytes): ", errno_text(err)));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
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
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace mt
