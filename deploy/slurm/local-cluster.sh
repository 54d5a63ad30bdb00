#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for zeropilot's integration tests and for trying the
# Slurm backend by hand.
#
#   deploy/slurm/local-cluster.sh start [--nodes N] [--dir DIR]   # prints: export SLURM_CONF=...
#   deploy/slurm/local-cluster.sh status [--dir DIR]
#   deploy/slurm/local-cluster.sh stop [--dir DIR]
#
# One node runs slurmd next to slurmctld. Two or more nodes each get their own network namespace
# (zp-node1, zp-node2, ...) on a bridge, with their own IP address (10.77.0.11, .12, ...), their
# own hostname and their own slurmd, so a multi-node job really crosses network addresses.
# `start` waits until every node is up (idle, or running jobs) and is idempotent.
# Needs root. Installs slurm-wlm and munge from Debian's packages when they are missing.
set -euo pipefail

DIR=${ZEROPILOT_SLURM_DIR:-/tmp/zeropilot-slurm}
NODES=1
BRIDGE=zpslurm0
SUBNET=10.77.0
CTLD_ADDR=$SUBNET.1
WAIT_S=${ZEROPILOT_SLURM_WAIT_S:-60}

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    sed -n '5,7p' "$0" | sed 's/^# *//' >&2
    exit 2
}

parse_args() {
    while (($#)); do
        case $1 in
            --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
            --dir) DIR=${2:?--dir needs a folder}; shift 2 ;;
            *) usage ;;
        esac
    done
    [[ $NODES =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number from 1 to 99, not '$NODES'"
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/slurm.conf
}

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    log "installing slurm-wlm and munge from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends slurm-wlm munge iproute2 util-linux >&2
}

start_munge() {
    munge -n >/dev/null 2>&1 && return  # a daemon that answers, not just a process name
    [[ -s /etc/munge/munge.key ]] || mungekey --create --force >&2
    mkdir -p /run/munge
    chown munge:munge /run/munge 2>/dev/null || true
    munged --force >&2 9>&- || die "munged did not start"
    touch "$DIR/munged.ours"  # stop only what we started
}

node_names() {
    if ((NODES == 1)); then hostname -s; else seq -f 'zp-node%g' 1 "$NODES"; fi
}

node_addr() { # the address of node number $1 (1-based)
    if ((NODES == 1)); then echo 127.0.0.1; else echo "$SUBNET.$((10 + $1))"; fi
}

render_slurm_conf() { # the slurm.conf this recipe writes for $NODES nodes
    local total_mib cpus node_mib ctld_addr i
    total_mib=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
    cpus=$(nproc)
    node_mib=$((total_mib * 85 / 100 / NODES))  # leave room for the OS and the services
    ctld_addr=$( ((NODES == 1)) && echo 127.0.0.1 || echo "$CTLD_ADDR")
    {
        sed -e "s|@DIR@|$DIR|g" -e "s|@CTLD_HOST@|$(hostname -s)|" -e "s|@CTLD_ADDR@|$ctld_addr|" \
            "$(dirname "$0")/slurm.conf.in"
        for i in $(seq 1 "$NODES"); do
            printf 'NodeName=%s NodeAddr=%s CPUs=%s RealMemory=%s State=UNKNOWN\n' \
                "$(node_names | sed -n "${i}p")" "$(node_addr "$i")" "$cpus" "$node_mib"
        done
        printf 'PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n'
    }
}

config_is_current() { # the running cluster was started from what this recipe writes now
    cmp -s <(render_slurm_conf) "$CONF" && cmp -s "$(dirname "$0")/cgroup.conf" "$DIR/cgroup.conf"
}

write_config() {
    local i
    mkdir -p "$DIR"/{state,log,run}
    for i in $(node_names); do mkdir -p "$DIR/spool/$i"; done
    render_slurm_conf >"$CONF"
    cp "$(dirname "$0")/cgroup.conf" "$DIR/cgroup.conf"
    echo "$NODES" >"$DIR/nodes"
}

write_hosts_file() { # what /etc/hosts says inside the node namespaces
    local i
    {
        echo "127.0.0.1 localhost"
        echo "$CTLD_ADDR $(hostname -s)"
        for i in $(seq 1 "$NODES"); do echo "$(node_addr "$i") zp-node$i"; done
    } >"$DIR/hosts"
}

create_network() {
    local i ns
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in $(seq 1 "$NODES"); do
        ns=zp-node$i
        [[ -e /run/netns/$ns ]] || ip netns add "$ns"
        # A pair left by a namespace that a stray process kept alive would lead nowhere.
        ip -n "$ns" link show eth0 >/dev/null 2>&1 || {
            ip link del "zpveth$i" 2>/dev/null || true
            ip link add "zpveth$i" type veth peer name eth0 netns "$ns"
        }
        ip link set "zpveth$i" master "$BRIDGE" up
        ip -n "$ns" addr replace "$(node_addr "$i")/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
    done
}

start_slurmd() { # in the root namespace, or in node $1's own network, mount and UTS namespaces
    local name=$1
    if ((NODES == 1)); then
        slurmd -f "$CONF" -N "$name" >&2 9>&-
        return
    fi
    # nsenter, not `ip netns exec`: the latter remounts /sys and so hides the cgroup hierarchy.
    # shellcheck disable=SC2016  # $1.. are expanded by the inner sh
    nsenter --net="/run/netns/$name" unshare --mount --uts --propagation private \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -f "$3" -N "$2"' \
        zp-node "$DIR/hosts" "$name" "$CONF" >&2 9>&-
}

start_daemons() {
    local name
    slurmctld -f "$CONF" -c >&2 9>&- || die "slurmctld did not start; see $DIR/log/slurmctld.log"
    for name in $(node_names); do start_slurmd "$name"; done
}

pkill_ours() { # stop the daemons this folder's pid files name, and only those
    local pidfile pid
    for pidfile in "$DIR"/run/*.pid; do
        [[ -e $pidfile ]] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null  # slurmd can hang on a gone controller
        rm -f "$pidfile"
    done
}

kill_orphan_steps() { # a job step's daemon can outlive its slurmd (a node set DOWN mid-job)
    local pid
    for pid in $(pgrep -x slurmstepd || true); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" \
            && kill -KILL "$pid" 2>/dev/null
    done
    return 0
}

alive() { # running, and not a zombie waiting to be reaped
    [[ -e /proc/$1 ]] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

wait_until_ready() { # every node up: idle, or running jobs (of a session sharing the cluster)
    local deadline=$((SECONDS + WAIT_S)) states
    while ((SECONDS < deadline)); do
        states=$(SLURM_CONF=$CONF sinfo -h -N -o '%t' 2>/dev/null | sort -u | tr '\n' ' ')
        [[ -n $states ]] && ! tr -s ' ' '\n' <<<"$states" | grep -qvxE 'idle|mix|alloc|comp|' \
            && return
        sleep 0.5
    done
    SLURM_CONF=$CONF sinfo -N >&2 || true
    die "nodes not up after ${WAIT_S}s (states: ${states:-none}); see $DIR/log/"
}

running_nodes() { # how many nodes the running cluster of this folder has, or 0
    [[ -s $DIR/run/slurmctld.pid ]] && alive "$(cat "$DIR/run/slurmctld.pid")" \
        && cat "$DIR/nodes" 2>/dev/null || echo 0
}

cmd_start() {
    install_packages
    start_munge
    # A cluster left by an older checkout (another config) is restarted, not reused.
    if [[ $(running_nodes) != "$NODES" ]] || ! config_is_current; then
        log "starting a $NODES-node cluster in $DIR"
        cmd_stop_daemons
        write_config
        if ((NODES > 1)); then write_hosts_file; create_network; fi
        start_daemons
    fi
    wait_until_ready
    log "ready: $(SLURM_CONF=$CONF sinfo -h -N -o '%N(%t)' | tr '\n' ' ')"
    echo "export SLURM_CONF=$CONF"
}

cancel_jobs() { # slurmd leaves running jobs' processes alive when it stops: end them first
    [[ $(running_nodes) == 0 ]] && return
    SLURM_CONF=$CONF scancel --partition=debug 2>/dev/null || true
    for _ in $(seq 60); do
        [[ -z $(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null) ]] && return
        sleep 0.5
    done
}

cmd_stop_daemons() {
    local i ns
    cancel_jobs
    pkill_ours
    kill_orphan_steps
    for i in $(seq 1 99); do
        ns=zp-node$i
        [[ -e /run/netns/$ns ]] || break
        ip netns del "$ns"  # takes its end of the veth pair, and so the pair, with it
    done
    ip link del "$BRIDGE" 2>/dev/null || true
}

cmd_stop() {
    cmd_stop_daemons
    if [[ -e $DIR/munged.ours ]]; then
        kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
        rm -f "$DIR/munged.ours"
    fi
    log "stopped"
}

cmd_status() {
    local nodes
    nodes=$(running_nodes)
    if [[ $nodes == 0 ]]; then
        echo "stopped ($DIR)"
        return 3
    fi
    echo "running: $nodes node(s), SLURM_CONF=$CONF"
    SLURM_CONF=$CONF sinfo -N
}

with_lock() { # one start or stop at a time: two test sessions may share this folder
    # Every daemon started under the lock is started with fd 9 closed, or it would hold the lock.
    exec 9>"$DIR/.lock"
    flock 9
    "$@"
}

main() {
    local command=${1:-}
    (($#)) && shift
    parse_args "$@"
    case $command in
        start | stop) with_lock "cmd_$command" ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

main "$@"
