// Swimlane diagram of a simulated (or measured) pipeline step as SVG: one lane per rank, forward boxes
// blue and backward boxes orange labelled with the micro-batch (and chunk, when interleaved), idle time
// left white, a time axis underneath.
#pragma once

#include <string>

#include "plan/simulator.h"

namespace mt::trace {

std::string swimlane_svg(const plan::Simulation& sim, const std::string& title, bool show_chunks);

}  // namespace mt::trace
