#include "comm/shm/job.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>

#include "core/error.h"

namespace mt::comm::shm {

namespace {
constexpr uint64_t kMagic = 0x6d6573687472616eull;  // "meshtran"
std::atomic<int> g_job_counter{0};

size_t header_bytes() { return (sizeof(JobBlock) + 4095) & ~size_t{4095}; }

void copy_msg(char* dst, const std::string& s) {
  size_t n = std::min(s.size(), kErrorChars - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = 0;
}
}  // namespace

std::string segment_prefix(pid_t pid) { return str("meshtrain-", pid, "-"); }

Job::Job(int nranks, size_t arena_bytes) {
  MT_REQUIRE(CommError, nranks >= 1 && nranks <= kMaxRanks, "shm backend: --nproc ", nranks,
             " is out of range 1..", kMaxRanks);
  name_ = str("/meshtrain-", getpid(), "-", g_job_counter.fetch_add(1));
  bytes_ = header_bytes() + arena_bytes;
  int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  MT_REQUIRE(CommError, fd >= 0, "shm_open(", name_, ") failed: ", std::strerror(errno),
             " (is /dev/shm mounted and writable?)");
  if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name_.c_str());
    throw CommError(str("ftruncate(", name_, ", ", bytes_, ") failed: ", std::strerror(e)));
  }
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  int e = errno;
  close(fd);
  shm_unlink(name_.c_str());  // the mapping is all we need from here on; see the file comment
  MT_REQUIRE(CommError, p != MAP_FAILED, "mmap of ", bytes_, " bytes of shared memory failed: ", std::strerror(e));
  base_ = static_cast<char*>(p);
  block_ = new (base_) JobBlock{};
  block_->magic = kMagic;
  block_->nranks = nranks;
  block_->launcher_pid = getpid();
  block_->arena_bytes = bytes_;
  block_->next_free.store(header_bytes());
  block_->next_group.store(1);
  block_->failed_rank.store(-1);
  block_->waited_rank.store(-1);
  for (auto& w : block_->waiting_for) w.store(-1);
}

Job::~Job() {
  if (base_) munmap(base_, bytes_);
}

uint64_t Job::allocate(size_t bytes) {
  bytes = (bytes + 4095) & ~size_t{4095};
  uint64_t off = block_->next_free.fetch_add(bytes);
  MT_REQUIRE(CommError, off + bytes <= bytes_, "shared-memory arena exhausted: need ", bytes, " bytes at offset ",
             off, " of ", bytes_, " (too many splits or too large a group)");
  return off;
}

void Job::fail(int world_rank, const std::string& why, int waited_rank) {
  // Only the first failure is recorded; its text is written before the rank is published.
  if (block_->failure_claim.exchange(1) != 0) return;
  copy_msg(block_->failure, why);
  block_->waited_rank.store(waited_rank, std::memory_order_relaxed);
  block_->failed_rank.store(world_rank, std::memory_order_release);
}

bool Job::failed(int* world_rank, std::string* why) {
  int32_t r = block_->failed_rank.load(std::memory_order_acquire);
  if (r < 0) return false;
  if (world_rank) *world_rank = r;
  if (why) *why = std::string(block_->failure, strnlen(block_->failure, kErrorChars));
  return true;
}

void Job::set_rank_error(int world_rank, const std::string& msg) {
  if (world_rank >= 0 && world_rank < block_->nranks) copy_msg(block_->rank_error[world_rank], msg);
}

std::string Job::rank_error(int world_rank) {
  const char* s = block_->rank_error[world_rank];
  return std::string(s, strnlen(s, kErrorChars));
}

void Job::set_exited(int world_rank, int wait_status) {
  block_->exit_status[world_rank].store(1 + wait_status, std::memory_order_release);
}

void Job::note_wait(int world_rank, int waiting_for) {
  block_->waiting_for[world_rank].store(waiting_for, std::memory_order_relaxed);
  block_->wait_polled_ns[world_rank].store(std::chrono::steady_clock::now().time_since_epoch().count(),
                                           std::memory_order_release);
}

std::vector<int> Job::wait_chain(int first) {
  // A rank still waiting polls every few ms; one silent for a second is not waiting (stopped, or computing).
  constexpr int64_t kFreshNs = 1'000'000'000;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::vector<int> chain{first};
  std::vector<bool> seen(block_->nranks, false);
  for (int cur = first; cur >= 0 && cur < block_->nranks && !seen[cur];) {
    seen[cur] = true;
    const int64_t polled = block_->wait_polled_ns[cur].load(std::memory_order_acquire);
    const int next = block_->waiting_for[cur].load(std::memory_order_relaxed);
    if (polled == 0 || now - polled > kFreshNs || next < 0 || next >= block_->nranks || seen[next]) break;
    chain.push_back(next);
    cur = next;
  }
  return chain;
}

bool Job::exited(int world_rank, int* wait_status) {
  int32_t v = block_->exit_status[world_rank].load(std::memory_order_acquire);
  if (v == 0) return false;
  if (wait_status) *wait_status = v - 1;
  return true;
}

namespace {
template <typename F>
int for_each_segment(pid_t pid, F&& f) {
  std::string prefix = segment_prefix(pid);
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
        f(e->d_name);
        ++n;
      }
    }
    closedir(d);
  }
  return n;
}
}  // namespace

int sweep_segments(pid_t pid) {
  return for_each_segment(pid, [](const char* name) { shm_unlink((std::string("/") + name).c_str()); });
}

int count_segments(pid_t pid) {
  return for_each_segment(pid, [](const char*) {});
}

}  // namespace mt::comm::shm
