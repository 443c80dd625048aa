package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ensurePinDir creates dir (mode 0700) on a bpffs mount, mounting bpffs on
// its parent first if asked to; an existing dir open to group or others is
// chmod'ed to 0700, a symlink or non-directory is refused.
func ensurePinDir(dir string, mount bool) error {
	parent := filepath.Dir(dir)
	if !isBPFFS(parent) {
		if !mount {
			// A missing kernel feature like any other: auto mode falls back.
			return fmt.Errorf("%w: pin path %s: %s is not a bpffs mount (mount -t bpf bpf %s)", ErrUnavailable, dir, parent, parent)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", parent, err)
		}
		if err := unix.Mount("bpf", parent, "bpf", 0, "mode=0700"); err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("%w: mount bpffs on %s: %w", ErrUnavailable, parent, err)
			}
			return fmt.Errorf("mount bpffs on %s: %w", parent, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin path: %w", err)
	}
	// The pinned maps steer traffic: an existing directory that others
	// could write (or that is not a directory) is tightened or refused.
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("pin path: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("pin path %s is not a directory (mode %v)", dir, fi.Mode())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("pin path %s is accessible to others (mode %v) and chmod 0700 failed: %w", dir, fi.Mode().Perm(), err)
		}
	}
	return nil
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

func linkPinName(pinPath, ifname string) string {
	return filepath.Join(pinPath, "link_xdp_steer_"+ifname)
}

// pinnedOn returns the ifindex an XDP link is attached to, 0 if none; an
// error when the kernel could not say (BPF_OBJ_GET_INFO_BY_FD failed).
func pinnedOn(l link.Link) (int, error) {
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("link info: %w", err)
	}
	if info.XDP() == nil {
		return 0, nil
	}
	return int(info.XDP().Ifindex), nil
}

// Detach detaches every xdp_steer link pinned under PinPath (whatever the
// interface), unpins the maps and removes PinPath. Established steered flows
// stop being steered.
func (k *Kernel) Detach() error {
	k.use.Lock()
	defer k.use.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	var errs []error
	if k.link != nil {
		if err := k.link.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
	}
	errs = append(errs, detachPinnedLinks(k.pinPath, "link_xdp_steer_"))
	for _, pm := range k.pinnedMaps() {
		if err := pm.m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin map: %w", err))
		}
	}
	k.closed = true
	k.closeObjs()
	if err := os.Remove(k.pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		k.log.Info("pin path not removed", "path", k.pinPath, "err", err)
	}
	return errors.Join(errs...)
}

// pinnedMaps are the maps the edge pins under PinPath, by pin name.
func (k *Kernel) pinnedMaps() []struct {
	name string
	m    *ebpf.Map
} {
	return []struct {
		name string
		m    *ebpf.Map
	}{{"services", k.objs.Services}, {"affinity", k.objs.Affinity}, {"backends", k.objs.Backends},
		{"flows", k.objs.Flows}, {"settings", k.objs.Settings}, {"counters", k.objs.Counters}}
}

// release gives up this process's kernel side after it was lost: it
// detaches its own XDP link (BPF_LINK_DETACH on its own handle, whatever
// is attached elsewhere), unpins a pinned object only when it still is this
// process's one (same link or map id: another instance may have pinned its
// own at the same path since), leaves the maps pinned while any other XDP
// link is pinned under PinPath (an instance that adopted them), and closes
// the handles. Unlike Detach it never touches another instance's state.
func (k *Kernel) release() error {
	k.use.Lock()
	defer k.use.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	var errs []error
	if k.link != nil {
		// Already detached when the link was lost: ENOLINK is expected.
		_ = k.link.Detach()
		if info, err := k.link.Info(); err == nil {
			p := linkPinName(k.pinPath, k.ifname)
			if l, err := link.LoadPinnedLink(p, nil); err == nil {
				if pi, err := l.Info(); err == nil && pi.ID == info.ID {
					if err := l.Unpin(); err != nil {
						errs = append(errs, fmt.Errorf("unpin own link: %w", err))
					}
				}
				_ = l.Close()
			}
		}
	}
	ents, _ := os.ReadDir(k.pinPath)
	shared := false
	for _, e := range ents {
		shared = shared || strings.HasPrefix(e.Name(), "link_xdp_")
	}
	if !shared {
		for _, pm := range k.pinnedMaps() {
			if err := unpinIfSame(pm.m, filepath.Join(k.pinPath, pm.name)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	k.closed = true
	k.closeObjs()
	_ = os.Remove(k.pinPath) // only when empty: anything left is someone else's
	return errors.Join(errs...)
}

// unpinIfSame removes the pin at path when it is m.
func unpinIfSame(m *ebpf.Map, path string) error {
	mi, err := m.Info()
	if err != nil {
		return fmt.Errorf("map info: %w", err)
	}
	id, ok := mi.ID()
	if !ok {
		return nil // cannot tell: leave it
	}
	pm, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil // gone, or not ours to judge
	}
	defer pm.Close()
	pi, err := pm.Info()
	if err != nil {
		return fmt.Errorf("pinned map info %s: %w", path, err)
	}
	if pid, ok := pi.ID(); !ok || pid != id {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin map %s: %w", path, err)
	}
	return nil
}

// detachPinnedLinks detaches, unpins and closes every link pinned in dir
// whose name starts with prefix. The explicit detach (BPF_LINK_DETACH)
// takes the program off its interface even while a running warmpath holds
// the link open (that process then falls back to userspace mode).
func detachPinnedLinks(dir, prefix string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read pin path: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned link %s: %w", p, err))
			continue
		}
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", p, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
		}
		_ = l.Close()
	}
	return errors.Join(errs...)
}

// Uninstall detaches every warmpath XDP link pinned under pinPath (edge or
// decap) and removes every pinned map and the directory, without loading
// anything: it works when the pinned maps are from an incompatible version.
// A missing pinPath is not an error.
func Uninstall(pinPath string) error {
	if pinPath == "" {
		pinPath = DefaultPinPath
	}
	errs := []error{detachPinnedLinks(pinPath, "link_xdp_")}
	ents, err := os.ReadDir(pinPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uninstall: %w", err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(pinPath, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("uninstall: %w", err))
		}
	}
	if err := os.Remove(pinPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("uninstall: %w", err))
	}
	return errors.Join(errs...)
}
