# shellcheck shell=bash
# The end-to-end suite's scheduler. Each test runs in a process of its own (scripts/e2e.sh --one)
# with its own namespaces, a time bound, and a cgroup that measures the CPU it used. Tests run
# side by side as long as their weights add up to at most E2E_CAPACITY: a test's weight (WEIGHT,
# default 50) is the share of one CPU it keeps busy, in percent, as measured; a weight of "alone",
# or one above E2E_CAPACITY, runs with nothing beside it. Tests start in the order of TESTS, the
# ones that run alone first. Each test's output is printed as one block when it ends, and the
# summary lists every test with its time and CPU, slowest first.
#
# scripts/e2e.sh sets TESTS, WEIGHT, TIMEOUTS, RETRY_ONCE, TEST_TIMEOUT and E2E_CAPACITY, then
# calls run_suite with the command line's filters.

# The cgroup that holds test N's processes (cpuacct on cgroup v1, the unified tree on v2), or
# nothing where neither can be made: the CPU column then says "-".
RUN_CG=
runner_cgroups() {
    local base
    if [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then
        base=/sys/fs/cgroup/cpuacct
    elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        base=/sys/fs/cgroup
    else
        return 0
    fi
    RUN_CG="$base/lb-e2e-$$"
    mkdir "$RUN_CG" 2>/dev/null || RUN_CG=
}

# Nanoseconds of CPU the processes of cgroup DIR have used (with those that have ended).
cg_cpu_ns() { # DIR
    if [ -f "$1/cpuacct.usage" ]; then
        cat "$1/cpuacct.usage"
    else
        awk '$1 == "usage_usec" {print $2 * 1000}' "$1/cpu.stat"
    fi
}

# The processes of cgroup DIR and of the cgroups below it (systemd-nspawn makes its own there);
# cgroup.procs reads as empty-sized: its content tells.
cg_procs() { find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null; }

# Ends whatever is left in cgroup DIR and removes it; prints what was left, if anything. A
# process still exiting (killed by the test's teardown) has 5 s to go before it counts as left.
cg_end() { # DIR
    local dir=$1 left pid
    [ -d "$dir" ] || return 0
    for _ in $(seq 1 100); do
        [ -n "$(cg_procs "$dir")" ] || break
        sleep 0.05
    done
    left=$(cg_procs "$dir" | xargs -r ps -o comm= -p 2>/dev/null | sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}')
    for _ in $(seq 1 40); do
        [ -n "$(cg_procs "$dir")" ] || break
        for pid in $(cg_procs "$dir"); do kill -9 "$pid" 2>/dev/null || true; done
        sleep 0.05
    done
    # The cgroups below it first (deepest first), then its own.
    find "$dir" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    rmdir "$dir" 2>/dev/null || true
    [ -z "$left" ] || echo "$left"
}

# Test number I (the entry "$2"), in a process of its own, within its time bound; a test of
# RETRY_ONCE that fails runs a second time (marked in $RUN/I.retried). Exits with its status.
run_job() { # I ENTRY
    local i=$1 t=$2 limit rc
    if [ -n "$RUN_CG" ]; then
        mkdir -p "$RUN_CG/$i"
        echo "$BASHPID" >"$RUN_CG/$i/cgroup.procs"
    fi
    limit=${TIMEOUTS[$t]:-$TEST_TIMEOUT}
    timeout -s TERM "$limit" "$0" --one "$t"
    rc=$?
    if [ $rc -ne 0 ] && [[ " ${RETRY_ONCE[*]} " == *" $t "* ]]; then
        echo "   failed once; a second run decides (RETRY_ONCE in scripts/e2e.sh says why)"
        touch "$RUN/$i.retried"
        timeout -s TERM "$limit" "$0" --one "$t"
        rc=$?
    fi
    [ $rc -ne 124 ] || echo "   timed out after ${limit}s"
    exit $rc
}

# The weight of ENTRY: WEIGHT's value for the longest key it begins with, 50 if none; "alone"
# and any weight above E2E_CAPACITY are E2E_CAPACITY + 1.
weight_of() { # ENTRY
    local k w=50 len=0
    # shellcheck disable=SC2153 # WEIGHT is scripts/e2e.sh's
    for k in "${!WEIGHT[@]}"; do
        if [[ "$1" == "$k"* ]] && [ ${#k} -gt "$len" ]; then
            w=${WEIGHT[$k]}
            len=${#k}
        fi
    done
    if [ "$w" = alone ] || [ "$w" -gt "$E2E_CAPACITY" ]; then w=$((E2E_CAPACITY + 1)); fi
    echo "$w"
}

# The network namespaces by name (those `ip netns add` made), sorted.
netns_names() { find /run/netns -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort; }

# Seconds with one decimal from milliseconds.
secs() { echo "$(($1 / 1000)).$(($1 % 1000 / 100))"; }

declare -A JOB_OF JOB_STARTED
RUNNING=0
# The weights of the tests running now, added up.
BUSY=0
PASSED=0
FAILED=()
RETRIED=()
RESULTS=()

# The runner was interrupted (Ctrl-C, or its own time bound): each running test is ended as its
# time bound would end it (TERM, so that its trap tears its topology down), given 15 s, then
# whatever is left in its cgroup is killed and the cgroups removed.
runner_interrupted() {
    local pid i
    trap - INT TERM
    echo "e2e: interrupted; ending the $RUNNING running tests" >&2
    for pid in "${!JOB_OF[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 150); do
        [ -n "$(jobs -pr)" ] || break
        sleep 0.1
    done
    if [ -n "$RUN_CG" ]; then
        for i in "${JOB_OF[@]}"; do cg_end "$RUN_CG/$i" >/dev/null; done
    fi
    exit 130
}

job_start() { # I
    local i=$1
    run_job "$i" "${SELECTED[$i]}" >"$RUN/$i.log" 2>&1 &
    JOB_OF[$!]=$i
    JOB_STARTED[$i]=$(date +%s%N)
    RUNNING=$((RUNNING + 1))
    BUSY=$((BUSY + WEIGHTS[i]))
}

# Waits for any running test to end and reports it: its output, its status, time and CPU.
job_reap() {
    local pid rc=0 i t ms cpu="-" left="" status
    wait -n -p pid || rc=$?
    i=${JOB_OF[$pid]}
    unset "JOB_OF[$pid]"
    RUNNING=$((RUNNING - 1))
    BUSY=$((BUSY - WEIGHTS[i]))
    t=${SELECTED[$i]}
    ms=$((($(date +%s%N) - JOB_STARTED[$i]) / 1000000))
    if [ -n "$RUN_CG" ] && [ -d "$RUN_CG/$i" ]; then
        cpu=$(secs $(($(cg_cpu_ns "$RUN_CG/$i") / 1000000)))
        left=$(cg_end "$RUN_CG/$i")
    fi
    echo "== ${t/ / (}):"
    cat "$RUN/$i.log"
    if [ -n "$left" ]; then
        echo "   left processes running: $left"
        [ $rc -ne 0 ] || rc=1
    fi
    if [ $rc -eq 0 ]; then
        status=ok
        PASSED=$((PASSED + 1))
    else
        status=FAILED
        FAILED+=("$t")
    fi
    [ ! -f "$RUN/$i.retried" ] || RETRIED+=("$t")
    echo "   $status ($(secs "$ms")s, cpu ${cpu}s)"
    RESULTS+=("$ms $(printf '%8ss %7ss  %-6s %s' "$(secs "$ms")" "$cpu" "$status" "$t")")
}

# SELECTED: the entries of TESTS that contain one of FILTERS (all without filters) and, when
# E2E_MODES is set, whose mode (the first argument) is one of its words.
select_tests() { # [FILTERS...]
    local t f match
    SELECTED=()
    for t in "${TESTS[@]}"; do
        if [ -n "${E2E_MODES:-}" ]; then
            f=${t#* }
            [[ " $E2E_MODES " == *" ${f%% *} "* ]] || continue
        fi
        if [ $# -gt 0 ]; then
            match=0
            for f in "$@"; do [[ "$t" == *"$f"* ]] && match=1; done
            [ $match = 1 ] || continue
        fi
        SELECTED+=("$t")
    done
}

# Runs every test whose entry contains one of FILTERS (all without filters): first those that
# run alone, one by one, then the others side by side as their weights allow, each group in the
# order of TESTS, a later test starting first when it fits and an earlier one does not yet. Exit
# status 0 when all passed.
run_suite() { # [FILTERS...]
    local t i started netns_before leaked
    select_tests "$@"
    WEIGHTS=()
    for t in "${SELECTED[@]}"; do WEIGHTS+=("$(weight_of "$t")"); done
    RUN=$(mktemp -d /tmp/lb-e2e-run.XXXXXX)
    runner_cgroups
    # shellcheck disable=SC2064 # the directories are fixed now
    trap "rm -rf '$RUN'; [ -z '$RUN_CG' ] || rmdir '$RUN_CG' 2>/dev/null" EXIT
    trap runner_interrupted INT TERM
    if [ ${#SELECTED[@]} -eq 0 ]; then
        echo "e2e: no test's name contains any of: $*${E2E_MODES:+ (in mode $E2E_MODES)}" >&2
        return 2
    fi
    netns_before=$(netns_names)
    started=$(date +%s%N)
    echo "e2e: ${#SELECTED[@]} tests, side by side up to $E2E_CAPACITY% of a CPU in all (those that need the machine alone first, by themselves)"
    [ -n "$RUN_CG" ] || echo "e2e: no cgroup could be made here: the tests' CPU is not measured, nor what processes they leave behind"
    for i in "${!SELECTED[@]}"; do
        [ "${WEIGHTS[$i]}" -gt "$E2E_CAPACITY" ] || continue
        job_start "$i"
        job_reap
    done
    # The others: whenever room is free, the first waiting test that fits starts (a long one that
    # does not fit yet does not hold back the short ones behind it).
    local waiting=() rest
    for i in "${!SELECTED[@]}"; do
        [ "${WEIGHTS[$i]}" -gt "$E2E_CAPACITY" ] || waiting+=("$i")
    done
    while [ ${#waiting[@]} -gt 0 ]; do
        rest=()
        for i in "${waiting[@]}"; do
            if [ $((BUSY + WEIGHTS[i])) -le "$E2E_CAPACITY" ]; then job_start "$i"; else rest+=("$i"); fi
        done
        waiting=(${rest[@]+"${rest[@]}"})
        # Room is made only by a test that ends (with none running, every waiting test fits).
        [ ${#waiting[@]} -eq 0 ] || job_reap
    done
    while [ "$RUNNING" -gt 0 ]; do job_reap; done
    local ms sum=0 r
    ms=$((($(date +%s%N) - started) / 1000000))
    for r in "${RESULTS[@]}"; do sum=$((sum + ${r%% *})); done
    # Namespaces the run made and did not remove: a teardown that missed something.
    leaked=$(comm -13 <(echo "$netns_before") <(netns_names) | tr '\n' ' ')
    echo
    echo "e2e: each test's time and CPU, slowest first:"
    printf '%s\n' "${RESULTS[@]}" | sort -rn | cut -d' ' -f2-
    echo "e2e: $PASSED passed, ${#FAILED[@]} failed in $(secs "$ms") s (up to $E2E_CAPACITY% of a CPU at once; the tests' own times add up to $(secs "$sum") s)"
    for t in "${RETRIED[@]}"; do echo "  failed once, then ran again: $t"; done
    for t in "${FAILED[@]}"; do echo "  failed: $t"; done
    if [ -n "$leaked" ]; then
        echo "  namespaces left behind: $leaked"
        return 1
    fi
    [ ${#FAILED[@]} -eq 0 ]
}
