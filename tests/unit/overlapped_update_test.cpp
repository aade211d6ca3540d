// The delayed update on its own thread (train/overlapped_update.h) on a plain buffer, driven through the calls
// the parameter store makes: the versions the model reads and the checkpoint sees equal the serial delay-1 part
// (train/weight_versions.h) step by step; the main thread reaches the next step's forward while the update is
// still running (the update waits on the test, which only lets it go after before_forward returned: events,
// no timing); the collectives' half (complete) runs on the main thread; an update's error and a missed
// deadline reach the main thread as errors.
#include "train/overlapped_update.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "train/weight_versions.h"

namespace {

using mt::train::DelayOneVersions;
using mt::train::OverlappedDelayOne;
using Deferred = mt::parallel::ParamVersions::DeferredUpdate;

// One "optimizer": p = 0.5 p + g on the owned range [1, 3) only (as a ZeRO 1 shard), the rest left alone.
void toy_step(float* p, const float* g) {
  for (int i = 1; i < 3; i++) p[i] = 0.5f * p[i] + g[i];
}

TEST(OverlappedUpdate, SameVersionsAsTheSerialPart) {
  std::vector<float> a{1, 2, 3, 4}, b{1, 2, 3, 4};
  DelayOneVersions serial;
  OverlappedDelayOne over(30.0, 1);
  serial.bind(a.data(), a.size());
  over.bind(b.data(), b.size());
  const std::vector<std::pair<size_t, size_t>> owned{{1, 2}};
  for (int s = 0; s < 5; s++) {
    serial.before_forward();
    over.before_forward();
    EXPECT_EQ(a, b) << "the version step " << s << " reads";
    // The step's gradient depends on what the step read (as a backward's does).
    std::vector<float> g(4);
    for (int i = 0; i < 4; i++) g[i] = 0.25f * a[i] + (float)s;
    serial.before_update();
    toy_step(a.data(), g.data());
    over.before_clip();
    over.defer_update(g.data(), owned, Deferred{toy_step, nullptr});
    if (s % 2 == 1) {  // between steps, as before a checkpoint: the master and the other version
      over.settle();
      EXPECT_EQ(a, b) << "the master after step " << s;
      EXPECT_EQ(std::vector<float>(serial.other(), serial.other() + 4), std::vector<float>(over.other(), over.other() + 4))
          << "the other version after step " << s;
    }
  }
  over.settle();
  EXPECT_EQ(a, b);
  EXPECT_EQ(over.deferred(), 5);
}

TEST(OverlappedUpdate, TheNextForwardBeginsWhileTheUpdateRuns) {
  std::vector<float> a{1, 2, 3, 4};
  OverlappedDelayOne over(30.0, 1);
  over.bind(a.data(), a.size());
  over.before_forward();
  std::promise<void> forward_begun;
  std::shared_future<void> go = forward_begun.get_future().share();
  bool waited_out = false;
  std::thread::id main_id = std::this_thread::get_id(), run_id, complete_id;
  Deferred u;
  u.run = [&](float* p, const float* g) {
    run_id = std::this_thread::get_id();
    // Deadline only so that a broken part fails instead of hanging: released as soon as before_forward returns.
    waited_out = go.wait_for(std::chrono::seconds(20)) != std::future_status::ready;
    toy_step(p, g);
  };
  u.complete = [&](float*) { complete_id = std::this_thread::get_id(); };
  std::vector<float> g{0, 1, 1, 0};
  over.defer_update(g.data(), {{1, 2}}, u);
  over.before_forward();  // must not wait for the update: it is blocked until this returns
  forward_begun.set_value();
  over.before_clip();
  EXPECT_FALSE(waited_out) << "before_forward waited for the update it should overlap";
  EXPECT_EQ(over.overlapped(), 1);
  EXPECT_NE(run_id, main_id) << "the update ran on the main thread";
  EXPECT_EQ(complete_id, main_id) << "the collectives' half ran off the main thread";
}

TEST(OverlappedUpdate, AnUpdatesErrorReachesTheMainThread) {
  std::vector<float> a{1, 2, 3, 4};
  OverlappedDelayOne over(30.0, 1);
  over.bind(a.data(), a.size());
  over.before_forward();
  std::vector<float> g(4, 0.0f);
  over.defer_update(g.data(), {{0, 4}}, Deferred{[](float*, const float*) { throw mt::InputError("disk full"); }, nullptr});
  EXPECT_THROW(over.before_clip(), mt::InputError);
}

TEST(OverlappedUpdate, AMissedDeadlineIsAnError) {
  std::vector<float> a{1, 2, 3, 4};
  OverlappedDelayOne over(0.05, 1);
  over.bind(a.data(), a.size());
  over.before_forward();
  std::promise<void> p;
  std::shared_future<void> go = p.get_future().share();
  std::vector<float> g(4, 0.0f);
  over.defer_update(g.data(), {{0, 4}}, Deferred{[go](float*, const float*) { go.wait_for(std::chrono::seconds(20)); }, nullptr});
  try {
    over.before_clip();
    ADD_FAILURE() << "no error past the deadline";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within"), std::string::npos) << e.what();
  }
  p.set_value();  // the worker ends; the destructor joins it
}

TEST(OverlappedUpdate, StopLetsTheUpdateInFlightFinish) {
  // As when an error unwinds a step with an update in flight: stop() returns only once the update is over, so
  // the optimizer it uses may be destroyed next.
  std::vector<float> a{1, 2, 3, 4};
  OverlappedDelayOne over(30.0, 1);
  over.bind(a.data(), a.size());
  over.before_forward();
  std::promise<void> started;
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  bool finished = false;
  std::vector<float> g(4, 0.0f);
  over.defer_update(g.data(), {{0, 4}}, Deferred{[&](float*, const float*) {
                      started.set_value();
                      go_f.wait_for(std::chrono::seconds(20));
                      finished = true;
                    },
                                                 nullptr});
  started.get_future().wait();
  std::thread releaser([&] { go.set_value(); });
  over.stop();
  EXPECT_TRUE(finished) << "stop() returned with the update still running";
  releaser.join();
}

}  // namespace
