// tessera: deploy decoder-only LLMs onto spatial NPUs and the host CPU, gated by an FP32 oracle.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include "cli/commands.h"
#include "targets/cpu/kernels.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: deploy decoder-only LLMs onto spatial NPUs and the host CPU,\n"
               "every step checked against an FP32 oracle."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera " TESSERA_VERSION);
  tessera::cli::add_inspect_command(app);
  tessera::cli::add_synth_command(app);
  tessera::cli::add_dump_command(app);
  tessera::cli::add_run_command(app);
  tessera::cli::add_chat_command(app);
  tessera::cli::add_tokenize_command(app);
  tessera::cli::add_detokenize_command(app);
  tessera::cli::add_deploy_command(app);
  tessera::cli::add_bench_command(app);
  tessera::cli::add_convert_command(app);
  tessera::cli::add_quantize_command(app);
  tessera::cli::add_device_command(app);
  tessera::cli::add_profile_command(app);
  tessera::cli::add_audit_command(app);
  tessera::cli::add_diagnose_command(app);
  tessera::cli::add_campaign_command(app);
  tessera::cli::add_kernels_command(app);
  tessera::cli::add_perplexity_command(app);
  tessera::cli::add_serve_command(app);
  tessera::cli::add_report_command(app);
  try {
    // The cpu kernels' instruction set, for comparisons (amx, avx512bf16, AVX2, scalar, ...).
    tessera::cpu::set_isa(tessera::cpu::isa_from_environment());
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    fmt::print(stderr, "tessera: error: {}\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A file operation the OS refused (a full disk, a read-only directory): what, where, why.
    fmt::print(stderr, "tessera: error: {}{}: {}\n", e.path1().string(), e.path2().empty() ? "" : " -> " + e.path2().string(),
               e.code().message());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
