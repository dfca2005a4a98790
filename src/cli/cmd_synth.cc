// `tessera synth`: random-weight checkpoints of the seed models (see synth/synth.h).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/presets.h"
#include "synth/synth.h"
#include "util/error.h"

namespace tessera::cli {
namespace {

std::string human_count(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", double(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.1f}M", double(n) / 1e6);
  return fmt::format("{:.1f}K", double(n) / 1e3);
}

void print_presets() {
  fmt::print("{:<14} {:<6} {:>6} {:>6} {:>8} {:>8} {:>11}   {:<30}\n", "preset", "arch", "hidden",
             "layers", "heads/kv", "head_dim", "params", "tiny (hidden, layers, heads/kv, params)");
  for (const Preset& p : presets()) {
    const ModelSpec& f = p.full;
    const ModelSpec& t = p.tiny;
    fmt::print("{:<14} {:<6} {:>6} {:>6} {:>8} {:>8} {:>11}   {}, {}, {}/{}, {}\n", p.name,
               arch_name(f.arch), f.hidden, f.n_layers, fmt::format("{}/{}", f.n_heads, f.n_kv_heads),
               f.head_dim, human_count(count_params(f)), t.hidden, t.n_layers, t.n_heads,
               t.n_kv_heads, human_count(count_params(t)));
  }
}

}  // namespace

void add_synth_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "Write a random-weight Hugging Face checkpoint with a seed model's exact config\n"
      "(or its tiny form) and its family's real tokenizer.");
  auto opts = std::make_shared<SynthOptions>();
  auto list = std::make_shared<bool>(false);
  cmd->add_flag("--list", *list, "List the presets (full and tiny shapes, parameter counts)");
  cmd->add_option("--preset", opts->preset, "Preset name, e.g. Llama-3.2-1B (see --list)");
  cmd->add_option("--out", opts->out_dir, "Output directory (new, empty, or a previous synth output)");
  cmd->add_flag("--tiny", opts->tiny, "Write the tiny form: same features, 2-4 small layers");
  cmd->add_option("--seed", opts->seed, "Seed; the same seed gives byte-identical files")
      ->default_val(0)
      // "-1" would otherwise wrap silently to 2^64 - 1.
      ->check([](const std::string& v) {
        return v.find('-') == std::string::npos ? std::string() : "the seed is a non-negative integer";
      });
  cmd->add_option("--tokenizers", opts->tokenizers_dir,
                  "Folder with llama3/ and qwen3/ tokenizer files (default: $TESSERA_TOKENIZERS "
                  "or tokenizers/ in the data search path: $TESSERA_DATA_DIR, "
                  "$XDG_DATA_HOME/tessera, <prefix>/share/tessera)");

  cmd->callback([opts, list] {
    if (*list) {
      print_presets();
      return;
    }
    if (opts->preset.empty()) fail("synth needs --preset NAME (see `tessera synth --list`)");
    if (opts->out_dir.empty()) fail("synth needs --out DIR");
    const Preset& preset = find_preset(opts->preset);
    const ModelSpec& spec = opts->tiny ? preset.tiny : preset.full;

    // Full-size models take minutes: show the share of bytes written on stderr.
    SynthProgress progress;
    int last = -1;
    if (!opts->tiny) {
      progress = [&last](uint64_t done, uint64_t total) {
        const int pct = total ? int(done * 100 / total) : 100;
        if (pct == last) return;
        last = pct;
        fmt::print(stderr, "\rsynth: {:3d}% of {:.2f} GiB", pct, double(total) / double(1 << 30));
        if (done == total) fmt::print(stderr, "\n");
        std::fflush(stderr);
      };
    }
    synth(*opts, progress);
    fmt::print("wrote {}: {}{}, {} parameters, seed {}\n", opts->out_dir, preset.name,
               opts->tiny ? " (tiny)" : "", human_count(count_params(spec)), opts->seed);
  });
}

}  // namespace tessera::cli
