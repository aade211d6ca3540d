// Files: atomic whole-file writes, a streaming atomic writer, whole-file reads and read-only memory maps.
// Everything that meshtrain writes to disk (checkpoints, token shards, metrics summaries) goes through the
// atomic path, so a crash or a full disk leaves either the old file or the new one at `path`, never a
// half-written one. The price is one fsync of the file and one of its directory per write.
// What the path is decides how it is written (git's lockfile discipline):
//   regular file or new path  temp file beside it, fsync, rename over it, fsync the directory
//   symlink (any depth)       followed: its final target is replaced atomically, the link stays
//   character device, FIFO    written in place, no rename (`--metrics /dev/null`, `--out /dev/stdout`); a FIFO
//                             with no reader is an error at once, not a wait
//   directory, block device,  an mt::Error naming the path
//   socket
// Inputs are opened without blocking and must be regular files, so a FIFO or /dev/zero given as data is an
// error at once rather than a hang or an unbounded read.
// Format parsing lives elsewhere (checkpoint/, data/); this file knows only bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

// Writes bytes to `path` atomically: write to `path + ".tmp." + pid` in the same directory, fsync, rename over
// `path`, fsync the directory (for a symlink: its target's path; a device or FIFO: in place, see above). Throws mt::Error naming the path and strerror on failure; the temporary file is
// removed and whatever was at `path` before is left as it was.
void write_file_atomic(const std::string& path, const void* data, size_t size);
void write_file_atomic(const std::string& path, const std::string& contents);

// The whole file. Throws mt::InputError "cannot open PATH: <strerror>" (or "cannot read ...", or "... is a
// FIFO, not a regular file" for anything but a regular file, without blocking).
std::string read_file(const std::string& path);

// `path` with every symlink along the final component followed (a dangling link gives the path it names).
// Throws mt::InputError on a link loop (more than 40 hops).
std::string resolve_symlinks(const std::string& path);

// "regular file", "directory", "FIFO", "character device", "block device", "socket", or "" when nothing is
// at `path` (stat, following symlinks).
std::string file_kind(const std::string& path);

// Checks at start that `path` can be written as the output of `flag` (e.g. "--save"): its final target is not
// a directory, block device or socket, a regular or new file's directory exists and is writable, and a FIFO
// has a reader now. A FIFO is opened (without blocking) for that and the descriptor kept until the process
// exits: closing it would hand the reader an end-of-file before the real output, ending `cat fifo`.
// Throws mt::InputError "--save DIR: is a directory", "--save F: no process is reading the FIFO", etc.
void check_output_path(const std::string& flag, const std::string& path);

// True when both paths name the same file (same device and inode), or, for a path that does not exist
// yet, the same absolute location after symlinks are followed. Used to refuse an output equal to an input.
bool same_file(const std::string& a, const std::string& b);

// "BYTES:HASH" of a file's content (HASH 16 hex digits), to tell whether an input changed between runs
// whatever its path: a 64-bit hash of the whole file up to 64 MiB, else of its first and last MiB and 224
// evenly spaced 64 KiB blocks (16 MiB read at most, a few milliseconds). Throws InputError like MappedFile.
std::string file_fingerprint(const std::string& path);

// Streams a file into place with the same guarantee as write_file_atomic, for outputs too large to build in
// memory first (a 500 MB checkpoint). Nothing appears at `path` until commit(); destroying an uncommitted
// writer (an exception on the way) deletes the temporary file.
class AtomicFileWriter {
 public:
  // Creates the temporary file beside the final target (or opens a device/FIFO in place); throws mt::Error.
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);  // appends; throws mt::Error (e.g. ENOSPC) and discards the temp
  void commit();                              // fsync, rename over path, fsync the directory
  const std::string& path() const { return path_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string target_;    // path_ with symlinks followed: what the rename replaces
  std::string tmp_path_;  // empty when writing in place
  int fd_ = -1;
  bool committed_ = false;
  bool in_place_ = false;  // a character device or FIFO: no temp, no rename, no fsync
};

// A read-only private mapping of a whole file. The pages are loaded lazily by the kernel, so opening a
// 500 MB checkpoint costs nothing until a tensor is read. If another process truncates the file while it is
// mapped, touching the lost pages raises SIGBUS; a handler installed with the first mapping turns that into
// "meshtrain: error: FILE shrank ..." and exit 1 (only for addresses inside a live mapping; any other SIGBUS
// keeps its default action). The handler costs nothing until a fault: the hot path reads memory as before.
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

// The SIGBUS table MappedFile uses (exposed for tests and other mappers).
void register_mapping(const uint8_t* base, size_t size, const std::string& path);
void unregister_mapping(const uint8_t* base) noexcept;

}  // namespace mt
