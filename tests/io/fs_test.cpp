// Tests for core/fs: atomic writes keep the old file on failure and leave no temporaries; reads and maps
// name the path on failure.
#include "core/fs.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>

#include "io_test_util.h"

namespace mt {
namespace {

using testing_io::ScratchDir;
using testing_io::throws_input_error;

TEST(Fs, WriteAtomicRoundTripAndOverwrite) {
  ScratchDir dir;
  std::string path = dir.file("a.bin");
  std::string first("abc\0def\xff", 8);  // embedded NUL and high byte survive
  write_file_atomic(path, first);
  EXPECT_EQ(read_file(path), first);
  write_file_atomic(path, "xy", 2);  // shorter than before: no stale tail
  EXPECT_EQ(read_file(path), "xy");
  write_file_atomic(path, std::string());
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(dir.count_temp_files(), 0);
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
}

TEST(Fs, WriteToMissingDirectoryThrowsNamingPath) {
  ScratchDir dir;
  std::string path = dir.file("no_such_dir/out.bin");
  try {
    write_file_atomic(path, "data");
    FAIL() << "no exception";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Fs, RenameOntoDirectoryFailsAndLeavesNoTemp) {
  ScratchDir dir;
  std::string path = dir.file("target");
  std::filesystem::create_directory(path);
  EXPECT_THROW(write_file_atomic(path, "data"), mt::Error);
  EXPECT_TRUE(std::filesystem::is_directory(path));
  EXPECT_EQ(dir.count_temp_files(), 0);
}

// A write that fails half-way (file size limit, as a full disk would) keeps the old contents. Root can
// write to read-only directories, so the size limit is the reliable way to make write() fail.
TEST(Fs, FailedWriteKeepsOldFile) {
  ScratchDir dir;
  std::string path = dir.file("keep.bin");
  write_file_atomic(path, "old contents");

  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // else the kernel kills us instead of returning EFBIG
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string big(1 << 20, 'x');
  std::string msg;
  try {
    write_file_atomic(path, big);
  } catch (const mt::Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);

  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_EQ(dir.count_temp_files(), 0);
}

TEST(Fs, UncommittedWriterLeavesNothing) {
  ScratchDir dir;
  std::string path = dir.file("never.bin");
  {
    AtomicFileWriter w(path);
    w.write("partial", 7);
    EXPECT_EQ(dir.count_temp_files(), 1);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(dir.count_temp_files(), 0);
}

TEST(Fs, ReadMissingFileNamesPath) {
  ScratchDir dir;
  std::string path = dir.file("missing.txt");
  EXPECT_TRUE(throws_input_error([&] { read_file(path); }, {"cannot open " + path + ": No such file or directory"}));
  EXPECT_TRUE(throws_input_error([&] { MappedFile m(path); }, {"cannot open " + path}));
  EXPECT_TRUE(throws_input_error([&] { MappedFile m(dir.path().string()); }, {"is a directory"}));
}

TEST(Fs, MappedFileSeesContents) {
  ScratchDir dir;
  std::string path = dir.file("m.bin");
  write_file_atomic(path, "hello");
  MappedFile m(path);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), 5), "hello");
  MappedFile moved = std::move(m);
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_EQ(m.data(), nullptr);

  write_file_atomic(path, std::string());
  MappedFile empty(path);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
}

// What the path is decides how it is written (issue 13, point 1).
TEST(Fs, SymlinkIsFollowedAndKept) {
  ScratchDir dir;
  const std::string target = dir.file("t.bin"), link = dir.file("l.bin");
  write_file_atomic(target, "old");
  std::filesystem::create_symlink("t.bin", link);
  write_file_atomic(link, "new contents");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read_file(target), "new contents");
  EXPECT_EQ(dir.count_temp_files(), 0);
  EXPECT_EQ(resolve_symlinks(link), dir.file("t.bin"));
}

TEST(Fs, DeviceAndFifoAreWrittenInPlace) {
  ScratchDir dir;
  const std::string null = dir.file("null"), fifo = dir.file("fifo");
  if (mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) GTEST_SKIP() << "mknod needs root";
  write_file_atomic(null, "discarded");
  EXPECT_EQ(file_kind(null), "character device");
  EXPECT_EQ(dir.count_temp_files(), 0);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  try {
    write_file_atomic(fifo, "x");
    FAIL() << "a FIFO without a reader must fail at once";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no process is reading"), std::string::npos) << e.what();
  }
  int rd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(rd, 0);
  write_file_atomic(fifo, "through the pipe");
  char buf[64] = {};
  EXPECT_EQ(::read(rd, buf, sizeof buf), 16);
  EXPECT_EQ(std::string(buf), "through the pipe");
  ::close(rd);
  EXPECT_EQ(file_kind(fifo), "FIFO");
  EXPECT_TRUE(throws_input_error([&] { read_file(fifo); }, {fifo, "FIFO, not a regular file"}));
  EXPECT_TRUE(throws_input_error([&] { MappedFile m(fifo); }, {fifo, "FIFO"}));
}

TEST(Fs, OutputChecksAndSameFile) {
  ScratchDir dir;
  const std::string a = dir.file("a"), link = dir.file("link");
  write_file_atomic(a, "x");
  std::filesystem::create_symlink(a, link);
  EXPECT_TRUE(same_file(a, link));
  EXPECT_TRUE(same_file(dir.file("new"), dir.file("./new")));
  EXPECT_FALSE(same_file(a, dir.file("new")));
  EXPECT_TRUE(throws_input_error([&] { check_output_path("--save", dir.path().string()); }, {"--save", "is a directory"}));
  EXPECT_TRUE(throws_input_error([&] { check_output_path("--save", dir.file("no/x")); }, {"--save", "does not exist"}));
  check_output_path("--save", a);
  check_output_path("--save", dir.file("fresh"));
}

// A mapped file that shrinks: a message naming it and exit 1, not a bare SIGBUS.
TEST(FsDeathTest, MappedFileTruncatedUnderneathNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir.file("shrinks.bin");
  write_file_atomic(path, std::string(3 * 4096, 'a'));
  EXPECT_EXIT(
      {
        MappedFile m(path);
        if (::truncate(path.c_str(), 10) != 0) std::_Exit(3);
        volatile uint8_t x = m.data()[2 * 4096];
        (void)x;
        std::_Exit(4);
      },
      ::testing::ExitedWithCode(1), "shrinks.bin shrank");
}

}  // namespace
}  // namespace mt
