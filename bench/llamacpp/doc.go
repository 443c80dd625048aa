// Package llamacpp runs real llama.cpp llama-server processes on loopback
// for the live bench and the integration tests: Setup builds (once) a Debian
// sid chroot with sid's llama.cpp-tools and a tiny random-weight llama model
// written by mkmodel.py; Start runs N servers in it, each pinned to one core,
// and returns when every /health answers.
//
// Lifecycle hazards: Setup needs root (debootstrap, chroot), may take a few
// minutes on a fresh machine (it downloads a Debian base system and the
// packages from deb.debian.org) and is serialised across processes by a lock
// file next to the chroot. It mounts nothing. Every server runs in its own
// process group with a parent-death signal (bench/internal/child); Fleet.Stop
// kills the groups and is called by Start itself on any failure, so a caller
// owns a Fleet only after Start returned it without error.
package llamacpp
