#include "data/labeled_images.h"

#include <algorithm>

#include "core/error.h"
#include "data/idx.h"

namespace mt::data {

LabeledImages load_labeled_images(const std::string& images, const std::string& labels, int n_classes) {
  MT_CHECK_INPUT(!labels.empty(), "--model mlp needs a labels file for ", images, " (--labels / --val-labels)");
  IdxImages im = read_idx_images(images);
  IdxLabels lb = read_idx_labels(labels);
  MT_CHECK_INPUT((int64_t)lb.labels.size() == im.count, images, " has ", im.count, " images but ", labels, " has ",
                 lb.labels.size(), " labels");
  LabeledImages e;
  e.count = im.count;
  e.D = (int)(im.rows * im.cols);
  e.x.resize(im.pixels.size());
  for (size_t i = 0; i < im.pixels.size(); i++) e.x[i] = (float)im.pixels[i] / 255.0f;
  e.y.resize(lb.labels.size());
  for (size_t i = 0; i < lb.labels.size(); i++) {
    MT_CHECK_INPUT(lb.labels[i] < n_classes, labels, ": label ", (int)lb.labels[i], " at position ", i,
                   " is not below the number of classes ", n_classes);
    e.y[i] = lb.labels[i];
  }
  return e;
}

void LabeledImages::batch(int64_t step, int B, int first, int n, float* x_out, int32_t* y_out) const {
  for (int j = 0; j < n; j++) {
    const int64_t e = (step * B + first + j) % count;
    std::copy_n(&x[(size_t)e * D], D, &x_out[(size_t)j * D]);
    y_out[j] = y[e];
  }
}

LabeledImages LabeledImages::split_tail(int64_t keep) {
  LabeledImages tail;
  tail.D = D;
  tail.count = count - keep;
  tail.x.assign(x.begin() + keep * D, x.end());
  tail.y.assign(y.begin() + keep, y.end());
  x.resize((size_t)keep * D);
  y.resize((size_t)keep);
  count = keep;
  return tail;
}

}  // namespace mt::data
