// Phase 0's independent reference: where it is looked for, how a checkpoint is matched to
// one (by content), and what the reference's texts say about the tokenizer.
#include "pipeline/reference.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "pipeline/deployment.h"
#include "util/data_paths.h"
#include "util/sha256.h"

namespace tessera {

namespace fs = std::filesystem;

std::vector<std::string> reference_search_path() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TESSERA_REFERENCES"); env && *env)
    for (const fs::path& p : split_path_list(env)) out.push_back(p.string());
  if (const fs::path cache = cache_dir(); !cache.empty()) out.push_back((cache / "references").string());
  return out;
}

namespace {

// The checkpoint's digest as tools/reference/make_reference.py computes it: a GGUF file's, or
// a directory's single model.safetensors's sha256; for shards, the sha256 of the lines
// "<name> <sha256>\n" over its *.safetensors files sorted by name.
std::string checkpoint_digest(const Model& model, const std::vector<fs::path>& shards) {
  if (model.format() == "gguf") return sha256_file_hex(model.path());
  if (shards.size() == 1 && shards[0].filename() == "model.safetensors") return sha256_file_hex(shards[0].string());
  std::string lines;
  for (const fs::path& f : shards) lines += f.filename().string() + " " + sha256_file_hex(f.string()) + "\n";
  return sha256_hex(lines);
}

}  // namespace

// References made with transformers (tools/reference) identify their checkpoint by
// SHA-256; a cheap pre-filter (the file name, the synth marker, or the weight files' names
// and sizes) avoids hashing a multi-GB model that no reference could match.
std::optional<FixtureMatch> find_fixture(const Model& model, const std::vector<fs::path>& roots, std::string* why) {
  const fs::path mpath(model.path());
  std::vector<fs::path> shards;  // a directory's weight files, sorted
  std::map<std::string, uintmax_t> sizes;
  nlohmann::json marker;
  if (model.format() != "gguf") {
    for (const auto& e : fs::directory_iterator(mpath))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path());
    std::sort(shards.begin(), shards.end());
    for (const fs::path& f : shards) sizes[f.filename().string()] = fs::file_size(f);
    if (fs::exists(mpath / "tessera_synth.json")) marker = read_json_file(mpath / "tessera_synth.json");
  }
  std::string digest;
  std::vector<fs::path> candidates;
  for (const fs::path& root : roots) {
    std::error_code ec;
    if (fs::exists(root / "fixture.json")) candidates.push_back(root);
    else if (fs::is_directory(root, ec))
      for (const auto& e : fs::directory_iterator(root, ec))
        if (fs::exists(e.path() / "fixture.json")) candidates.push_back(e.path());
  }
  std::sort(candidates.begin(), candidates.end());
  for (const fs::path& dir : candidates) {
    nlohmann::json fx = read_json_file(dir / "fixture.json");
    const nlohmann::json& src = fx["source"];
    // A cheap pre-filter before hashing a checkpoint of gigabytes: the file name, the synth
    // marker, or the weight files' names and sizes must agree.
    bool candidate = false;
    if (src.contains("gguf")) candidate = model.format() == "gguf" && mpath.filename() == src["gguf"].get<std::string>();
    else if (model.format() == "gguf") candidate = false;
    else if (src.contains("files")) candidate = src["files"].get<std::map<std::string, uintmax_t>>() == sizes;
    else if (!marker.is_null())
      candidate = marker.value("preset", "") == src.value("preset", "") && marker.value("tiny", false) == src.value("tiny", false) &&
                  marker.value("seed", -1) == src.value("seed", -2);
    if (!candidate || (model.format() != "gguf" && shards.empty())) continue;
    if (digest.empty()) digest = checkpoint_digest(model, shards);
    if (digest == fx.value("checkpoint_sha256", "")) return FixtureMatch{dir, fx};
  }
  std::vector<std::string> names;
  for (const fs::path& r : roots) names.push_back(r.string());
  *why = fmt::format("no reference for this checkpoint in {} (tools/reference/make_reference.py makes one)",
                     names.empty() ? std::string("the search path (empty)") : fmt::format("{}", fmt::join(names, ", ")));
  return std::nullopt;
}

std::vector<TokenizedDifferently> tokenized_differently(const Tokenizer& tok, const nlohmann::json& fixture) {
  std::vector<TokenizedDifferently> out;
  for (const auto& p : fixture.at("prompts")) {
    TokenizedDifferently d{p.at("text").get<std::string>(), {}, p.at("ids").get<std::vector<int32_t>>()};
    d.ours = tok.encode(d.text);
    if (d.ours != d.theirs) out.push_back(std::move(d));
  }
  return out;
}

}  // namespace tessera
