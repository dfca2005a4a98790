// The run-time search path (util/data_paths.h): the data directories' order, the cache
// directory, the default model and synth's tokenizer folder found through them, and errors
// that name every place searched. (The relocatable install itself: tests/install_test.sh.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "model/default_model.h"
#include "synth/synth.h"
#include "util/data_paths.h"
#include "util/error.h"
#include "test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Sets the variables a test names (empty: unset) and restores them afterwards.
class Env {
 public:
  void set(const std::string& name, const std::string& value) {
    const char* old = std::getenv(name.c_str());
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    if (value.empty()) ::unsetenv(name.c_str());
    else ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~Env() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A clean environment: HOME in `home`, no XDG or TESSERA_ variable.
void isolate(Env& env, const fs::path& home) {
  env.set("HOME", home.string());
  for (const char* v : {"XDG_DATA_HOME", "XDG_CACHE_HOME", "TESSERA_DATA_DIR", "TESSERA_DEFAULT_MODEL", "TESSERA_TOKENIZERS"})
    env.set(v, "");
}

TEST(DataPaths, OrderIsOverridesThenUserThenInstallThenBuildTree) {
  testing_support::ScratchDir tmp("data_paths");
  Env env;
  isolate(env, tmp.path() / "home");
  env.set("TESSERA_DATA_DIR", "/a:/b");
  const std::vector<fs::path> dirs = data_dirs();
  ASSERT_GE(dirs.size(), 4u);
  EXPECT_EQ(dirs[0], fs::path("/a"));
  EXPECT_EQ(dirs[1], fs::path("/b"));
  EXPECT_EQ(dirs[2], tmp.path() / "home" / ".local" / "share" / "tessera");
  // The test binary sits in the build directory: <build>/../share/tessera, then what
  // CMake's tessera-data-dirs.txt lists (the build tree's links into the source tree).
  const fs::path exe_dir = executable_dir();
  ASSERT_FALSE(exe_dir.empty());
  EXPECT_EQ(dirs[3], (exe_dir.parent_path() / "share" / "tessera").lexically_normal());
  if (fs::exists(exe_dir / "tessera-data-dirs.txt")) {
    ASSERT_GE(dirs.size(), 5u);
    EXPECT_EQ(fs::weakly_canonical(dirs[4]), fs::weakly_canonical(exe_dir / "share" / "tessera"));
  }

  env.set("XDG_DATA_HOME", "/xdg-data");
  EXPECT_EQ(data_dirs()[2], fs::path("/xdg-data/tessera"));
}

TEST(DataPaths, CacheDirFollowsXdgThenHome) {
  Env env;
  isolate(env, "/home/someone");
  EXPECT_EQ(cache_dir(), fs::path("/home/someone/.cache/tessera"));
  env.set("XDG_CACHE_HOME", "/xdg-cache");
  EXPECT_EQ(cache_dir(), fs::path("/xdg-cache/tessera"));
  env.set("XDG_CACHE_HOME", "");
  env.set("HOME", "");
  EXPECT_TRUE(cache_dir().empty());
}

TEST(DataPaths, DefaultModelComesFromTheCacheThenTheDataDirs) {
  testing_support::ScratchDir tmp("default_model");
  Env env;
  isolate(env, tmp.path() / "home");
  env.set("TESSERA_DATA_DIR", tmp.str("data"));
  const fs::path cached = tmp.path() / "home" / ".cache" / "tessera" / "models" / kDefaultModelFile;
  const fs::path in_data = tmp.path() / "data" / "models" / kDefaultModelFile;
  const std::vector<std::string> c = default_model_candidates();
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0], cached.string());
  EXPECT_EQ(c[1], in_data.string());

  fs::create_directories(in_data.parent_path());
  std::ofstream(in_data) << "x";
  EXPECT_EQ(default_model_path(), in_data.string());
  fs::create_directories(cached.parent_path());
  std::ofstream(cached) << "x";
  EXPECT_EQ(default_model_path(), cached.string());
  EXPECT_EQ(resolve_model_path(""), cached.string());

  env.set("TESSERA_DEFAULT_MODEL", "/elsewhere/model.gguf");
  EXPECT_EQ(default_model_candidates(), std::vector<std::string>{"/elsewhere/model.gguf"});
}

TEST(DataPaths, AMissingDefaultModelNamesEveryPlaceSearched) {
  testing_support::ScratchDir tmp("no_model");
  Env env;
  isolate(env, tmp.path() / "home");
  env.set("TESSERA_DATA_DIR", tmp.str("data"));
  try {
    const std::string found = resolve_model_path("");
    // The build tree's models/ (through tessera-data-dirs.txt) holds it once setup.sh ran;
    // InstallRelocatable checks this error with an installed binary.
    GTEST_SKIP() << "the default model was found at " << found << " (the build tree's data)";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& place : default_model_candidates())
      EXPECT_NE(msg.find(place), std::string::npos) << place << " not in: " << msg;
    EXPECT_NE(msg.find("scripts/setup.sh"), std::string::npos) << msg;
  }
}

TEST(DataPaths, SynthFindsTokenizersInADataDirAndNamesEveryPlaceWhenMissing) {
  testing_support::ScratchDir tmp("synth_tok");
  Env env;
  isolate(env, tmp.path() / "home");
  // Only the directories given: the build tree's own data would find the real tokenizers.
  env.set("TESSERA_TOKENIZERS", tmp.str("nowhere"));
  SynthOptions o;
  o.preset = "Qwen3-0.6B";
  o.tiny = true;
  o.out_dir = tmp.str("out");
  try {
    synth(o);
    FAIL() << "synth without tokenizer files succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((tmp.path() / "nowhere" / "qwen3").string()), std::string::npos) << e.what();
  }

  // A data directory holding tokenizers/qwen3/ (copied from the shared data) is found.
  const fs::path shared = fs::path(TESSERA_TOKENIZERS_DIR) / "qwen3";
  if (!fs::exists(shared)) GTEST_SKIP() << shared << " is missing";
  fs::create_directories(tmp.path() / "data" / "tokenizers");
  fs::copy(shared, tmp.path() / "data" / "tokenizers" / "qwen3", fs::copy_options::recursive);
  env.set("TESSERA_TOKENIZERS", "");
  env.set("TESSERA_DATA_DIR", tmp.str("data"));
  synth(o);
  EXPECT_TRUE(fs::exists(tmp.path() / "out" / "tokenizer.json"));
}

}  // namespace
}  // namespace tessera
