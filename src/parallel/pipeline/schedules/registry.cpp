// The schedule generators a run can name (--schedule, simulate --schedule), in the order help texts list
// them. A new generator is a new file in this folder and one line here.
#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline/schedule_generator.h"

namespace mt::pipeline {

namespace {

const std::vector<std::unique_ptr<ScheduleGenerator>>& registry() {
  static const std::vector<std::unique_ptr<ScheduleGenerator>> all = [] {
    std::vector<std::unique_ptr<ScheduleGenerator>> v;
    v.push_back(make_gpipe_schedule());
    v.push_back(make_one_f_one_b_schedule());
    v.push_back(make_interleaved_schedule());
    v.push_back(make_zb_h1_schedule());
    v.push_back(make_zb_h2_schedule());
    v.push_back(make_zb_v_schedule());
    v.push_back(make_pipedream_2bw_schedule());
    v.push_back(make_chimera_schedule());
    v.push_back(make_pipedream_schedule());
    v.push_back(make_pipemare_schedule());
    return v;
  }();
  return all;
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& g : registry()) v.push_back(g->name());
    return v;
  }();
  return names;
}

std::string schedule_names_joined(const std::string& sep) {
  std::string known;
  for (const std::string& n : schedule_names()) known += (known.empty() ? "" : sep) + n;
  return known;
}

bool has_schedule(const std::string& name) {
  const std::vector<std::string>& names = schedule_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

const ScheduleGenerator& find_schedule(const std::string& name) {
  for (const auto& g : registry())
    if (name == g->name()) return *g;
  throw InputError(str("unknown pipeline schedule '", name, "'; choose one of ", schedule_names_joined()));
}

}  // namespace mt::pipeline
