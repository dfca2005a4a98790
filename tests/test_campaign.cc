// `tessera campaign`: one row per model and target, eta_scale against Llama-3.2-1B.
#include <gtest/gtest.h>

#include "eval/campaign.h"
#include "test_support.h"
#include "util/error.h"

namespace tessera {
namespace {

using namespace testing_support;
namespace fs = std::filesystem;

TEST(Campaign, TinyPresetsOnTheCpuGiveOneRowEachAndTheReferenceScalesToOne) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "two deploys and two measurements: the Release run's (CI time); deploy is tested under sanitizers";
#endif
  ScratchDir work("campaign");
  CampaignOptions o;
  o.models = {"Llama-3.2-1B", "SmolLM2-360M"};
  o.targets = {"cpu"};
  o.work_dir = work.str();
  o.tiny = true;
  o.quiet = true;
  const CampaignResult r = run_campaign(o);
  ASSERT_EQ(r.rows.size(), 2u);
  for (const CampaignRow& row : r.rows) {
    EXPECT_TRUE(row.deployed) << row.model << ": " << row.failure;
    EXPECT_EQ(row.phases_passed, row.phases_total);
    EXPECT_EQ(row.gates_passed, row.gates_total);
    EXPECT_GT(row.gates_total, 0);
    EXPECT_GT(row.prefill_tok_s, 0);
    EXPECT_GT(row.decode_tok_s, 0);
    EXPECT_EQ(row.figures, "measured");
    EXPECT_GT(row.wall_s, 0);
    EXPECT_GT(row.parameters, 0);
  }
  EXPECT_DOUBLE_EQ(r.rows[0].eta_prefill, 1.0);  // the reference against itself
  EXPECT_DOUBLE_EQ(r.rows[0].eta_decode, 1.0);
  // eta_scale is the parameter-weighted throughput ratio, recomputed here from the row values.
  const CampaignRow &ref = r.rows[0], &s = r.rows[1];
  EXPECT_NEAR(s.eta_decode, double(s.parameters) * s.decode_tok_s / (double(ref.parameters) * ref.decode_tok_s), 1e-12);
  EXPECT_TRUE(fs::exists(work.path() / "results.md"));
  const nlohmann::json j = read_json_file(work.path() / "results.json");
  EXPECT_EQ(j["rows"].size(), 2u);
  EXPECT_NE(slurp(work.path() / "results.md").find("| SmolLM2-360M | cpu |"), std::string::npos);
}

TEST(Campaign, UnknownTargetOrNoModelsIsAnError) {
  ScratchDir work("campaign_bad");
  CampaignOptions o;
  o.work_dir = work.str();
  o.targets = {"cpu"};
  EXPECT_THROW(run_campaign(o), Error);
  o.models = {"Llama-3.2-1B"};
  o.targets = {"gpu"};
  EXPECT_THROW(run_campaign(o), Error);
  auto cli = run_tessera("campaign --models Llama-3.2-1B --targets gpu --work " + work.str("cli") + " --quiet");
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.err.find("gpu"), std::string::npos) << cli.err;
}

}  // namespace
}  // namespace tessera
