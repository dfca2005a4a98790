#!/usr/bin/env bash
# Builds the libFuzzer harnesses (build-fuzz/, clang, ASan + UBSan, -O1 -g1, only the layers
# they link) and runs them.
#
#   fuzz/run.sh --smoke SECONDS   every harness for its share of SECONDS (CI); exits 1 on any
#                                 crash, leak, timeout or allocation over the limit
#   fuzz/run.sh HOURS             a campaign: every harness until 10 million executions or HOURS
#                                 hours, whichever comes first (FUZZ_RUNS=N another count; FUZZ_JOBS=N
#                                 runs N harnesses at once, default 1); each harness's result is
#                                 appended to fuzz/campaign.tsv, and docs/reliability.md is written
#                                 from that record (a campaign may run in parts, a few harnesses
#                                 at a time: FUZZ_HARNESSES)
#
# Limits for every input: -timeout=1 (s), -rss_limit_mb=2048, -malloc_limit_mb=2048.
# Seeds: fuzz/corpus/<harness>/ (read only); what a run learns goes to
# build-fuzz/fuzz-corpus/<harness>/, crashing inputs to build-fuzz/fuzz-artifacts/<harness>/.
# FUZZ_HARNESSES="gguf plan" limits a run to those harnesses.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
LIMITS=(-timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=2048)

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
mode=campaign
if [[ ${1:-} == --smoke ]]; then mode=smoke; total=${2:-}; [[ $total =~ ^[0-9]+$ ]] || usage
elif [[ ${1:-} =~ ^[0-9]*\.?[0-9]+$ ]]; then hours=$1
else usage; fi

if [[ -n ${FUZZ_HARNESSES:-} ]]; then read -r -a harnesses <<<"$FUZZ_HARNESSES"
else mapfile -t harnesses < <(cd fuzz && ls fuzz_*.cc | sed 's/^fuzz_//; s/\.cc$//'); fi

build_start=$(date +%s)
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  cmake -S . -B "$BUILD" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DTESSERA_FUZZ=ON -DTESSERA_TESTS=OFF >/dev/null || exit 1
fi
cmake --build "$BUILD" -j"${FUZZ_BUILD_JOBS:-2}" --target "${harnesses[@]/#/fuzz_}" >"$BUILD/fuzz-build.log" 2>&1 \
  || { tail -40 "$BUILD/fuzz-build.log"; echo "fuzz: build failed"; exit 1; }
echo "fuzz: harnesses built in $(( $(date +%s) - build_start )) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [[ $mode == smoke ]]; then
  each=$(( total / ${#harnesses[@]} )); (( each >= 1 )) || each=1
else
  each=$(python3 -c "print(max(1, round($hours * 3600)))")
fi

# One harness: $1 name, $2 seconds; its log in $BUILD/fuzz-logs/<name>.log.
run_one() {
  local h=$1 secs=$2
  mkdir -p "$BUILD/fuzz-corpus/$h" "$BUILD/fuzz-artifacts/$h" "$BUILD/fuzz-logs"
  local runs=()
  [[ $mode == campaign ]] && runs=(-runs="${FUZZ_RUNS:-10000000}")
  local t0 rc
  t0=$(date +%s)
  "$BUILD/fuzz/fuzz_$h" "${LIMITS[@]}" "${runs[@]}" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-artifacts/$h/" "$BUILD/fuzz-corpus/$h" "fuzz/corpus/$h" \
    >"$BUILD/fuzz-logs/$h.log" 2>&1
  rc=$?
  echo $(( $(date +%s) - t0 )) >"$BUILD/fuzz-logs/$h.secs"  # the run's wall time, for a run that stopped on a finding
  return $rc
}

# execs, edges (cov), features, seconds from a log.
stats() {
  local log=$1
  local execs cov ft t
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  cov=$(grep -oE '^#[0-9]+.*cov: [0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+' | awk '{print $2}')
  ft=$(grep -oE '^#[0-9]+.* ft: [0-9]+' "$log" | tail -1 | grep -oE 'ft: [0-9]+' | awk '{print $2}')
  t=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 | awk '{print $5}')
  # libFuzzer prints no "Done" line when it stops on a finding: the run's wall time then.
  [[ -z $t && -f ${log%.log}.secs ]] && t=$(cat "${log%.log}.secs")
  echo "${execs:-?} ${cov:-?} ${ft:-?} ${t:-?}"
}

# A timeout is wall-clock time: on a loaded machine (CI, or nice'd beside other jobs) a
# process can be starved past 1 s. True when the run's only finding is a timeout whose input,
# run again 3 times, finishes within the limit every time.
timeout_not_reproduced() {
  local h=$1 log=$BUILD/fuzz-logs/$1.log unit
  grep -q 'ERROR: libFuzzer: timeout' "$log" || return 1
  unit=$(grep -o 'Test unit written to .*' "$log" | tail -1 | sed 's/Test unit written to //')
  [[ -f $unit ]] || return 1
  local i
  for i in 1 2 3; do
    "$BUILD/fuzz/fuzz_$h" "${LIMITS[@]}" "$unit" >>"$BUILD/fuzz-logs/$h.retry.log" 2>&1 || return 1
  done
  echo "fuzz: $h: the timeout on $unit did not reproduce (3 reruns under 1 s)"
  mv "$unit" "$unit.not-reproduced"
}

failed=()
declare -A status
jobs=${FUZZ_JOBS:-1}
[[ $mode == smoke ]] && jobs=1
start=$(date +%s)
mkdir -p "$BUILD/fuzz-logs"; touch "$BUILD/fuzz-logs/.start"
for h in "${harnesses[@]}"; do
  [[ -x $BUILD/fuzz/fuzz_$h ]] || { echo "fuzz: no harness $h"; exit 2; }
  if (( jobs > 1 )); then
    while (( $(jobs -rp | wc -l) >= jobs )); do wait -n; done
    run_one "$h" "$each" & continue
  fi
  run_one "$h" "$each"
  rc=$?
  read -r execs cov ft secs <<<"$(stats "$BUILD/fuzz-logs/$h.log")"
  if (( rc != 0 )) && timeout_not_reproduced "$h"; then
    status[$h]="ok (a timeout that did not reproduce: the machine was busy)"
  elif (( rc != 0 )); then
    failed+=("$h"); status[$h]="FAILED (exit $rc)"
    grep -E 'ERROR: |SUMMARY: |Test unit written|==[0-9]+==' "$BUILD/fuzz-logs/$h.log" | head -8
  else status[$h]=ok; fi
  printf 'fuzz: %-16s %5s s  %10s execs  cov %6s  ft %6s  %s\n' "$h" "$secs" "$execs" "$cov" "$ft" "${status[$h]}"
done
if (( jobs > 1 )); then
  wait
  for h in "${harnesses[@]}"; do
    read -r execs cov ft secs <<<"$(stats "$BUILD/fuzz-logs/$h.log")"
    if grep -qE '^==[0-9]+==ERROR|^SUMMARY: |Test unit written to .*(crash|leak|timeout|oom)' "$BUILD/fuzz-logs/$h.log"; then
      failed+=("$h"); status[$h]=FAILED
    else status[$h]=ok; fi
    printf 'fuzz: %-16s %5s s  %10s execs  cov %6s  ft %6s  %s\n' "$h" "$secs" "$execs" "$cov" "$ft" "${status[$h]}"
  done
fi
echo "fuzz: ${#harnesses[@]} harnesses in $(( $(date +%s) - start )) s, ${#failed[@]} failed${failed:+: ${failed[*]}}"

if [[ $mode == campaign ]]; then
  # The record: one line per harness run (a campaign may come in parts, a few harnesses each).
  record=fuzz/campaign.tsv
  [[ -f $record ]] || printf 'date\tharness\tseconds\texecutions\tedges\tfeatures\tcrashing_inputs\tstatus\tmachine\n' >"$record"
  machine="$(nproc) cores, $(clang++ --version | head -1 | sed 's/ (.*//')"
  for h in "${harnesses[@]}"; do
    read -r execs cov ft secs <<<"$(stats "$BUILD/fuzz-logs/$h.log")"
    n=$(find "$BUILD/fuzz-artifacts/$h" -type f ! -name '*.not-reproduced' -newer "$BUILD/fuzz-logs/.start" 2>/dev/null | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%MZ)" "$h" "$secs" "$execs" "$cov" "$ft" "$n" \
      "${status[$h]%% *}" "$machine" >>"$record"
  done
  python3 fuzz/reliability.py "$record" fuzz/findings.md >docs/reliability.md
  echo "fuzz: appended to $record, wrote docs/reliability.md"
fi
(( ${#failed[@]} == 0 ))
