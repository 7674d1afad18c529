#!/usr/bin/env bash
# Prepares a backend for lb's encapsulated forwarding (`forward: ipip` or `gue`), as root, on the
# backend itself. Two ways to take the outer headers off:
#
#   scripts/backend-setup.sh --vip ADDR [--vip ADDR...] --iface IFACE lb --allow-from PREFIX
#           [--allow-from PREFIX...] [--gue-port PORT] [--xdp-mode MODE] [--second-chance]
#           [--stats-interval SECS]
#       Tested here. Holds the VIPs, sets the sysctls below, then runs `lb decap IFACE` in the
#       foreground (run it under your supervisor; Ctrl-C or SIGTERM detaches). For kernels
#       without the ipip, ip6_tunnel, sit or fou drivers, like this project's test machines.
#       --allow-from (repeatable) names the load balancers' encapsulation sources (their
#       --encap-source, or their interface's address): packets from anywhere else are not
#       unwrapped. --allow-any instead unwraps from any source (isolated test setups only).
#       --second-chance passes lb decap's flag of that name (docs/fleet.md, "Second chance"):
#       the other backends' addresses must then be allowed too. --stats-interval passes lb
#       decap's (its counters on standard output every SECS seconds).
#
#   scripts/backend-setup.sh --vip ADDR [--vip ADDR...] --iface IFACE linux [--gue-port PORT]
#       Documented, not run here (this project's test kernel has none of these drivers). Holds
#       the VIPs, sets the sysctls, loads the drivers and brings up the kernel's catch-all
#       tunnel devices, and for GUE asks fou to hand UDP port PORT to them. Then exits.
#       These devices unwrap from any source: restrict IPIP (protocols 4 and 41) and UDP PORT to
#       the load balancers' sources in the firewall (netfilter sees the outer packet here).
#
# What either way sets, and why:
#   - every VIP on the loopback (/32 or /128): the inner packet is addressed to the VIP, and the
#     backend answers the client from it directly;
#   - arp_ignore=1, arp_announce=2 (on all and IFACE): the backend never answers ARP for a VIP,
#     which would steal the VIP's traffic from the load balancer on a shared link;
#   - rp_filter=2 (loose) on all, IFACE and the tunnel devices: a decapsulated packet comes from
#     a client anywhere, on an interface the strict check may not route back through.
# The load balancer's outer source must never be one of the backend's addresses (and so never a
# VIP): Linux drops an encapsulated packet whose outer source is local. lb never uses a VIP.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

vips=()
allow=()
iface=
way=
gue_port=6080
mode=auto
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --vip) vips+=("$2"); shift 2 ;;
        --iface) iface=$2; shift 2 ;;
        --allow-from) allow+=(--allow-from "$2"); shift 2 ;;
        --allow-any) allow+=(--allow-any); shift ;;
        --gue-port) gue_port=$2; shift 2 ;;
        --xdp-mode) mode=$2; shift 2 ;;
        --second-chance) extra+=(--second-chance); shift ;;
        --stats-interval) extra+=(--stats-interval "$2"); shift 2 ;;
        lb | linux) way=$1; shift ;;
        -h | --help) usage ;;
        *) echo "backend-setup: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$iface" ] && [ -n "$way" ] && [ ${#vips[@]} -gt 0 ] || usage
# Checked here too, before the host is changed, though lb decap would refuse as well.
if [ "$way" = lb ] && [ ${#allow[@]} -eq 0 ]; then
    echo "backend-setup: the lb way needs --allow-from PREFIX (the load balancers' encapsulation sources) or --allow-any" >&2
    exit 2
fi
[ "$(id -u)" -eq 0 ] || { echo "backend-setup: run as root" >&2; exit 1; }
ip link show dev "$iface" >/dev/null || { echo "backend-setup: no interface $iface" >&2; exit 1; }

for v in "${vips[@]}"; do
    case "$v" in
        *:*) ip -6 addr replace "$v/128" dev lo ;;
        *) ip addr replace "$v/32" dev lo ;;
    esac
done
sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
    "net.ipv4.conf.$iface.arp_ignore=1" "net.ipv4.conf.$iface.arp_announce=2" \
    net.ipv4.conf.all.rp_filter=2 "net.ipv4.conf.$iface.rp_filter=2"
echo "backend-setup: VIPs ${vips[*]} on lo; arp_ignore=1, arp_announce=2, rp_filter=2" >&2

case "$way" in
    lb)
        lb=${LB:-$(command -v lb || echo "$(dirname "$0")/../target/release/lb")}
        [ -x "$lb" ] || { echo "backend-setup: lb not found (build it, or set LB=/path/to/lb)" >&2; exit 1; }
        # lb decap itself refuses to start without --allow-from or --allow-any, and says so.
        exec "$lb" decap "$iface" "${allow[@]}" --gue-port "$gue_port" --xdp-mode "$mode" ${extra[@]+"${extra[@]}"}
        ;;
    linux)
        modprobe ipip && modprobe ip6_tunnel && modprobe sit && modprobe fou && modprobe fou6 || {
            echo "backend-setup: this kernel lacks a tunnel driver; use the 'lb' way" >&2
            exit 1
        }
        # The catch-all devices: tunl0 takes IPv4 in IPv4 for any local address, ip6tnl0 (mode
        # any) IPv6 or IPv4 in IPv6, sit0 IPv6 in IPv4.
        ip link set tunl0 up
        ip -6 tunnel change ip6tnl0 mode any
        ip link set ip6tnl0 up
        ip link set sit0 up
        for dev in tunl0 ip6tnl0 sit0; do sysctl -qw "net.ipv4.conf.$dev.rp_filter=2" 2>/dev/null || true; done
        # GUE: fou hands UDP to port PORT (outer IPv4 and IPv6) to the tunnel devices above.
        ip fou add port "$gue_port" gue
        ip fou add port "$gue_port" gue -6
        echo "backend-setup: tunl0, ip6tnl0, sit0 up; GUE on UDP $gue_port" >&2
        ;;
esac
