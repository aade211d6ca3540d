// The MESHTRAIN_* environment variables that tune or check a run (README "Environment variables"). Each is
// read where it acts; these parse them strictly: a value that is not one of the accepted forms is an
// mt::InputError naming the variable and the value, never a silent fallback to the default.
#pragma once

#include <optional>
#include <utility>

namespace mt {

// A switch that takes 0 or 1: nullopt when unset or empty.
std::optional<bool> env_flag(const char* name);
// An integer in [lo, hi]: nullopt when unset or empty.
std::optional<long> env_int(const char* name, long lo, long hi);
// Two non-negative integers "a,b" (MESHTRAIN_SHM_SPIN="spin_us,yield_us"): nullopt when unset or empty.
std::optional<std::pair<int, int>> env_int_pair(const char* name);

}  // namespace mt
