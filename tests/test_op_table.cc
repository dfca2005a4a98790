// The op table: one row per op drives phase 1, phase 6's re-check, `tessera inspect` and
// `tessera kernels`; a row added to it is gated with no other change.
#include <gtest/gtest.h>

#include "oracle/emulate.h"
#include "oracle/ops.h"
#include "pipeline/deploy.h"
#include "pipeline/op_table.h"
#include "test_support.h"

namespace tessera {
namespace {

using namespace testing_support;

// A new op, as the add-operator skill adds one: the final norm at the decode shape (one
// row), with its needs, its cases, its twin and its emulation.
OpRow decode_final_norm_row() {
  OpRow row;
  row.op = "final_norm_decode";
  row.what = "the final norm on one row (added by a test)";
  row.stages = {Stage::FinalNorm};
  row.needs = [](const ModelSpec& s) {
    return std::vector<KernelNeed>{{"rmsnorm", "final_norm decode", fmt::format("[1,{}]", s.hidden)}};
  };
  row.cases = [](const OpInputs& in) {
    const ModelSpec& s = in.model->spec();
    const int64_t H = s.hidden;
    auto x = std::make_shared<std::vector<float>>(in.at("out").end() - H, in.at("out").end());
    auto w = std::make_shared<std::vector<float>>(in.model->get("model.norm.weight").to_f32());
    OpCase c;
    c.kernel = "rmsnorm";
    c.stage = Stage::FinalNorm;
    c.tokens = 1;
    OpOutput o{"final_norm decode", fmt::format("[1,{}]", H), 1, H, std::vector<float>(size_t(H))};
    oracle::rmsnorm(x->data(), w->data(), o.ref.data(), 1, H, s.rms_eps);
    c.outputs.push_back(o);
    c.run = [x](StagedRunner& t, const std::vector<float*>& out) { t.op_rmsnorm(Stage::FinalNorm, -1, x->data(), 1, out[0]); };
    const double eps = s.rms_eps;
    c.emulate = [x, w, H, eps](const oracle::Numerics& num, std::vector<std::vector<int64_t>>& cols) {
      std::vector<float> y(static_cast<size_t>(H));
      oracle::emulated::rmsnorm(num, x->data(), w->data(), y.data(), 1, H, eps);
      cols = {oracle::emulated::sample_columns(H, H)};
      return std::vector<std::vector<float>>{y};
    };
    return std::vector<OpCase>{c};
  };
  return row;
}

TEST(OpTable, AddedRowIsGatedInPhase1) {
#ifdef TESSERA_SANITIZED
  GTEST_SKIP() << "the Release run's (two whole deploys; the op table's code runs in every deploy under sanitizers)";
#endif
  op_table().push_back(decode_final_norm_row());
  struct Restore {
    ~Restore() { op_table().pop_back(); }
  } restore;
  for (const char* target : {"cpu", "npusim"}) {
    ScratchDir out(std::string("optable_") + target);
    DeployOptions o = deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"));
    o.target = target;
    ASSERT_TRUE(deploy(o).pass) << target;
    const nlohmann::json rec = read_json_file(out.path() / "dep" / "phase1.json");
    bool found = false;
    for (const auto& k : rec["details"]["kernels"])
      if (k["op"] == "final_norm_decode") {
        found = true;
        EXPECT_TRUE(k["pass"].get<bool>()) << k.dump();
        EXPECT_GT(k["limits"]["nmse"].get<double>(), 0) << k.dump();
      }
    EXPECT_TRUE(found) << target << ": " << rec["details"]["kernels"].dump();
    // The same row in `tessera inspect`'s list (from the spec alone) and in phase 6's re-check.
    const std::vector<KernelNeed> needs = op_table_needs(Model::open(o.model_path).spec());
    EXPECT_TRUE(std::any_of(needs.begin(), needs.end(), [](const KernelNeed& k) { return k.role == "final_norm decode"; }));
    const nlohmann::json six = read_json_file(out.path() / "dep" / "phase6.json");
    EXPECT_NE(six.dump().find("final_norm decode"), std::string::npos);
  }
}

// `tessera kernels DIR` lists every row the frozen plan runs, the fused ones named, with
// expected and measured error and the limit; a model and a target work too, and a
// perturbation makes it exit 3.
TEST(OpTable, KernelsCommandListsTheFrozenPlansRows) {
  ScratchDir out("kernels_cmd");
  ASSERT_TRUE(deploy(deploy_options(tiny_model("SmolLM2-360M"), out.str("dep"))).pass);
  const CliResult r = run_tessera("kernels " + out.str("dep"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("gemm | q_proj (fused q\\|k\\|v)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm | gate_proj (fused gate\\|up)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| expected nmse | measured nmse | nmse limit |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 0 failed"), std::string::npos) << r.out;
  const CliResult npu = run_tessera("kernels " + tiny_model("SmolLM2-360M") + " --target npusim --mode perf --repeats 1 --json");
  ASSERT_EQ(npu.exit_code, 0) << npu.err;
  const nlohmann::json j = nlohmann::json::parse(npu.out);
  EXPECT_EQ(j["target"], "npusim");
  EXPECT_GE(j["rows"].size(), 31u);
  for (const auto& row : j["rows"]) {
    EXPECT_TRUE(row["pass"].get<bool>()) << row.dump();
    EXPECT_TRUE(row.contains("expected") && row.contains("metrics") && row.contains("limits")) << row.dump();
    EXPECT_GT(row.value("seconds", 0.0), 0) << row.dump();
  }
  const CliResult bad = run_tessera("kernels " + out.str("dep") + " --perturb rope:gain:0.01");
  EXPECT_EQ(bad.exit_code, 3) << bad.out;
}

}  // namespace
}  // namespace tessera
