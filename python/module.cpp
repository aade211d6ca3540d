// The Python module `meshtrain` (built into build/python by python/CMakeLists.txt):
//   train(config) -> metrics rows; load_weights / save_weights / read_metadata; forward(path, tokens) -> logits;
//   simulate(...) -> Simulation.
// meshtrain's errors arrive as Python exceptions carrying the message the CLI prints after "meshtrain: error: ":
//   Error (RuntimeError)   any failure of the world: a failed rank, an unwritable file
//   InputError (Error)     a bad option or input file          CommError (Error)   a peer gone, a deadline passed
//   DivergedError (Error)  a non-finite loss or gradient
#include "bindings.h"
#include "core/error.h"

PYBIND11_MODULE(meshtrain, m) {
  namespace pb = pybind11;
  m.doc() = "meshtrain: parallel and distributed training of neural networks on CPUs (docs/python.md)";
  // Derived classes after their base: pybind11 tries the translators last registered first.
  auto error = pb::register_exception<mt::Error>(m, "Error", PyExc_RuntimeError);
  pb::register_exception<mt::InputError>(m, "InputError", error.ptr());
  pb::register_exception<mt::CommError>(m, "CommError", error.ptr());
  pb::register_exception<mt::DivergedError>(m, "DivergedError", error.ptr());
  mt::py::add_train(m);
  mt::py::add_weights(m);
  mt::py::add_simulate(m);
}
