#!/usr/bin/env bash
# Bounded fuzzing of vireo's input parsers (see docs/FUZZING.md).
#
# Installs cargo-fuzz (pinned, only when missing or another version), builds every target in
# fuzz/ with libFuzzer on the stable toolchain (release, debug assertions and overflow checks
# on, no sanitizer), then runs each target for a bounded time with a memory limit and a
# maximum input length, starting from the committed seeds (fuzz/corpus/<target>/) and the
# committed regression inputs (fuzz/regressions/<target>/, if any). New inputs go to the
# working corpus fuzz/work/<target>/ (kept between runs, not committed). Prints executions,
# coverage and corpus size per target; exits non-zero if any target crashes, panics, times
# out, exceeds its memory or allocation budget, or fails to build.
#
# Usage: scripts/fuzz.sh [--seconds N] [--target NAME]... [--max-len BYTES] [--rss-mb MB]
#                        [--no-install]
#   --seconds N   fuzzing time per target (default 30: 7 targets fit in ~4 minutes on a
#                 2-core machine once built; the first build takes ~6 minutes); 0 replays the
#                 seeds, the regression inputs and the working corpus once, without fuzzing
#   --target NAME run only this target (repeatable); default: every target
#   --no-install  do not install cargo-fuzz (fail if it is not there)
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
SECONDS_PER_TARGET=30
MAX_LEN=65536
RSS_MB=2048
INSTALL=1
TARGETS=()

while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
        --target) TARGETS+=("$2"); shift 2 ;;
        --max-len) MAX_LEN="$2"; shift 2 ;;
        --rss-mb) RSS_MB="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$SECONDS_PER_TARGET" in ''|*[!0-9]*) echo "fuzz.sh: --seconds needs a number" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.."
ROOT=$(pwd)
FUZZ="$ROOT/fuzz"

installed_version() {
    cargo fuzz --version 2>/dev/null | awk '{print $2}'
}
if [ "$(installed_version)" != "$CARGO_FUZZ_VERSION" ]; then
    if [ "$INSTALL" = 0 ]; then
        echo "fuzz.sh: cargo-fuzz $CARGO_FUZZ_VERSION is not installed" >&2
        exit 2
    fi
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

if [ ${#TARGETS[@]} -eq 0 ]; then
    mapfile -t TARGETS < <(cd "$FUZZ" && cargo fuzz list)
fi

# libFuzzer needs only stable codegen flags without a sanitizer; the code under test is safe
# Rust (the one unsafe module, libvirt FFI, is not reached by any target).
echo "== building ${#TARGETS[@]} fuzz targets"
start=$(date +%s)
(cd "$FUZZ" && cargo fuzz build --release --debug-assertions --sanitizer none)
echo "   built in $(( $(date +%s) - start )) s"

BIN="$FUZZ/target/x86_64-unknown-linux-gnu/release"
dict_for() {
    case "$1" in
        network_info|explain_input|external_event) echo "$FUZZ/dict/json.dict" ;;
        *) echo "$FUZZ/dict/xml.dict" ;;
    esac
}

failed=()
summary=()
for t in "${TARGETS[@]}"; do
    work="$FUZZ/work/$t"
    artifacts="$FUZZ/artifacts/$t"
    mkdir -p "$work" "$artifacts"
    dirs=("$work" "$FUZZ/corpus/$t")
    [ -d "$FUZZ/regressions/$t" ] && dirs+=("$FUZZ/regressions/$t")
    log="$FUZZ/artifacts/$t.log"
    if [ "$SECONDS_PER_TARGET" = 0 ]; then
        echo "== replaying the corpora of $t"
        budget=(-runs=0)
    else
        echo "== fuzzing $t for ${SECONDS_PER_TARGET} s"
        budget=(-max_total_time="$SECONDS_PER_TARGET")
    fi
    rc=0
    "$BIN/$t" "${dirs[@]}" \
        -dict="$(dict_for "$t")" \
        "${budget[@]}" \
        -max_len="$MAX_LEN" \
        -rss_limit_mb="$RSS_MB" \
        -timeout=10 \
        -print_final_stats=1 \
        -artifact_prefix="$artifacts/" \
        >"$log" 2>&1 || rc=$?
    if [ ! -f "$log" ]; then
        echo "fuzz.sh: $log is missing" >&2
        : >"$log"
        [ "$rc" != 0 ] || rc=1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n1)
    last=$(grep -E '(DONE|pulse|NEW|REDUCE|INITED) +cov:' "$log" | tail -n1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
    line=$(printf '%-15s %12s execs  cov %6s  ft %6s  corpus %-12s %s' \
        "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
        "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")
    echo "   $line"
    summary+=("$line")
    if [ "$rc" != 0 ]; then
        failed+=("$t")
        echo "---- $t: last 40 lines of $log" >&2
        tail -n 40 "$log" >&2
        ls -1 "$artifacts" >&2 || true
    fi
done

echo
echo "== fuzz summary (${SECONDS_PER_TARGET} s per target, max_len $MAX_LEN, rss limit $RSS_MB MB)"
printf '   %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz.sh: ${#TARGETS[@]} targets, no crash"
