#!/usr/bin/env bash
# Build the systemd test image the molecule scenarios run in, locally, with no
# registry: a Debian 13 (trixie) root file system from debootstrap, imported
# into Docker. Debian 13 stands in for Ubuntu 24.04 because no Ubuntu archive
# is reachable from the development machines (systemd 257, Python 3.13, apt
# with deb822 sources).
#
# Users who can pull images point the scenarios at an Ubuntu 24.04 systemd
# image instead, with MOLECULE_IMAGE=<registry>/<image>:<tag>; this script is
# then not needed.
#
# Usage: molecule/image/build.sh [--force]
# Env:   MOLECULE_IMAGE  name:tag to build (default glm5-test/debian13-systemd:1)
#        DEBIAN_MIRROR   debootstrap mirror (default: debootstrap's own default)
set -euo pipefail

# Two test stages may ask at once (scripts/test runs some side by side): one builds,
# the other waits for it and then finds the image present.
if [[ -z ${GLM5_IMAGE_BUILD_LOCKED:-} ]]; then
  exec env GLM5_IMAGE_BUILD_LOCKED=1 flock "${TMPDIR:-/tmp}/glm5-image-build.lock" "$0" "$@"
fi

image=${MOLECULE_IMAGE:-glm5-test/debian13-systemd:1}
suite=trixie
packages=systemd,systemd-sysv,python3,python3-apt,dbus,iproute2,ca-certificates,sudo,procps,gnupg,kmod
force=${1:-}

if [[ $force != --force ]] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image present"
  exit 0
fi

root=$(mktemp -d /var/tmp/glm5-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite into $root"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >/dev/null

# A container has no hardware clock, console gettys or udev; mask what would
# only fail, so that `systemctl is-system-running` answers `running`.
for unit in getty@tty1.service console-getty.service systemd-udevd.service \
  systemd-udev-trigger.service systemd-firstboot.service systemd-remount-fs.service \
  systemd-resolved.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
echo 'glm5-test' >"$root/etc/hostname"
: >"$root/etc/machine-id"

tar -C "$root" -c . | docker import \
  --change 'CMD ["/sbin/init"]' \
  --change 'ENV container=docker' \
  - "$image" >/dev/null
echo "built $image"
