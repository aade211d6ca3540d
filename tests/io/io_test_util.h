// Helpers shared by the tests of the file formats: a scratch directory per test, raw (non-atomic) file
// writes for building malformed files, and a check that a call throws mt::InputError with given text.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace mt::testing_io {

// A fresh directory under testing::TempDir(), removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "io";
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::path(::testing::TempDir()) / ("mt_io_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

  // Names in the directory containing ".tmp.", i.e. leftovers of an atomic write.
  int count_temp_files() const {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
    return n;
  }

 private:
  std::filesystem::path path_;
};

// Plain write, no fsync: the fuzz tests write thousands of files and must not wait on the disk.
inline void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A safetensors file from a literal header and data buffer (no padding, no validation).
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Passes when fn throws mt::InputError whose message contains every one of `parts`.
inline ::testing::AssertionResult throws_input_error(const std::function<void()>& fn,
                                                     std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const mt::InputError& e) {
    std::string msg = e.what();
    for (const std::string& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-InputError: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace mt::testing_io
