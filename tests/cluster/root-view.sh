# shellcheck shell=bash
# A test cluster of another Slurm release runs in a view of that release's root (made by
# release-root.sh): the root bind-mounted at /run/slurm-htc-view/NAME, with what a site's nodes
# share with its login node mounted into it at the same paths: /proc, /sys (cgroups), /dev,
# munged's socket (one munged serves both releases), the users and their names (/etc/passwd,
# /etc/group, /etc/hosts), /home, /tmp, the cluster's state dir and the checkout the tests run
# from. Every Slurm daemon, every job and every client (the tests' `cluster_cmd` and `as_user`)
# runs chrooted in the view, as on a machine that runs that release.
#
# The root itself is left as made (no mount lands in it: only mount points are added), so
# release-root.sh may make it afresh whenever no view is mounted; the view is a private mount
# (nothing propagates to or from the host's), taken down by stop-cluster.sh.
#
#   root_view_path                  the view's path for $HTC_CLUSTER_DIR
#   root_view_mount ROOT CHECKOUT   mount the view (afresh)
#   root_view_umount                unmount it, if it is mounted
#
# Sourced by start-cluster.sh and stop-cluster.sh (after lib.sh).

root_view_path() { printf '/run/slurm-htc-view/%s\n' "${HTC_CLUSTER_DIR##*/}"; }

_root_view_mounted() { # PATH -> true if PATH is a mount point
    local p=$1 _id _parent _dev _root mp _rest
    while read -r _id _parent _dev _root mp _rest; do
        [[ $mp == "$p" ]] && return 0
    done </proc/self/mountinfo
    return 1
}

root_view_mount() {
    local root=$1 checkout=$2 view p shared=()
    view=$(root_view_path)
    [[ -f $root/.htc-release-root ]] || _htc_die "$root is not a release root (tests/cluster/release-root.sh makes one)"
    root_view_umount
    mkdir -p -- "$view"
    mount --bind -- "$root" "$view"
    mount --make-private -- "$view"
    mount -t proc proc "$view/proc"
    # rslave: nothing done in the view (its unmount included) reaches the host's /sys and /dev.
    mount --rbind /sys "$view/sys" && mount --make-rslave "$view/sys"
    mount --rbind /dev "$view/dev" && mount --make-rslave "$view/dev"
    for p in /etc/passwd /etc/group /etc/hosts /etc/resolv.conf; do
        [[ -e $p ]] || continue
        [[ -e $view$p ]] || : >"$view$p"
        mount -o bind,ro -- "$p" "$view$p"
    done
    # Directories, each once: one under another already shared comes with it.
    for p in /run/munge /run/mysqld /home /tmp "$HTC_CLUSTER_DIR" "$checkout"; do
        [[ -d $p ]] || continue
        local q under=0
        for q in "${shared[@]}"; do [[ $p == "$q" || $p == "$q"/* ]] && under=1; done
        ((under)) && continue
        shared+=("$p")
        mkdir -p -- "$view$p"
        mount --rbind -- "$p" "$view$p"
        mount --make-rslave -- "$view$p"
    done
}

root_view_umount() {
    local view
    view=$(root_view_path)
    _root_view_mounted "$view" || return 0
    # Lazily where something still holds a file there (a process that outlived stop-cluster's
    # kills): the view goes from the tree at once, the rest when it lets go.
    umount -R -- "$view" 2>/dev/null || umount -R -l -- "$view"
    rmdir -- "$view" 2>/dev/null || true
}
