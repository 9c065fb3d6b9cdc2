# shellcheck shell=bash
# Accounting for a test cluster, as sites have it: slurmdbd over MariaDB, enforcing associations,
# limits and QOS, with the accounts, users and QOS the tests submit under made by sacctmgr.
#
# One MariaDB serves every test cluster, as one munged does: one that answers on the default
# socket (/run/mysqld/mysqld.sock: where slurmdbd of either release looks for it; a socket
# reaches into network namespaces and, bound there, into a release root's view) is used as it is;
# else the harness starts the host's with a data directory of its own and no TCP listener, and
# stop-cluster.sh stops it again once no slurmdbd is left (not when start-cluster.sh has it
# clear the slate: it is kept for the next cluster). Each cluster has its own database
# (htc_acct_<name of its state dir>_<release>), and its own slurmdbd, started as its slurmctld is
# (chrooted in its release's view, in the head namespace). The database's accounts, users and
# QOS are made once and kept; on every start its records of jobs, steps, events and usage are
# emptied, so that they start afresh with the cluster's state (job ids from 1 again). Making the
# accounts costs 2.4 s here, emptying the records 0.1 s.
#
#   acct_db_start                 MariaDB answering (started, with $acct_db_pidfile, if not)
#   acct_db_reset RELEASE         this cluster's records emptied; false if it has no accounts yet
#                                 (the database is then dropped, for slurmdbd to make anew)
#   acct_dbd_conf PORT RELEASE    $HTC_CLUSTER_DIR/slurmdbd.conf for a slurmdbd on PORT
#   acct_populate CLUSTER         its accounts, users and QOS (sacctmgr), marked made
#
# What acct_populate makes, for the tests:
#   account htc     htcuser's default account (and root's account root, as Slurm makes it)
#   account spare   a second account htcuser may submit under (-A spare)
#   qos normal      the default QOS
#   qos capped      MaxSubmitJobsPerUser=2: the limit sites cap workflow users with
# Sourced by start-cluster.sh (after lib.sh).

acct_db_socket=/run/mysqld/mysqld.sock
acct_db_data=/var/lib/slurm-htc-mariadb
acct_db_pidfile=/run/mysqld/htc-mariadb.pid

_acct_sql() { mariadb --protocol=socket --socket="$acct_db_socket" -N -B -e "$1"; }

# One a state dir and release: a release's slurmdbd converts an older one's tables, which the
# older one then refuses.
acct_db_name() { # RELEASE
    printf 'htc_acct_%s\n' "$(tr -c 'A-Za-z0-9\n' _ <<<"${HTC_CLUSTER_DIR##*/}_${1%.*}")"
}

acct_db_start() {
    _acct_sql 'select 1' >/dev/null 2>&1 && return 0
    # The data directory is made once a machine (5 s here) and kept: each cluster's database
    # is dropped and made afresh on its start instead.
    if [[ ! -e $acct_db_data/.htc-made ]]; then
        rm -rf -- "$acct_db_data"
        install -d -o mysql -g mysql -m 0750 "$acct_db_data"
        mariadb-install-db --user=mysql --datadir="$acct_db_data" --auth-root-authentication-method=socket \
            --skip-test-db >"$HTC_CLUSTER_DIR/log/mariadb-install.log" 2>&1 ||
            { cat "$HTC_CLUSTER_DIR/log/mariadb-install.log" >&2; _htc_die "mariadb-install-db failed"; }
        touch "$acct_db_data/.htc-made"
    fi
    install -d -o mysql -g mysql -m 0755 "${acct_db_socket%/*}"
    # Its pid file (acct_db_pidfile: it says the MariaDB is the harness's, for stop-cluster.sh)
    # and log where the mysql user may write them. A throw-away database writes nothing to disk
    # before it must (sacctmgr's setup took 2.4 s here with every commit synced); the buffer pool
    # and lock wait are the sizes slurmdbd asks for.
    local log=$acct_db_data/htc-mariadb.log _
    _htc_detached setsid /usr/sbin/mariadbd --user=mysql --datadir="$acct_db_data" \
        --socket="$acct_db_socket" --pid-file="$acct_db_pidfile" --skip-networking --log-error="$log" \
        --innodb-flush-log-at-trx-commit=0 --innodb-flush-method=nosync --innodb-doublewrite=0 \
        --innodb-buffer-pool-size=1G --innodb-lock-wait-timeout=900
    for _ in $(seq 100); do
        _acct_sql 'select 1' >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    tail -n 20 "$log" >&2
    _htc_die "MariaDB did not answer on $acct_db_socket within 10 s"
}

acct_db_reset() {
    local db t tables
    db=$(acct_db_name "$1")
    if [[ -z $(_acct_sql "select 1 from information_schema.tables where table_schema = '$db' and table_name = 'htc_made'") ]]; then
        _acct_sql "drop database if exists $db"
        return 1
    fi
    # What a cluster's jobs leave; its associations, wckeys and the rollups' clock stay.
    mapfile -t tables < <(_acct_sql "select table_name from information_schema.tables where table_schema = '$db'
        and table_name like 'htctest\\_%' and table_name not regexp '_(assoc|wckey|last_ran)_table\$'")
    for t in "${tables[@]}"; do printf 'truncate table %s.%s;\n' "$db" "$t"; done | _acct_sql_stdin
}
_acct_sql_stdin() { mariadb --protocol=socket --socket="$acct_db_socket" -N -B; }

# slurmdbd reads slurmdbd.conf beside $SLURM_CONF; it must be the SlurmUser's and 0600. Root
# reaches MariaDB through the socket with no password (unix_socket), as Debian sets it up.
acct_dbd_conf() {
    local port=$1 release=$2 f=$HTC_CLUSTER_DIR/slurmdbd.conf
    cat >"$f" <<EOF
# Written by tests/cluster/start-cluster.sh; rewritten on every start.
AuthType=auth/munge
DbdHost=localhost
DbdPort=$port
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=$(acct_db_name "$release")
PidFile=$HTC_CLUSTER_DIR/run/slurmdbd.pid
LogFile=$HTC_CLUSTER_DIR/log/slurmdbd.log
DebugLevel=${HTC_CLUSTER_DEBUG:-info}
EOF
    chmod 0600 "$f"
}

# Once slurmdbd answers: everything in one sacctmgr (one connection), then the mark that it is
# made (acct_db_reset). The cluster's name is the tables' prefix there.
acct_populate() { # CLUSTER RELEASE
    local cluster=$1 user=$HTC_CLUSTER_USER
    cluster_cmd sacctmgr -i -Q <<EOF || return 1
add cluster $cluster
add qos capped MaxSubmitJobsPerUser=2
add account htc,spare cluster=$cluster
add user $user account=htc,spare defaultaccount=htc cluster=$cluster qos=normal,capped defaultqos=normal
EOF
    _acct_sql "create table $(acct_db_name "$2").htc_made (made int)"
}
