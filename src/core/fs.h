// Files: atomic whole-file writes, a streaming atomic writer, whole-file reads and read-only memory maps.
// Everything that meshtrain writes to disk (checkpoints, token shards, metrics summaries) goes through the
// atomic path, so a crash or a full disk leaves either the old file or the new one at `path`, never a
// half-written one. The price is one fsync of the file and one of its directory per write.
// Format parsing lives elsewhere (checkpoint/, data/); this file knows only bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

// Writes bytes to `path` atomically: write to `path + ".tmp." + pid` in the same directory, fsync, rename over
// `path`, fsync the directory. Throws mt::Error naming the path and strerror on failure; the temporary file is
// removed and whatever was at `path` before is left as it was.
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, const std::string& contents);

// The whole file. Throws mt::InputError "cannot open PATH: <strerror>" (or "cannot read ...").
std::string read_file(const std::string& path);

// Streams a file into place with the same guarantee as write_file_atomic, for outputs too large to build in
// memory first (a 500 MB checkpoint). Nothing appears at `path` until commit(); destroying an uncommitted
// writer (an exception on the way) deletes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);  // creates the temporary file; throws mt::Error
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);  // appends; throws mt::Error (e.g. ENOSPC) and discards the temp
  void commit();                              // fsync, rename over path, fsync the directory
  const std::string& path() const { return path_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// A read-only private mapping of a whole file. The pages are loaded lazily by the kernel, so opening a
// 500 MB checkpoint costs nothing until a tensor is read. If another process truncates the file while it is
// mapped, touching the lost pages raises SIGBUS; meshtrain writes files by rename, so it never does this to
// itself.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws mt::InputError "cannot open PATH: <strerror>"
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }

 private:
  void unmap() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mt
