// The agent skills (skills/*/SKILL.md, found by Claude Code through .claude/skills): each
// has the required front matter and sections, and every command its bash blocks show runs
// and succeeds, in order, with MODEL a tiny synthesized SmolLM2-360M and WORK a scratch
// directory (one test per skill).
#include <gtest/gtest.h>

#include <regex>

#include "pipeline/diagnose.h"
#include "targets/registry.h"
#include "test_support.h"

namespace tessera {
namespace {

using namespace testing_support;
namespace fs = std::filesystem;

fs::path skills_root() { return fs::path(TESSERA_SOURCE_DIR) / "skills"; }

std::vector<std::string> skill_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(skills_root()))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The fenced ```bash blocks, in order.
std::vector<std::string> bash_blocks(const std::string& md) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = md.find("```bash\n", at)) != std::string::npos) {
    const size_t start = at + 8, end = md.find("```", start);
    if (end == std::string::npos) break;
    out.push_back(md.substr(start, end - start));
    at = end + 3;
  }
  return out;
}

TEST(Skills, ClaudeCodeFindsThem) {
  const fs::path link = fs::path(TESSERA_SOURCE_DIR) / ".claude" / "skills";
  ASSERT_TRUE(fs::exists(link));
  EXPECT_EQ(fs::canonical(link), fs::canonical(skills_root()));
  // An orchestrator, one per phase, the evaluator and adding an operator, at least.
  const std::vector<std::string> names = skill_names();
  for (const char* must : {"deploy-model", "phase0-oracle", "phase1-kernels", "phase2-block", "phase3-model",
                           "phase4-prefill-opt", "phase5-decode-opt", "phase6-integrate", "phase7-audit", "add-operator"})
    EXPECT_TRUE(std::find(names.begin(), names.end(), must) != names.end()) << must;
  // One per debug skill of the catalogue and one per optimization skill of every target.
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  for (const DebugSkill& d : debug_skills()) EXPECT_TRUE(has("debug-" + d.name)) << d.name;
  for (const std::string& t : target_names())
    if (target_def(t).skills)
      for (const OptSkill& o : target_def(t).skills()) EXPECT_TRUE(has("opt-" + o.name)) << t << " " << o.name;
}

class Skill : public ::testing::TestWithParam<std::string> {};

TEST_P(Skill, HasTheRequiredShape) {
  const std::string md = slurp(skills_root() / GetParam() / "SKILL.md");
  ASSERT_FALSE(md.empty()) << GetParam();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(md, m, std::regex("^---\nname: ([^\n]+)\ndescription: ([^\n]+)\n---\n"))) << "front matter";
  EXPECT_EQ(m[1].str(), GetParam());
  EXPECT_GT(m[2].str().size(), 40u) << "the description says what and when";
  for (const char* section : {"\n## Purpose\n", "\n## Pass criteria\n", "\n## Workflow\n", "\n## Failure modes\n",
                              "\n| Symptom | Cause | Where to look |\n", "\n## Update protocol\n"})
    EXPECT_NE(md.find(section), std::string::npos) << GetParam() << " lacks " << section;
  EXPECT_FALSE(bash_blocks(md).empty()) << "a workflow shows the exact commands";
}

TEST_P(Skill, EveryCommandRuns) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the same commands run in the Release build (CI time); the CLI paths are tested under sanitizers";
#endif
  const std::string md = slurp(skills_root() / GetParam() / "SKILL.md");
  ScratchDir work("skill_" + GetParam());
  std::string script = "set -euo pipefail\n";
  for (const std::string& b : bash_blocks(md)) script += b;
  write_file(work.path() / "workflow.sh", script);
  const std::string bin_dir = fs::path(TESSERA_BINARY).parent_path().string();
  const std::string cmd = "cd " + work.str() + " && env PATH=" + bin_dir + ":$PATH MODEL=" + tiny_model("SmolLM2-360M") +
                          " WORK=" + work.str() + " bash workflow.sh > out.txt 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << GetParam() << ": the workflow failed\n--- script\n" << script << "--- output\n" << slurp(work.path() / "out.txt");
}

INSTANTIATE_TEST_SUITE_P(AgentSkills, Skill, ::testing::ValuesIn(skill_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace tessera
