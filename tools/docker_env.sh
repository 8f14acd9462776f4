#!/usr/bin/env bash
# A private Docker engine and a Debian base image for the docker tests (tests/docker/).
#
#   eval "$(tools/docker_env.sh)"      # start (or reuse) the engine; build the base image once
#   tools/docker_env.sh stop           # stop the engine this script started (by its PID)
#
# On success stdout carries exactly these lines:
#   DOCKER_HOST=unix:///...            the engine's socket
#   AUTOTUNER_DOCKER=<path>            the docker client to use with it
#   AUTOTUNER_DOCKER_BASE=<image>      Debian bookworm with python3 and venv, trusting the host's CAs
#   AUTOTUNER_DOCKERD_STARTED=0|1      1 when this call started the engine (the caller stops it)
# Exit status 3 with a last line "docker_env: SKIP: <why>" means Docker cannot run on this machine
# (not root and no engine, no apt-get to install it, the kernel refuses the engine); any other
# non-zero status is a failure. Progress goes to stderr.
#
# What it does, each step only when needed:
#   1. apt-get install docker.io debootstrap docker-compose (as root)
#   2. dockerd --storage-driver vfs --iptables=false --bridge=none on its own socket, data root in the
#      cache (so images and build layers survive between runs); an engine already answering at
#      $DOCKER_HOST is used as it is
#   3. the base image: no registry is needed. `debootstrap --variant=minbase bookworm` from the
#      mirror apt already uses, trimmed, cached as a tarball, `docker import`ed; then the host's CA
#      bundle is copied in (a one-layer build, cached by Docker), so pip inside a build trusts what
#      the host trusts (a TLS-inspecting proxy included).
#
# Layout under ${AUTOTUNER_CACHE_DIR:-$HOME/.cache/autotuner}:
#   docker/data/                 the engine's data root
#   docker/engine.log            its log
#   docker/bookworm-rootfs.tar   the debootstrap tree; complete iff docker/bookworm-rootfs.stamp matches
#   docker.lock                  flock: concurrent callers wait instead of racing
set -euo pipefail

CACHE="${AUTOTUNER_CACHE_DIR:-$HOME/.cache/autotuner}"
DDIR="$CACHE/docker"
LOCK="$CACHE/docker.lock"
RUNDIR="/run/autotuner-docker"        # exec root: containerd's sockets need a short path
SOCK="/run/autotuner-docker.sock"
PIDFILE="/run/autotuner-docker.pid"
ROOTFS_TAR="$DDIR/bookworm-rootfs.tar"
ROOTFS_STAMP_FILE="$DDIR/bookworm-rootfs.stamp"
PACKAGES="python3,python3-venv,ca-certificates,passwd"
ROOTFS_STAMP="bookworm minbase $PACKAGES trim-1"
BASE_REPO="autotuner-base"
LOCK_TIMEOUT="${AUTOTUNER_LOCK_TIMEOUT:-1800}"

log() { printf 'docker_env: %s\n' "$*" >&2; }
die() { printf 'docker_env: ERROR: %s\n' "$*" >&2; exit 1; }
skip() { printf 'docker_env: SKIP: %s\n' "$*" >&2; exit 3; }

TMP=""
cleanup() { if [[ -n "$TMP" && -d "$TMP" ]]; then rm -rf -- "$TMP"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

client() {
    # The client packaged with the engine speaks its API version; any other is the fallback.
    if [[ -x /usr/bin/docker ]]; then echo /usr/bin/docker; else command -v docker || true; fi
}

engine_answers() {
    local cli
    cli="$(client)"
    [[ -n "$cli" ]] && timeout 20 "$cli" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

stop_engine() {
    [[ -f "$PIDFILE" ]] || { log "no engine started by this script is running"; return 0; }
    local pid
    pid="$(cat "$PIDFILE")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]]; then
        log "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        local i
        for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$pid" 2>/dev/null; then
            log "dockerd did not stop in 30 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f -- "$PIDFILE"
}

if [[ "${1:-}" == stop ]]; then
    stop_engine
    exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [stop]"

mkdir -p "$DDIR" || die "cannot create $DDIR"
command -v flock >/dev/null || die "flock (util-linux) is required"
exec 9>"$LOCK"
flock -w "$LOCK_TIMEOUT" 9 || die "timed out waiting for $LOCK"

# --- 1. an engine ----------------------------------------------------------------------------
started=0
if [[ -n "${DOCKER_HOST:-}" ]] && engine_answers; then
    log "using the engine at $DOCKER_HOST"
else
    export DOCKER_HOST="unix://$SOCK"
    if engine_answers; then
        log "engine already running at $DOCKER_HOST"
    else
        [[ "$(id -u)" == 0 ]] || skip "not root, and no Docker engine answers at \$DOCKER_HOST; run as root to start a private one"
        missing=()
        command -v dockerd >/dev/null || missing+=(docker.io)
        command -v debootstrap >/dev/null || missing+=(debootstrap)
        command -v docker-compose >/dev/null || missing+=(docker-compose)
        if ((${#missing[@]})); then
            command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}"
            log "installing ${missing[*]}"
            if ! { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
                    "${missing[@]}"; } >"$DDIR/apt.log" 2>&1; then
                tail -n 20 "$DDIR/apt.log" >&2
                skip "apt-get install ${missing[*]} failed (see $DDIR/apt.log)"
            fi
        fi
        # A stale pid file of a killed run names a process that is gone (or no longer dockerd).
        stop_engine
        rm -f -- "$SOCK"
        mkdir -p "$DDIR/data" "$RUNDIR"
        log "starting dockerd (vfs, no bridge, no iptables) on $SOCK"
        setsid dockerd --storage-driver vfs --iptables=false --bridge=none \
            --data-root "$DDIR/data" --exec-root "$RUNDIR" --pidfile "$PIDFILE" \
            --host "$DOCKER_HOST" >"$DDIR/engine.log" 2>&1 </dev/null 9>&- &  # not the lock: it outlives us
        dpid=$!
        for ((i = 0; i < 120; i++)); do
            engine_answers && break
            if ! kill -0 "$dpid" 2>/dev/null; then
                tail -n 15 "$DDIR/engine.log" >&2
                skip "dockerd exited at start (kernel support? see $DDIR/engine.log): $(tail -n 1 "$DDIR/engine.log")"
            fi
            sleep 0.5
        done
        engine_answers || { kill -TERM "$dpid" 2>/dev/null || true; skip "dockerd did not answer in 60 s (see $DDIR/engine.log)"; }
        started=1
    fi
fi
DOCKER="$(client)"

# --- 2. the base image -------------------------------------------------------------------------
rootfs_ok() { [[ -f "$ROOTFS_TAR" && "$(cat "$ROOTFS_STAMP_FILE" 2>/dev/null)" == "$ROOTFS_STAMP" ]]; }

if ! rootfs_ok; then
    command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
    # The mirror apt is configured with; debootstrap's own default when apt names none.
    mirror="$(apt-cache policy 2>/dev/null | awk '$2 ~ /^https?:/ && $3 == "bookworm/main" {print $2; exit}')" || true
    rm -rf -- "$DDIR"/.rootfs.tmp.*
    TMP="$(mktemp -d "$DDIR/.rootfs.tmp.XXXXXX")"
    log "debootstrap bookworm (minbase + $PACKAGES) from ${mirror:-the default mirror}: minutes"
    t0=$SECONDS
    if ! timeout 1800 debootstrap --variant=minbase --include="$PACKAGES" bookworm "$TMP/rootfs" ${mirror:+"$mirror"} \
        >"$TMP/debootstrap.log" 2>&1; then
        tail -n 20 "$TMP/debootstrap.log" >&2
        die "debootstrap failed"
    fi
    # Package caches, lists, docs and locales: a third of the tree, and every vfs layer copies it.
    rm -rf -- "$TMP"/rootfs/var/cache/apt/* "$TMP"/rootfs/var/lib/apt/lists/* "$TMP"/rootfs/usr/share/doc/* \
        "$TMP"/rootfs/usr/share/man/* "$TMP"/rootfs/usr/share/locale/* "$TMP"/rootfs/dev/*
    tar --numeric-owner -C "$TMP/rootfs" -cf "$TMP/rootfs.tar" .
    mv -f -- "$TMP/rootfs.tar" "$ROOTFS_TAR"
    printf '%s' "$ROOTFS_STAMP" >"$ROOTFS_STAMP_FILE"   # stamp last
    rm -rf -- "$TMP"
    TMP=""
    log "rootfs ready in $((SECONDS - t0)) s: $ROOTFS_TAR"
fi

stamp_tag="$(printf '%s' "$ROOTFS_STAMP" | sha256sum | cut -c1-12)"
rootfs_image="$BASE_REPO:rootfs-$stamp_tag"
if ! "$DOCKER" image inspect "$rootfs_image" >/dev/null 2>&1; then
    log "importing $ROOTFS_TAR as $rootfs_image"
    "$DOCKER" import --change 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$rootfs_image" >/dev/null ||
        die "docker import failed"
fi

ca=""
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [[ -f "$f" ]]; then ca="$f"; break; fi
done
base_image="$BASE_REPO:bookworm"
if [[ -n "$ca" ]]; then
    TMP="$(mktemp -d "$DDIR/.ca.tmp.XXXXXX")"
    cp -- "$ca" "$TMP/ca-certificates.crt"
    printf 'FROM %s\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n' "$rootfs_image" >"$TMP/Dockerfile"
    # Docker's build cache makes this a no-op while the host's bundle is unchanged.
    DOCKER_BUILDKIT=0 "$DOCKER" build -q --network none -t "$base_image" "$TMP" >/dev/null ||
        die "building $base_image (the host's CA bundle on $rootfs_image) failed"
    rm -rf -- "$TMP"
    TMP=""
else
    "$DOCKER" tag "$rootfs_image" "$base_image"
fi

printf 'DOCKER_HOST=%s\n' "$DOCKER_HOST"
printf 'AUTOTUNER_DOCKER=%s\n' "$DOCKER"
printf 'AUTOTUNER_DOCKER_BASE=%s\n' "$base_image"
printf 'AUTOTUNER_DOCKERD_STARTED=%s\n' "$started"
