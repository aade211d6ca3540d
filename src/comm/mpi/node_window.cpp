#include "comm/mpi/node_window.h"

#include <algorithm>

#include "comm/mpi/mpi_comm.h"
#include "core/error.h"

namespace mt::comm::mpi {

NodeWindow::NodeWindow(MPI_Comm node) : node_(node) { MPI_Comm_size(node, &k_); }

NodeWindow::~NodeWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) release();
}

void NodeWindow::release() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
  base0_ = nullptr;
  slot_bytes_ = 0;
}

void NodeWindow::begin(size_t bytes, double timeout_s, const std::function<std::string()>& what) {
  half_ ^= 1;
  if (bytes <= slot_bytes_ && win_ != MPI_WIN_NULL) return;
  // A host-mate may still read the slots of the previous call: meet it here (under the deadline) before the
  // window is freed and allocated anew.
  if (win_ != MPI_WIN_NULL) sync(timeout_s, what);
  release();
  const size_t want = (std::max<size_t>(bytes, 4096) + 63) / 64 * 64;
  void* mine = nullptr;
  check_mpi(MPI_Win_allocate_shared(static_cast<MPI_Aint>(2 * want), 1, MPI_INFO_NULL, node_, &mine, &win_),
        "MPI_Win_allocate_shared (hierarchical collectives inside a host)");
  MPI_Aint size = 0;
  int unit = 0;
  void* base = nullptr;
  check_mpi(MPI_Win_shared_query(win_, 0, &size, &unit, &base), "MPI_Win_shared_query");
  base0_ = static_cast<char*>(base);
  slot_bytes_ = want;
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all");
}

char* NodeWindow::slot(int l) const { return base0_ + (2 * static_cast<size_t>(l) + half_) * slot_bytes_; }

void NodeWindow::sync(double timeout_s, const std::function<std::string()>& what) {
  MPI_Win_sync(win_);
  MPI_Request req;
  check_mpi(MPI_Ibarrier(node_, &req), "MPI_Ibarrier");
  wait_request(&req, timeout_s, what);
  MPI_Win_sync(win_);
}

}  // namespace mt::comm::mpi
