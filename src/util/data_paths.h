// Where tessera finds its data at run time. Nothing of the source tree is compiled in: data
// (the tokenizer files synth copies, the skills, the device profiles) is looked for in a
// search path of data directories, and the user's downloads (the default model, phase 0's
// references) in the user's cache directory.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace tessera {

// The running executable's directory (from /proc/self/exe); empty when it cannot be read.
std::filesystem::path executable_dir();

// The data directories, searched in this order:
//   1. each directory in $TESSERA_DATA_DIR (':'-separated);
//   2. $XDG_DATA_HOME/tessera, else ~/.local/share/tessera;
//   3. <executable dir>/../share/tessera (an install made with `cmake --install`);
//   4. in a build tree, the directories listed in <executable dir>/tessera-data-dirs.txt,
//      a file CMake writes into the build directory (one directory a line).
// Each is laid out like an install's share/tessera: tokenizers/, models/, skills/, devices/.
// Directories that do not exist are listed too (error messages name them).
std::vector<std::filesystem::path> data_dirs();

// The user's cache directory: $XDG_CACHE_HOME/tessera, else ~/.cache/tessera; empty when
// neither variable is set. scripts/setup.sh puts the default model (models/) and phase 0's
// references (references/) there.
std::filesystem::path cache_dir();

// `relative` under each data directory, in search order.
std::vector<std::filesystem::path> data_candidates(const std::filesystem::path& relative);

// The first of `candidates` that exists (a file or a directory); empty when none does.
std::filesystem::path first_existing(const std::vector<std::filesystem::path>& candidates);

// The non-empty entries of a ':'-separated list of directories (as $PATH is written).
std::vector<std::filesystem::path> split_path_list(const std::string& list);

// "a, b, c": the places searched, for error messages.
std::string list_places(const std::vector<std::filesystem::path>& places);

}  // namespace tessera
