// Tests for core/fs: atomic writes keep the old file on failure and leave no temporaries; reads and maps
// name the path on failure.
#include "core/fs.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

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

}  // namespace
}  // namespace mt
