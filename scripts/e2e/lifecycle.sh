# shellcheck shell=bash
# Starting and stopping: signals leave the interface clean, bad command lines attach nothing.

test_sigterm_and_kill_leave_the_interface_clean() { # MODE
    setup "$1"
    start_lb "$1"
    xdp_attached || fail "no program while lb runs"
    # Attached in the mode asked for: ip link says xdp for native (the driver's), xdpgeneric.
    local want=xdp
    [ "$1" = native ] || want=xdpgeneric
    [ "$(xdp_mode)" = "$want" ] || fail "--xdp-mode $1 attached the program as $(xdp_mode), not $want"
    local rc=0
    stop_lb TERM || rc=$?
    [ "$rc" -eq 0 ] || fail "SIGTERM exit status $rc"
    grep -q "SIGTERM: detached from eth0" "$WORK/lb.log" || fail "no detach line"
    if xdp_attached; then fail "program left after SIGTERM"; fi
    start_lb "$1"
    stop_lb KILL || true
    wait_until 50 0.1 xdp_detached || fail "program left after kill -9"
    say "SIGTERM: exit 0 and detached; kill -9: no stale program"
}

test_bad_command_lines_fail_clearly_and_attach_nothing() { # MODE
    setup "$1"
    chmod 755 "$WORK" && chmod 644 "$WORK/pool.yaml" # readable by the unprivileged user below
    expect_error() { # NEEDLE COMMAND...
        local needle=$1
        shift
        local out
        if out=$("$@" 2>&1); then fail "succeeded: $*"; fi
        grep -qF -- "$needle" <<<"$out" || fail "expected '$needle' from $*, got: $out"
        if xdp_attached; then fail "left a program attached: $*"; fi
    }
    expect_error "no such interface \`eth9\`" ip netns exec "$PREFIX-lb" "$LB" attach eth9 --config "$WORK/pool.yaml"
    expect_error "missing.yaml: no such file" ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/missing.yaml"
    expect_error "invalid value 'fast' for '--xdp-mode <MODE>'" ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode fast
    expect_error "lb attach needs root" ip netns exec "$PREFIX-lb" setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
        "$LB" attach eth0 --config "$WORK/pool.yaml"
    say "no such interface, missing config, bad flag, not root: each a clear error, nothing attached"
}
