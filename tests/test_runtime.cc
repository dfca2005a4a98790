// Sampling and streaming pieces of generation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "util/error.h"

namespace tessera {
namespace {

const std::vector<float> kLogits = {0.1f, 2.5f, -1.0f, 2.4f, 0.0f};

TEST(Sampler, GreedyIsArgmax) {
  Sampler s({0.0f, 0, 1.0f, 0});
  EXPECT_EQ(s.sample(kLogits), 1);
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f}), 1) << "first of ties, like torch.argmax";
}

// argmax scans 16 lanes at a time: it must still give std::max_element's index (the first
// of the largest) for every length, the maximum anywhere (the vector body or the tail), ties,
// signed zeros, all -inf, and a NaN anywhere (max_element's answer, whatever it is).
TEST(Sampler, ArgmaxIsTheFirstLargestValue) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto first_largest = [](const std::vector<float>& v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
  };
  for (const size_t n : {size_t(1), size_t(3), size_t(15), size_t(16), size_t(17), size_t(100), size_t(4099)})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> v(n);
      for (float& x : v) x = trial % 5 == 0 ? float(int(normal(rng) * 2)) : normal(rng);  // many ties
      const size_t at = rng() % n;
      if (trial % 7 == 1) v[at] = 100.0f;
      if (trial % 7 == 2) v[n - 1] = 100.0f;  // in the tail past the 16-lane body
      if (trial % 7 == 3) std::fill(v.begin(), v.end(), -INFINITY);
      if (trial % 7 == 4) v[at] = NAN;
      if (trial % 7 == 5) {
        std::fill(v.begin(), v.end(), -1.0f);
        v[at] = -0.0f;
        v[(at + 1) % n] = 0.0f;
      }
      if (trial % 7 == 6) v[0] = NAN;
      SCOPED_TRACE(fmt::format("n={} trial={}", n, trial));
      EXPECT_EQ(argmax(v), first_largest(v));
    }
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(Sampler({1.0f, 1, 1.0f, seed}).sample(kLogits), 1);
    EXPECT_EQ(Sampler({1.0f, 0, 0.01f, seed}).sample(kLogits), 1);
  }
}

TEST(Sampler, SeedReproducesAndSamplingVaries) {
  std::vector<int32_t> a, b;
  Sampler s1({1.0f, 0, 1.0f, 42}), s2({1.0f, 0, 1.0f, 42});
  for (int i = 0; i < 200; ++i) {
    a.push_back(s1.sample(kLogits));
    b.push_back(s2.sample(kLogits));
  }
  EXPECT_EQ(a, b);
  EXPECT_GT(std::count(a.begin(), a.end(), 3), 20) << "the close second is drawn too";
  EXPECT_EQ(std::count(a.begin(), a.end(), 2) + std::count(a.begin(), a.end(), 1) + std::count(a.begin(), a.end(), 3) +
                std::count(a.begin(), a.end(), 0) + std::count(a.begin(), a.end(), 4),
            200);
}

// Sampling draws from the softmax at the temperature over the candidates, as computed here
// independently (a full sort in double): 1000 tokens, so top-p's prefix needs more of the most
// likely than the first 64 the sampler sorts. Every draw is a candidate and the draws' mean id
// is the distribution's (within 5 standard errors).
TEST(Sampler, DrawsTheSoftmaxOfTheCandidates) {
  const int V = 1000;
  std::vector<float> logits(V);
  for (int i = 0; i < V; ++i) logits[size_t(i)] = float((i * 37) % V) * 0.004f;  // distinct, shuffled
  struct Case {
    float temperature;
    int top_k;
    float top_p;
  };
  for (const Case c : {Case{1.0f, 0, 1.0f}, Case{0.5f, 0, 0.9f}, Case{1.0f, 0, 0.5f}, Case{2.0f, 300, 0.95f},
                       Case{1.0f, 20, 1.0f}}) {
    SCOPED_TRACE(fmt::format("T {} top_k {} top_p {}", c.temperature, c.top_k, c.top_p));
    std::vector<int> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const size_t k = c.top_k > 0 ? size_t(c.top_k) : size_t(V);
    std::vector<double> p(k);
    double sum = 0;
    for (size_t i = 0; i < k; ++i)
      sum += p[i] = std::exp((double(logits[size_t(ids[i])]) - double(logits[size_t(ids[0])])) / c.temperature);
    size_t keep = k;
    double acc = 0;
    for (size_t i = 0; i < k && c.top_p < 1.0f; ++i)
      if ((acc += p[i] / sum) >= c.top_p) {
        keep = i + 1;
        break;
      }
    double kept = 0, mean = 0, sq = 0;
    for (size_t i = 0; i < keep; ++i) kept += p[i];
    for (size_t i = 0; i < keep; ++i) {
      mean += p[i] / kept * ids[i];
      sq += p[i] / kept * ids[i] * double(ids[i]);
    }
    const double sd = std::sqrt(sq - mean * mean);
    const std::set<int> candidates(ids.begin(), ids.begin() + long(keep));
    SamplingOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    o.top_p = c.top_p;
    o.seed = 5;
    Sampler s(o);
    const int n = 20000;
    double got = 0;
    for (int d = 0; d < n; ++d) {
      const int32_t t = s.sample(logits);
      ASSERT_TRUE(candidates.count(t)) << "token " << t << " is not among the " << keep << " candidates";
      got += t;
    }
    EXPECT_NEAR(got / n, mean, 5 * sd / std::sqrt(double(n)));
  }
}

TEST(Sampler, TopKExcludesTheRest) {
  Sampler s({5.0f, 2, 1.0f, 1});
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.sample(kLogits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, BadOptionsAreNamed) {
  EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, -3, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), Error);
}

TEST(Utf8Stream, HoldsSplitCharactersUntilComplete) {
  Utf8Stream s;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(s.push("a" + euro.substr(0, 1)), "a");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2) + "b"), euro + "b");
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, 4 bytes
  EXPECT_EQ(s.push(emoji.substr(0, 3)), "");
  EXPECT_EQ(s.flush(), emoji.substr(0, 3)) << "flush gives back what is left";
  EXPECT_EQ(s.push(emoji), emoji);
}

}  // namespace
}  // namespace tessera
