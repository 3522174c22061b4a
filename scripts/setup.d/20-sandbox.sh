#!/usr/bin/env bash
# Sandbox prerequisites (idempotent, run as root by `make setup` and CI):
#  - bubblewrap for the `local` backend;
#  - podman + runc (+ debootstrap) for the `docker` backend, driven through podman's
#    Docker-compatible socket with the docker SDK (no Docker engine on these machines);
#    catatonit: podman's init for `init=True` containers (pid 1 must reap the zombies of killed
#    processes, or a fork bomb's zombies keep the pids limit exhausted);
#  - the task image `thundersync-sandbox:bookworm`, built from a minimal debootstrap rootfs
#    (python3, python3-pytest, git, patch) and imported with `podman import`. The rootfs tarball is
#    cached under /var/cache/thundersync/ (outside the repo) and rebuilt only when missing.
# Without root or apt-get the script only reports what is missing and exits 0 (tests that need
# the missing piece then fail with a message naming this script).
set -euo pipefail
CACHE=${TSRL_CACHE:-/var/cache/thundersync}
IMAGE=${TSRL_SANDBOX_IMAGE:-thundersync-sandbox:bookworm}
ROOTFS_TAR=$CACHE/sandbox-rootfs-bookworm.tar
PKGS="bubblewrap podman runc catatonit debootstrap uidmap slirp4netns fuse-overlayfs patch git python3-pytest procps"

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  for b in bwrap podman debootstrap; do
    command -v "$b" >/dev/null || echo "20-sandbox: $b missing (run this script as root)" >&2
  done
  exit 0
fi

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "20-sandbox: installing$missing"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# podman on a cgroup-v1 host without systemd: cgroupfs manager, file events log.
mkdir -p /etc/containers/containers.conf.d
conf=/etc/containers/containers.conf.d/50-thundersync.conf
if [ ! -f "$conf" ]; then
  cat > "$conf" <<'CONF'
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
CONF
fi

# podman's overlay storage caps a container's own layer only on xfs with project quotas (this
# kernel has no XFS quotas; podman 4.3 refuses `size` on btrfs): root / image-user docker sessions
# (verifiers, a Dockerfile's USER) can fill their image layer. The host declares that here, once;
# sandbox.docker_backend reads the file (delete it to have such sessions refused instead).
decl=/etc/thundersync/unbounded-image-layer
if [ ! -f "$decl" ]; then
  mkdir -p /etc/thundersync
  cat > "$decl" <<'TXT'
Declared by thundersync's scripts/setup.d/20-sandbox.sh: podman on this host cannot cap a
container's image layer, so docker sandbox sessions running as root or as an image's own user may
write an unbounded layer (their task, scratch and temp dirs keep the Limits.disk_mb quota).
Delete this file to refuse such sessions instead (TSRL_SANDBOX_UNBOUNDED_LAYER=0|1 overrides it).
TXT
  echo "20-sandbox: declared $decl (this engine cannot cap a container's image layer)"
fi

mkdir -p "$CACHE"
if ! podman image exists "$IMAGE" 2>/dev/null; then
  if [ ! -s "$ROOTFS_TAR" ]; then
    echo "20-sandbox: building the debootstrap rootfs (a few minutes)"
    work=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    debootstrap --variant=minbase --include=python3,python3-pytest,git,patch \
      bookworm "$work" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 \
      || { echo "20-sandbox: debootstrap failed, see $CACHE/debootstrap.log" >&2; rm -rf "$work"; exit 1; }
    chroot "$work" apt-get clean || true
    rm -rf "$work"/var/lib/apt/lists/* "$work"/var/cache/apt/*.bin "$work"/usr/share/doc/* \
      "$work"/usr/share/man/* "$work"/usr/share/locale/*
    tar -C "$work" -cf "$ROOTFS_TAR.tmp" .
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    rm -rf "$work"
  fi
  podman import --change 'CMD ["/bin/sh"]' --change 'WORKDIR /' "$ROOTFS_TAR" "$IMAGE" >/dev/null
  echo "20-sandbox: imported $IMAGE"
fi
exit 0
