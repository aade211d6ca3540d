// The parts of the Python module `meshtrain`, one file each; module.cpp registers them and the exceptions.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>
#include <string>

namespace mt::py {

namespace pb = pybind11;

// train.cpp: train(config) -> list of metrics rows (dicts).
void add_train(pb::module_& m);
// weights.cpp: load_weights, save_weights, read_metadata, forward.
void add_weights(pb::module_& m);
// simulate.cpp: simulate(...) -> Simulation, with Box.
void add_simulate(pb::module_& m);

// A JSON value as the Python value json.loads would give (dict, list, str, int, float, bool, None).
pb::object to_python(const nlohmann::json& j);

}  // namespace mt::py
