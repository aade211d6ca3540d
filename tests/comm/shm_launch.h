// Launch options of the shm tests: n forked ranks over shared memory, each blocking call with a deadline.
#pragma once

#include "comm/launch.h"

namespace mt::comm::testing {

inline LaunchOptions shm_opts(int n, double timeout = 60) {
  LaunchOptions o;
  o.nproc = n;
  o.backend = "shm";
  o.timeout_s = timeout;
  return o;
}

}  // namespace mt::comm::testing
