#!/usr/bin/env bash
# setup.sh: a Debian sid chroot with llama.cpp's llama-server and warmpath's
# tiny random-weight model, for the live bench and the llama.cpp integration
# test. Debian 12 has no llama.cpp; sid's llama.cpp-tools has llama-server.
#
# Idempotent: each step checks before it acts, and a marker file holding a
# stamp of this script's inputs says the whole thing is done, so a second run
# prints "ready" and exits. Runs as root. Mounts nothing: llama-server runs in
# the chroot without /proc or /sys (it is given its thread count, and taskset
# runs outside the chroot), so there is nothing to unmount.
#
#   WARMPATH_LLAMA_ROOT    chroot directory (/var/cache/warmpath/sid-root)
#   WARMPATH_DEBIAN_MIRROR mirror for debootstrap (http://deb.debian.org/debian)
#
# Prints the chroot directory as its last line of stdout; progress goes to
# stderr.
set -euo pipefail

ROOT=${WARMPATH_LLAMA_ROOT:-/var/cache/warmpath/sid-root}
MIRROR=${WARMPATH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGES="llama.cpp-tools python3-gguf python3-numpy"
MODEL=/opt/warmpath/tiny.gguf # inside the chroot
MARKER=$ROOT/.warmpath-llamacpp-ready

say() { echo "llamacpp setup: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
	say "needs root (debootstrap, chroot)"
	exit 1
fi
case "$ROOT" in
/ | "") say "refusing WARMPATH_LLAMA_ROOT=$ROOT"; exit 1 ;;
esac

# The stamp changes when the packages or the model script change, so an old
# chroot is brought up to date rather than trusted.
STAMP="$PACKAGES $(sha256sum "$HERE/mkmodel.py" | cut -d' ' -f1)"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$STAMP" ]; then
	say "$ROOT ready"
	echo "$ROOT"
	exit 0
fi

# One setup at a time: go test runs packages in parallel, and two of them may
# call this at once.
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$STAMP" ]; then
	say "$ROOT ready (set up by a concurrent run)"
	echo "$ROOT"
	exit 0
fi

# has_mounts: is anything mounted at or below $ROOT? Never delete then.
has_mounts() { awk -v r="$ROOT" '$2 == r || index($2, r "/") == 1 { f = 1 } END { exit !f }' /proc/self/mounts; }

# 1. debootstrap. It removes $ROOT/debootstrap when it succeeds, so a
# directory with apt-get and without that one is a finished base system.
if [ -x "$ROOT/usr/bin/apt-get" ] && [ ! -d "$ROOT/debootstrap" ]; then
	say "base system present in $ROOT"
else
	if [ -e "$ROOT" ]; then
		if has_mounts; then
			say "$ROOT is an unfinished debootstrap with something mounted in it; unmount and retry"
			exit 1
		fi
		say "removing the unfinished debootstrap in $ROOT"
		rm -rf --one-file-system "$ROOT"
	fi
	if ! command -v debootstrap >/dev/null; then
		say "installing debootstrap"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2 ||
			{ apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2; }
	fi
	say "debootstrap --variant=minbase sid $ROOT $MIRROR (about 2 minutes)"
	debootstrap --variant=minbase sid "$ROOT" "$MIRROR" >&2
fi

# 2. llama.cpp and the GGUF writer, inside the chroot.
in_root() { DEBIAN_FRONTEND=noninteractive chroot "$ROOT" "$@"; }
missing=""
for p in $PACKAGES; do
	in_root dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing="$missing $p"
done
if [ -n "$missing" ]; then
	say "apt-get install$missing (in the chroot)"
	# debootstrap just fetched the package lists; refresh them only when the
	# install fails (a chroot made long ago). Valid-Until is not checked: a
	# VM clock ahead of the archive makes sid's Release look expired, and
	# the signatures are still verified.
	# shellcheck disable=SC2086
	if ! in_root apt-get install -y -qq --no-install-recommends $missing >&2; then
		say "apt-get update (in the chroot), then install again"
		in_root apt-get -o Acquire::Check-Valid-Until=false update -qq >&2
		# shellcheck disable=SC2086
		in_root apt-get install -y -qq --no-install-recommends $missing >&2
	fi
else
	say "packages present: $PACKAGES"
fi

# 3. The model, written by the committed script (seeded: same bytes every time).
mkdir -p "$ROOT/opt/warmpath"
cp "$HERE/mkmodel.py" "$ROOT/opt/warmpath/mkmodel.py"
say "writing $MODEL"
in_root python3 /opt/warmpath/mkmodel.py "$MODEL" >&2

# 4. It runs.
say "$(in_root llama-server --version 2>&1 | head -1)"
echo "$STAMP" >"$MARKER"
say "$ROOT ready"
echo "$ROOT"
