# shellcheck shell=bash
# The Debian package (scripts/package.sh) as an operator meets it: lintian's findings; a fresh
# Debian root (debootstrap, no Rust toolchain) that installs, removes and purges it leaving
# nothing behind; and the unit under a real systemd, booted in that root by systemd-nspawn
# inside the test's lb namespace: it serves as user lb with only its three capabilities,
# `systemctl restart` under traffic breaks no connection, `systemctl stop` leaves nothing
# attached. Beside it, a plane an operator pinned by hand at the default --pin-dir is never
# the unit's or the package's: they neither give it to user lb nor detach it, and a purge
# that leaves pins of user lb's keeps the user.
#
# This machine's PID 1 is not systemd; systemd-nspawn --boot runs one as PID 1 of its own PID
# and mount namespaces. Two things a systemd host has and a container does not are given to it:
# the capabilities and system calls the unit keeps for lb (a container's bounding set and
# seccomp filter drop CAP_BPF, CAP_PERFMON and bpf()), and a bpffs at /sys/fs/bpf (systemd
# mounts one at boot on a host; nspawn does not).

# lintian findings the package keeps, each with its reason (docs/operating.md, "The package").
LINTIAN_KNOWN="bogus-mail-host bogus-mail-host-in-debian-changelog"
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

package_teardown() {
    # Every step may fail (the container may be gone), and the tests run under set -e.
    if [ -n "${NSPAWN:-}" ]; then
        if [ -n "${LEADER:-}" ]; then kill -s SIGRTMIN+4 "$LEADER" 2>/dev/null || true; fi
        wait_until 100 0.1 nspawn_gone || kill -9 "$NSPAWN" 2>/dev/null || true
        wait "$NSPAWN" 2>/dev/null || true
    fi
    # The cgroups nspawn made and left (nspawn_cgroups); they go once the kernel has seen their
    # last process out, a few tenths of a second after nspawn ended.
    local d
    for d in ${NSPAWN_CGROUPS:-}; do
        for _ in $(seq 1 50); do
            [ -d "$d" ] || break
            find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || sleep 0.1
        done
    done
    if [ -n "${PINS:-}" ]; then
        umount "$WORK/root/sys/fs/bpf" 2>/dev/null || true
        local plane
        for plane in lb-unit:eth0 lb:eth0 lb:hand0; do
            ip netns exec "$PREFIX-lb" "$LB" detach "${plane#*:}" --pin-dir "$PINS/${plane%:*}" >/dev/null 2>&1 || true
        done
        umount "$PINS" 2>/dev/null || true
        rmdir "$PINS" 2>/dev/null || true
    fi
}

nspawn_gone() { ! kill -0 "$NSPAWN" 2>/dev/null; }

# nspawn --keep-unit makes payload and supervisor cgroups below this process's own in the unified
# hierarchy (its root, on a host whose PID 1 is not systemd) and leaves them behind: those of the
# two that do not exist yet are the teardown's to remove (NSPAWN_CGROUPS).
nspawn_cgroups() {
    local unified=/sys/fs/cgroup own d
    [ -f "$unified/cgroup.controllers" ] || unified=/sys/fs/cgroup/unified
    own=$(awk -F: '$1 == 0 {print $3}' /proc/self/cgroup)
    NSPAWN_CGROUPS=
    for d in "$unified${own%/}/payload" "$unified${own%/}/supervisor"; do
        [ -e "$d" ] || NSPAWN_CGROUPS+=" $d"
    done
}

# A command inside the booted root: its mount, PID, network and other namespaces.
in_box() { nsenter -t "$LEADER" -a "$@"; }

box_running() {
    local s
    s=$(in_box systemctl is-system-running 2>/dev/null) || true
    [ "$s" = running ] || [ "$s" = degraded ]
}

# lb.service's journal holds at least COUNT (1) lines matching PATTERN.
journal_has() { # PATTERN [COUNT]
    [ "$(in_box journalctl -u lb --no-pager | grep -c "$1")" -ge "${2:-1}" ]
}

# The journal's last lines, for a failure.
journal_tail() { in_box journalctl -u lb --no-pager | tail -20 >&2; }

unit_is() { [ "$(in_box systemctl is-active lb 2>/dev/null)" = "$1" ]; }

# After WHAT (a stop, a removal, a shutdown): no program on eth0 and no pin left in the unit's
# directory (/sys/fs/bpf/lb-unit in the booted root, whose /sys/fs/bpf is $PINS).
plane_gone() { # WHAT
    wait_until 100 0.05 xdp_detached || fail "$1 left the program attached"
    [ -z "$(find "$PINS/lb-unit" -mindepth 1 2>/dev/null)" ] || fail "$1 left pins: $(find "$PINS/lb-unit" -mindepth 1 | head -3)"
}

# An operator's `lb attach IFACE --pin` as root in the booted root, at the default --pin-dir
# (/sys/fs/bpf/lb), ended once it serves: its plane stays attached and pinned with no
# controller, as lb leaves it.
hand_attach() { # IFACE CONFIG XDP-MODE
    # shellcheck disable=SC2016 # expanded by the root's sh
    in_box sh -c '
        : >/tmp/hand.log
        lb attach "$1" --config "$2" --xdp-mode "$3" --resolve-timeout 0.1 --pin >>/tmp/hand.log 2>&1 &
        p=$!
        for _ in $(seq 1 200); do grep -q "serving;" /tmp/hand.log && break; kill -0 $p 2>/dev/null || break; sleep 0.05; done
        kill $p 2>/dev/null; wait $p
        grep -q "left the data plane" /tmp/hand.log || { cat /tmp/hand.log >&2; exit 1; }' sh "$@"
}

# After WHAT, the operator's plane on hand0 is still attached, its pins where lb put them
# (/sys/fs/bpf/lb/NS/hand0) and every one owned by UID:GID.
hand_serves() { # WHAT UID:GID
    ip -n "$PREFIX-lb" -d link show dev hand0 | grep -q 'prog/xdp' || fail "$1 detached the plane an operator pinned on hand0"
    compgen -G "$PINS/lb/net*/hand0/link" >/dev/null || fail "$1 removed the pins of the operator's plane on hand0"
    local other
    other=$(find "$PINS"/lb/net*/hand0 \( ! -uid "${2%:*}" -o ! -gid "${2#*:}" \) -printf '%p %U:%G\n' | head -3)
    [ -z "$other" ] || fail "$1 changed the owner of the operator's pins on hand0 (not $2): $other"
}

# The paths of ROOT's files, with mode and owner, for the before and after of a purge. dpkg's
# own records and logs change by design and are left out.
root_files() { # ROOT
    (cd "$1" && find . -xdev -printf '%p %m %u:%g\n' | grep -Ev '^\./(var/lib/dpkg|var/lib/apt|var/cache/apt|var/cache/man|var/log|var/cache/debconf|tmp)/|^\./etc/(passwd|group|shadow|gshadow)- ' | sort)
    # The user and group databases by content: a purge that left a line of lb's would show here.
    (cd "$1" && sha256sum etc/passwd etc/group etc/shadow etc/gshadow)
}

test_package_installs_on_fresh_debian_runs_under_systemd_and_purges_clean() { # MODE
    local mode=$1 deb root uid gid caps want_caps before
    # The package's tools (lintian, debootstrap, systemd-container, cargo-deb) are installed, and
    # the package made from this build (scripts/package.sh --no-build), when the test runs, unless LB_DEB
    # names a package. (cargo-deb compiles for half a minute the first time: at full priority,
    # since this test, the longest, sets the suite's pace; at the lowest, the tests beside it
    # starved it and the suite took a minute longer.)
    scripts/setup.sh package >"/tmp/lb-package-setup.$$.log" 2>&1 || { cat "/tmp/lb-package-setup.$$.log" >&2; rm -f "/tmp/lb-package-setup.$$.log"; fail "scripts/setup.sh package"; }
    rm -f "/tmp/lb-package-setup.$$.log"
    if [ -n "${LB_DEB:-}" ]; then
        deb=$LB_DEB
    else
        # The package holds target/release/lb as built, not rebuilt here while other tests run it.
        cmp -s "$LB" target/release/lb || fail "the package is made from target/release/lb, and LB names another ($LB): set LB_DEB"
        scripts/package.sh --no-build >"/tmp/lb-package.$$.log" 2>&1 || { cat "/tmp/lb-package.$$.log" >&2; rm -f "/tmp/lb-package.$$.log"; fail "scripts/package.sh --no-build"; }
        deb=$(tail -1 "/tmp/lb-package.$$.log")
        rm -f "/tmp/lb-package.$$.log"
        [ -f "$deb" ] || fail "scripts/package.sh made no package: $deb"
    fi
    for t in lintian debootstrap systemd-nspawn; do
        command -v "$t" >/dev/null || fail "$t is not installed (scripts/setup.sh package installs it)"
    done
    setup "$mode"
    trap 'package_teardown; teardown' EXIT

    # lintian: every finding is printed; any error or warning not known (and explained) fails.
    # lintian exits 2 when it finds errors (its --fail-on), 1 when it could not check the package.
    local lintian_rc=0
    lintian --info "$deb" >"$WORK/lintian.out" 2>&1 || lintian_rc=$?
    [ "$lintian_rc" -ne 1 ] || { cat "$WORK/lintian.out" >&2; fail "lintian could not check the package"; }
    [ "$lintian_rc" -eq 0 ] || grep -q '^E: ' "$WORK/lintian.out" || { cat "$WORK/lintian.out" >&2; fail "lintian exited $lintian_rc with no error found"; }
    say "lintian $(basename "$deb"): $(grep -cE '^[EWIPX]: ' "$WORK/lintian.out" || true) findings"
    grep -E '^[EWIPX]: ' "$WORK/lintian.out" | sed 's/^/      /' || true
    local tag unknown=""
    while read -r tag; do
        [[ " $LINTIAN_KNOWN " == *" $tag "* ]] || unknown+=" $tag"
    done < <(awk '/^[EW]: / { print $3 }' "$WORK/lintian.out")
    [ -z "$unknown" ] || fail "lintian errors or warnings not accounted for:$unknown"

    # A fresh Debian: minbase with systemd (and man-db, which systemd-analyze verify asks for the
    # unit's man page), and no Rust toolchain.
    root="$WORK/root"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,man-db bookworm "$root" "$DEBIAN_MIRROR" \
        >"$WORK/debootstrap.log" 2>&1 || { tail -5 "$WORK/debootstrap.log" >&2; fail "debootstrap"; }
    ! chroot "$root" sh -c 'command -v cargo || command -v rustc' >/dev/null || fail "the fresh root has a Rust toolchain"
    cp "$deb" "$root/tmp/lb.deb"

    # Install, remove, purge: nothing of lb stays, and nothing else changed. dpkg -i alone stops
    # at the dependency the fresh root lacks (libelf1), and apt-get -f install fetches it.
    before=$(root_files "$root")
    ! chroot "$root" dpkg -i /tmp/lb.deb >"$WORK/dpkg.log" 2>&1 || fail "dpkg -i configured lb without libelf1"
    grep -q "lb depends on libelf1" "$WORK/dpkg.log" || { cat "$WORK/dpkg.log" >&2; fail "dpkg -i failed for another reason"; }
    chroot "$root" apt-get update -qq >>"$WORK/dpkg.log" 2>&1 || fail "apt-get update in the fresh root"
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -f -y -qq >>"$WORK/dpkg.log" 2>&1 \
        || { tail -20 "$WORK/dpkg.log" >&2; fail "apt-get -f install"; }
    chroot "$root" getent passwd lb >/dev/null || fail "no lb user after dpkg -i"
    # The pool may hold a QUIC-LB key: readable by root and group lb, no one else.
    [ "$(chroot "$root" stat -c '%a %U:%G' /etc/lb/pool.yaml)" = "640 root:lb" ] \
        || fail "/etc/lb/pool.yaml is $(chroot "$root" stat -c '%a %U:%G' /etc/lb/pool.yaml), not 640 root:lb"
    chroot "$root" setpriv --reuid=lb --regid=lb --clear-groups cat /etc/lb/pool.yaml >/dev/null \
        || fail "user lb cannot read /etc/lb/pool.yaml"
    local denied
    denied=$(chroot "$root" setpriv --reuid=nobody --regid=nogroup --clear-groups cat /etc/lb/pool.yaml 2>&1 | head -c 300) || true
    [[ "$denied" == *"Permission denied"* ]] || fail "another user can read /etc/lb/pool.yaml, or the check could not run: $denied"
    [ "$(chroot "$root" lb --version)" = "$("$LB" --version)" ] || fail "the packaged lb is not this build: $(chroot "$root" lb --version)"
    [ "$(chroot "$root" systemctl is-enabled lb 2>&1)" = disabled ] || fail "the unit is not installed disabled"
    for f in usr/share/man/man1/lb.1.gz usr/share/man/man1/lb-attach.1.gz usr/share/bash-completion/completions/lb \
        usr/share/zsh/vendor-completions/_lb usr/share/fish/vendor_completions.d/lb.fish etc/lb/pool.yaml etc/default/lb \
        usr/share/doc/lb/examples/bird/node.conf usr/share/doc/lb/README.md usr/lib/systemd/system/lb.service; do
        [ -s "$root/$f" ] || fail "the package did not install /$f"
    done
    chroot "$root" lb check --config /etc/lb/pool.yaml >/dev/null || fail "the example pool does not check"
    chroot "$root" man -w lb-attach >/dev/null || fail "man lb-attach finds no page"
    chroot "$root" dpkg -r lb >>"$WORK/dpkg.log" 2>&1 || fail "dpkg -r"
    [ ! -e "$root/usr/bin/lb" ] || fail "dpkg -r left /usr/bin/lb"
    [ -e "$root/etc/lb/pool.yaml" ] || fail "dpkg -r removed the configuration (only a purge may)"
    chroot "$root" dpkg --purge lb >>"$WORK/dpkg.log" 2>&1 || fail "dpkg --purge"
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get autoremove --purge -y -qq >>"$WORK/dpkg.log" 2>&1 || fail "apt-get autoremove"
    ! chroot "$root" getent passwd lb >/dev/null || fail "the lb user stays after purge"
    ! chroot "$root" getent group lb >/dev/null || fail "the lb group stays after purge"
    ! chroot "$root" dpkg-query -W lb >/dev/null 2>&1 || fail "dpkg still records lb after the purge: $(chroot "$root" dpkg -l lb | tail -1)"
    diff <(echo "$before") <(root_files "$root") >"$WORK/purge.diff" || { cat "$WORK/purge.diff" >&2; fail "install and purge left the root changed"; }
    say "fresh bookworm root: dpkg -i (and apt-get -f install for libelf1; /etc/lb/pool.yaml 640 root:lb), dpkg -r," \
        "dpkg --purge (and autoremove); after the purge its $(echo "$before" | wc -l) files are as before"

    # Installed again as the README says, configured for the test's lb namespace, and booted.
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq ./tmp/lb.deb >>"$WORK/dpkg.log" 2>&1 \
        || { tail -20 "$WORK/dpkg.log" >&2; fail "apt-get install ./lb.deb"; }
    cp "$WORK/pool.yaml" "$root/etc/lb/pool.yaml"
    printf 'LB_INTERFACE=eth0\nLB_OPTIONS="--metrics 127.0.0.1:9100 --xdp-mode %s"\n' "$mode" >"$root/etc/default/lb"
    pins_up
    nspawn_cgroups
    SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn --quiet --keep-unit --register=no --directory="$root" --boot \
        --machine="lbt$$" --network-namespace-path="/run/netns/$PREFIX-lb" \
        --capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN --system-call-filter="bpf perf_event_open" \
        --bind="$PINS:/sys/fs/bpf" systemd.firstboot=off >"$WORK/nspawn.log" 2>&1 &
    NSPAWN=$!
    wait_until 100 0.1 pgrep -P "$NSPAWN" >/dev/null || { cat "$WORK/nspawn.log" >&2; fail "systemd-nspawn did not start"; }
    LEADER=$(pgrep -P "$NSPAWN" | head -1)
    wait_until 300 0.1 box_running || { tail -20 "$WORK/nspawn.log" >&2; fail "systemd in the root did not come up"; }
    [ "$(in_box readlink /proc/1/exe)" = /usr/lib/systemd/systemd ] || fail "PID 1 in the root is not systemd"
    # As on a host, where systemd mounts it 0700 (bpffs adds the sticky bit): user lb cannot
    # walk /sys/fs/bpf.
    [ "$(in_box stat -c %a /sys/fs/bpf)" = 1700 ] || fail "the root's /sys/fs/bpf is mode $(in_box stat -c %a /sys/fs/bpf), not a host's 1700"
    ! in_box setpriv --reuid=lb --regid=lb --clear-groups ls /sys/fs/bpf >/dev/null 2>&1 || fail "user lb can list the root's /sys/fs/bpf"
    # An operator's own plane, pinned by hand as root at the default --pin-dir before lb.service
    # first starts, on a link of its own (hand0, a veth whose peer stays in the namespace).
    ip -n "$PREFIX-lb" link add hand0 type veth peer name hand1 || fail "ip link add hand0"
    ip -n "$PREFIX-lb" link set hand0 up || fail "ip link set hand0 up"
    ip -n "$PREFIX-lb" link set hand1 up || fail "ip link set hand1 up"
    ip -n "$PREFIX-lb" addr add 192.0.2.1/24 dev hand0 || fail "ip addr add on hand0"
    printf 'services:\n  - name: hand\n    vip: 192.0.2.100\n    port: 80\n    backends: [{address: 192.0.2.11, name: h1}]\n' >"$root/root/hand.yaml"
    hand_attach hand0 /root/hand.yaml generic || fail "lb attach hand0 --pin, as root in the booted root"
    hand_serves "lb attach hand0 --pin" 0:0

    in_box systemd-analyze verify lb.service >"$WORK/verify.out" 2>&1 || { cat "$WORK/verify.out" >&2; fail "systemd-analyze verify lb.service"; }
    in_box systemctl enable --now lb >/dev/null 2>&1 || true
    wait_until 300 0.05 unit_is active || { journal_tail; fail "lb.service is $(in_box systemctl is-active lb)"; }
    wait_until 300 0.05 xdp_attached || { journal_tail; fail "lb.service attached nothing"; }
    local pid
    pid=$(in_box systemctl show -p MainPID --value lb)
    uid=$(in_box id -u lb)
    gid=$(in_box id -g lb)
    in_box cat "/proc/$pid/status" >"$WORK/status"
    [ "$(awk '/^Uid:/ { print $2 $3 $4 $5 }' "$WORK/status")" = "$uid$uid$uid$uid" ] || fail "lb does not run as user lb: $(grep Uid "$WORK/status")"
    # CAP_NET_ADMIN (12), CAP_PERFMON (38), CAP_BPF (39): effective, permitted and bounding.
    want_caps=000000c000001000
    # The unit's start made its own pin directory and gave user lb that alone.
    hand_serves "lb.service's start" 0:0
    [ "$(stat -c '%u:%g %a' "$PINS/lb-unit")" = "$uid:$gid 700" ] || fail "/sys/fs/bpf/lb-unit is $(stat -c '%u:%g %a' "$PINS/lb-unit"), not user lb's, mode 700"
    [ "$(stat -c '%u:%g' "$PINS/lb")" = "0:0" ] || fail "lb.service's start gave /sys/fs/bpf/lb (the default --pin-dir) to $(stat -c '%u:%g' "$PINS/lb")"
    caps=$(awk '/^Cap(Eff|Prm|Bnd):/ { printf "%s ", $2 }' "$WORK/status")
    [ "$caps" = "$want_caps $want_caps $want_caps " ] || fail "lb's capabilities (effective, permitted, bounding): $caps"
    ip netns exec "$PREFIX-lb" curl -s --max-time 5 http://127.0.0.1:9100/metrics >"$WORK/metrics" || fail "no /metrics"
    # The pins are in /sys/fs/bpf/lb-unit (lb saw it as /run/lb/bpf), where lb status from a root
    # shell finds them without --pin-dir; the operator's plane at the default, beside them, too.
    compgen -G "$PINS/lb-unit/net*/eth0/link" >/dev/null || fail "nothing pinned in the root's /sys/fs/bpf/lb-unit/NS/eth0"
    in_box lb status hand0 >"$WORK/handstatus" 2>&1 || { cat "$WORK/handstatus" >&2; fail "lb status hand0 from a root shell"; }
    in_box lb status eth0 >"$WORK/lbstatus" 2>&1 || { cat "$WORK/lbstatus" >&2; fail "lb status eth0 from a root shell"; }
    grep -q "^controller: lb pid $pid," "$WORK/lbstatus" || { cat "$WORK/lbstatus" >&2; fail "lb status eth0 does not name the unit's lb (pid $pid) as controller"; }
    grep -q "lb_build_info{.*commit=\"$("$LB" --version | sed 's/.*commit \([^,]*\),.*/\1/')\"" "$WORK/metrics" || fail "lb_build_info does not name this build's commit"
    in_box systemctl reload lb || fail "systemctl reload"
    wait_until 100 0.05 journal_has 'reload (SIGHUP)' || fail "systemctl reload did not reach lb"
    # The unit's sandbox, as systemd rates it for the loaded unit (lower is tighter; 10 is none).
    local exposure
    exposure=$(in_box systemd-analyze security --no-pager lb.service 2>/dev/null | sed -n 's/.*Overall exposure level for lb.service: \([0-9.]*\).*/\1/p')
    [ -n "$exposure" ] || fail "systemd-analyze security lb.service gave no exposure"
    awk -v e="$exposure" 'BEGIN { exit !(e <= 3.0) }' || fail "lb.service's exposure is $exposure, above 3.0: $(in_box systemd-analyze security --no-pager lb.service 2>&1 | grep '✗')"
    say "lb.service under systemd (PID 1 of the root): user lb (uid $uid), capabilities $want_caps (net_admin, perfmon, bpf) only; exposure $exposure"

    # systemctl restart under traffic: the pinned data plane forwards while lb is away.
    local held=30 t0
    cp "$deb" "$root/var/tmp/lb.deb"
    t0=$(date +%s)
    hold_open "$TOPO_CLIENTS4" 100 "$held"
    churn_start
    sleep 1
    in_box systemctl restart lb || fail "systemctl restart"
    wait_until 300 0.05 unit_is active || fail "lb.service did not come back"
    wait_until 300 0.05 journal_has 'adopted the data plane' \
        || { journal_tail; fail "the restarted lb did not adopt the pinned data plane"; }
    # A SIGTERM from outside systemd (systemctl kill): no stop was asked for, so the plane stays
    # and Restart= brings lb back to adopt it.
    in_box systemctl kill --signal=SIGTERM lb || fail "systemctl kill"
    wait_until 300 0.05 journal_has 'adopted the data plane' 2 \
        || { journal_tail; fail "after systemctl kill, no lb adopted the pinned data plane"; }
    # An upgrade (here the same version again: dpkg runs the same maintainer scripts) restarts
    # a running lb, which adopts the plane. The operator's own owner and mode of the pool stay.
    in_box chown lb:lb /etc/lb/pool.yaml || fail "chown the pool"
    in_box chmod 0600 /etc/lb/pool.yaml || fail "chmod the pool"
    in_box dpkg -i /var/tmp/lb.deb >>"$WORK/dpkg.log" 2>&1 || { tail -20 "$WORK/dpkg.log" >&2; fail "dpkg -i over the installed lb"; }
    [ "$(in_box stat -c '%a %U:%G' /etc/lb/pool.yaml)" = "600 lb:lb" ] \
        || fail "the upgrade changed the operator's /etc/lb/pool.yaml to $(in_box stat -c '%a %U:%G' /etc/lb/pool.yaml)"
    wait_until 300 0.05 journal_has 'adopted the data plane' 3 \
        || { journal_tail; fail "after the package's upgrade, no lb adopted the pinned data plane"; }
    ! journal_has "stop-post.*detached" || fail "systemctl kill or the upgrade detached the data plane"
    # The held connections prove something only if they were still open when lb came back.
    [ $(($(date +%s) - t0)) -lt "$held" ] || fail "the restart, the kill and the upgrade took longer than the ${held} s the connections were held"
    sleep 1
    churn_stop || fail "new connections failed across the restart, the kill and the upgrade: $CHURN_SUMMARY"
    hold_wait "a held connection broke across systemctl restart, kill or the package's upgrade"
    say "systemctl restart, systemctl kill (SIGTERM) and Restart=, the package's upgrade (which kept the operator's pool mode, 600 lb:lb), under traffic: held $(hold_summary); $CHURN_SUMMARY"

    # systemctl stop: nothing attached, no pins left; what to detach comes from the pins, not
    # from /etc/default/lb, which an operator may have edited since the start.
    sed -i 's/^LB_INTERFACE=.*/LB_INTERFACE=eth9/' "$root/etc/default/lb"
    in_box systemctl stop lb || fail "systemctl stop"
    plane_gone "systemctl stop"
    journal_has "stop-post.*detached XDP program" || fail "stop-post did not detach"
    hand_serves "systemctl stop" 0:0
    say "systemctl stop (LB_INTERFACE edited since the start): the program detached and every pin removed;" \
        "the operator's plane on hand0 (root's, at /sys/fs/bpf/lb) serves on, still root's"

    # The package's removal detaches the data plane and keeps the configuration, even when the
    # unit has no lb to stop: here it failed, its restarts refused by a pool that no longer
    # loads, while the plane it pinned serves on.
    sed -i 's/^LB_INTERFACE=.*/LB_INTERFACE=eth0/' "$root/etc/default/lb"
    in_box systemctl start lb || fail "systemctl start"
    wait_until 300 0.05 xdp_attached || { journal_tail; fail "lb.service attached nothing after a start"; }
    echo "services: [" >"$root/etc/lb/pool.yaml"
    in_box systemctl restart lb || true
    wait_until 300 0.1 unit_is failed || { journal_tail; fail "lb.service with a broken pool is $(in_box systemctl is-active lb), not failed"; }
    xdp_attached || fail "the failed unit's data plane is gone already: nothing left to prove"
    in_box dpkg -r lb >>"$WORK/dpkg.log" 2>&1 || { tail -20 "$WORK/dpkg.log" >&2; fail "dpkg -r under systemd"; }
    plane_gone "removing the package of a failed unit"
    hand_serves "removing the package" 0:0
    [ -e "$root/etc/lb/pool.yaml" ] || fail "dpkg -r removed the configuration"
    cp "$WORK/pool.yaml" "$root/etc/lb/pool.yaml"
    in_box systemctl reset-failed lb 2>/dev/null || true
    say "dpkg -r under systemd, of a failed unit whose plane served on: the program detached, every pin removed, /etc/lb kept;" \
        "the operator's plane on hand0 serves on"

    # Reinstalled over a pool an earlier package left readable by all (0644 root:root, which dpkg
    # keeps): closed to root and group lb. Shutdown stops every unit: lb's plane goes with it.
    in_box chown root:root /etc/lb/pool.yaml || fail "chown the pool"
    in_box chmod 0644 /etc/lb/pool.yaml || fail "chmod the pool"
    in_box dpkg -i /var/tmp/lb.deb >>"$WORK/dpkg.log" 2>&1 || { tail -20 "$WORK/dpkg.log" >&2; fail "dpkg -i after dpkg -r"; }
    [ "$(in_box stat -c '%a %U:%G' /etc/lb/pool.yaml)" = "640 root:lb" ] \
        || fail "an earlier package's 0644 pool stayed $(in_box stat -c '%a %U:%G' /etc/lb/pool.yaml) after the upgrade"
    # As after an upgrade from an earlier package, whose unit pinned at /sys/fs/bpf/lb and gave
    # all there to user lb at each start: its lb left its plane on eth0 pinned there (made here
    # by hand, as the upgrade's stop leaves it), and the operator's plane on hand0 became lb's.
    # The new unit's start moves the plane on eth0 to its own directory and adopts it; hand0's
    # stays where it is, serving.
    hand_attach eth0 /etc/lb/pool.yaml "$mode" || fail "lb attach eth0 --pin by hand, as an earlier package's lb pinned it"
    in_box chown -R lb:lb /sys/fs/bpf/lb || fail "chown -R lb:lb /sys/fs/bpf/lb, as an earlier package's unit did"
    in_box systemctl start lb || fail "systemctl start after reinstalling"
    wait_until 300 0.05 journal_has 'adopted the data plane pinned at /run/lb/bpf/net[0-9]*/eth0' 4 \
        || { journal_tail; fail "after reinstalling, lb.service did not adopt the plane an earlier package's unit pinned at /sys/fs/bpf/lb"; }
    journal_has 'moved the data plane .*/sys/fs/bpf/lb/net[0-9]*/eth0' || { journal_tail; fail "the unit's start did not say it moved the earlier package's plane"; }
    ! compgen -G "$PINS/lb/net*/eth0" >/dev/null || fail "the earlier package's plane on eth0 is still under /sys/fs/bpf/lb"
    [ "$(stat -c '%u:%g' "$PINS/lb" "$PINS"/lb/net* | sort -u)" = "0:0" ] || fail "/sys/fs/bpf/lb and its namespace directories are not root's again"
    hand_serves "the start after the upgrade" "$uid:$gid"
    say "upgrade from a package that pinned at /sys/fs/bpf/lb: lb.service moved its plane on eth0 to /sys/fs/bpf/lb-unit" \
        "and adopted it; gave /sys/fs/bpf/lb back to root; left the operator's plane on hand0 (made lb's by that package) serving:" \
        "$(in_box journalctl -u lb --no-pager | grep -m1 -o 'lb: moved the data plane.*')"
    in_box systemctl poweroff || fail "systemctl poweroff"
    wait_until 300 0.1 nspawn_gone || fail "the root did not shut down"
    wait "$NSPAWN" 2>/dev/null || true
    NSPAWN=
    plane_gone "shutting down"
    hand_serves "shutting down" "$uid:$gid"
    say "systemctl poweroff: lb stopped, the program detached, every pin removed; hand0's plane serves on"

    # A purge while a plane of user lb's is still attached (hand0's: lb cannot tell whether it
    # was the unit's, so nothing detaches it) keeps user and group lb: removed, their IDs would
    # own those pins for whoever is given them next. Here in the shut-down root, with the bpffs
    # where the booted one had it.
    mkdir -p "$root/sys/fs/bpf"
    mount --bind "$PINS" "$root/sys/fs/bpf" || fail "mount --bind the bpffs into the root"
    chroot "$root" dpkg --purge lb >"$WORK/purge.log" 2>&1 || { cat "$WORK/purge.log" >&2; fail "dpkg --purge with a plane of user lb's attached"; }
    umount "$root/sys/fs/bpf"
    hand_serves "the purge" "$uid:$gid"
    chroot "$root" getent passwd lb >/dev/null || fail "the purge removed user lb while its pins on hand0 are attached"
    chroot "$root" getent group lb >/dev/null || fail "the purge removed group lb while its pins on hand0 are attached"
    grep -q "kept user and group lb" "$WORK/purge.log" || { cat "$WORK/purge.log" >&2; fail "the purge did not say why it kept user lb"; }
    local id
    for id in $(find "$PINS" -printf '%U\n' | sort -u); do
        chroot "$root" getent passwd "$id" >/dev/null || fail "after the purge, pins are owned by uid $id, no one's"
    done
    for id in $(find "$PINS" -printf '%G\n' | sort -u); do
        chroot "$root" getent group "$id" >/dev/null || fail "after the purge, pins are owned by gid $id, no group's"
    done
    say "dpkg --purge with hand0's plane of user lb's attached: not detached; user and group lb kept, and the purge says why:" \
        "$(grep -m1 "kept user and group lb" "$WORK/purge.log")"
}
