#!/usr/bin/env bash
# Make sure the services the tests talk to are running here: Redis and PostgreSQL on loopback.
# Installs them from Debian's packages on a machine that lacks them. Needs root for that.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }

ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
    if ! command -v redis-server >/dev/null; then
        log "installing redis-server"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
    fi
    log "starting redis on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && return; sleep 0.1; done
    log "redis did not answer"; exit 1
}

ensure_postgres() {
    local dsn=${ZEROPILOT_TEST_POSTGRES:-postgresql://postgres@127.0.0.1:5432/postgres}
    if psql "$dsn" -Atc 'select 1' >/dev/null 2>&1; then return; fi
    if ! command -v pg_ctlcluster >/dev/null; then
        log "installing postgresql"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    log "starting postgresql $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 50); do pg_isready -h 127.0.0.1 -q && break; sleep 0.2; done
    if ! psql "$dsn" -Atc 'select 1' >/dev/null 2>&1; then
        # A stock install asks loopback clients for a password; the tests connect as postgres.
        log "allowing trust auth for the postgres user on 127.0.0.1 (test machine)"
        local hba=/etc/postgresql/$version/main/pg_hba.conf
        sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    fi
    psql "$dsn" -Atc 'select 1' >/dev/null || { log "cannot connect to $dsn"; exit 1; }
}

ensure_tools() {
    # docker-compose (the v1 client) only parses and validates the compose file in the tests;
    # without --no-install-recommends apt would pull the whole Docker engine (46 packages).
    command -v docker-compose >/dev/null && return
    log "installing docker-compose (used to validate docker-compose.yml)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2
}

ensure_redis
ensure_postgres
ensure_tools
