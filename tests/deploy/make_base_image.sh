#!/bin/bash
# Makes the debian:bookworm-slim image docker/Dockerfile starts from, without
# a registry: debootstrap (minbase) from the Debian mirror, trimmed the way
# the published slim image is (no docs, man pages or locales, now or in
# later installs; no package lists or caches), imported into podman.
# Usage: make_base_image.sh [TAG]   (root; default tag debian:bookworm-slim)
set -euo pipefail
TAG=${1:-debian:bookworm-slim}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root

debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }

# The three suites, in deb822 form, as the published image has them.
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOS
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS

# Later apt-get installs in images built on it leave these out too.
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOS'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOS
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOS'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOS
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"

find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/usr/share/man/"* "$root/usr/share/info/"* "$root/usr/share/locale/"* \
    "$root/usr/share/groff/"* "$root/usr/share/lintian/"* \
    "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/cache/apt/archives/"*.deb \
    "$root/var/log/"*.log "$root/var/log/apt/"* "$root/tmp/"*

tar -C "$root" --numeric-owner -c . |
    podman import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$TAG" >/dev/null
echo "made $TAG"
