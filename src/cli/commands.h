// Each `tessera` subcommand lives in its own cmd_*.cc and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_inspect_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_dump_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_detokenize_command(CLI::App& app);
void add_deploy_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_device_command(CLI::App& app);
void add_audit_command(CLI::App& app);
void add_diagnose_command(CLI::App& app);
void add_campaign_command(CLI::App& app);
void add_kernels_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_report_command(CLI::App& app);

}  // namespace tessera::cli
