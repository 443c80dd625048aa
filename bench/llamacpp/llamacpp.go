package llamacpp

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
)

// DefaultRoot is the chroot directory when WARMPATH_LLAMA_ROOT is unset.
const DefaultRoot = "/var/cache/warmpath/sid-root"

// Model is the tiny model's path inside the chroot (written by mkmodel.py).
const Model = "/opt/warmpath/tiny.gguf"

// ErrNotRoot is returned by Setup and Start when not running as root:
// debootstrap and chroot need it.
var ErrNotRoot = errors.New("llamacpp: needs root (debootstrap, chroot)")

//go:embed setup.sh
var setupScript []byte

//go:embed mkmodel.py
var mkmodelScript []byte

// Root is the chroot directory: $WARMPATH_LLAMA_ROOT, else DefaultRoot.
func Root() string {
	if r := os.Getenv("WARMPATH_LLAMA_ROOT"); r != "" {
		return r
	}
	return DefaultRoot
}

// Setup makes sure the chroot holds llama-server and the model, running
// setup.sh (embedded: the binary needs no checkout), and returns the chroot
// directory. Instant when a previous run finished; a few minutes from
// scratch.
func Setup(ctx context.Context) (string, error) { return SetupWith(ctx, nil) }

// SetupWith is Setup with the script's progress lines copied to progress
// (nil: discarded; the end of it is in the error either way).
func SetupWith(ctx context.Context, progress io.Writer) (string, error) {
	if os.Geteuid() != 0 {
		return "", ErrNotRoot
	}
	dir, err := os.MkdirTemp("", "warmpath-llamacpp-")
	if err != nil {
		return "", fmt.Errorf("llamacpp setup: %w", err)
	}
	defer os.RemoveAll(dir)
	for name, b := range map[string][]byte{"setup.sh": setupScript, "mkmodel.py": mkmodelScript} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			return "", fmt.Errorf("llamacpp setup: %w", err)
		}
	}
	root := Root()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "setup.sh"))
	cmd.Env = append(os.Environ(), "WARMPATH_LLAMA_ROOT="+root)
	tail := &child.Tail{Max: 8 << 10}
	cmd.Stderr = tail
	if progress != nil {
		cmd.Stderr = io.MultiWriter(tail, progress)
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("llamacpp setup.sh: %w: %s", err, tail.String())
	}
	return root, nil
}

// Options configures Start. Zero fields take the defaults shown.
type Options struct {
	// Root is the chroot ("": Root()). Setup must have run.
	Root string
	// N is the number of servers (2).
	N int
	// Slots is each server's -np: concurrent requests (4).
	Slots int
	// CtxPerSlot is each slot's context in tokens (8192); the server gets
	// -c Slots*CtxPerSlot without unified KV, so /props reports n_ctx =
	// CtxPerSlot.
	CtxPerSlot int
	// Cores are the CPUs the servers are pinned to (taskset), round-robin
	// (nil: 0 .. NumCPU-1).
	Cores []int
	// Threads is each server's -t and -tb (1: one core each).
	Threads int
	// Port is the first server's port, the others follow (0: free ports).
	Port int
	// Alias is the model name /v1/models reports (--alias; "" keeps the
	// model path). llama-server answers whatever model a request names.
	Alias string
	// Args are extra llama-server flags, e.g. "--cache-ram", "0".
	Args []string
	// ReadyTimeout bounds each server's start-up (60 s).
	ReadyTimeout time.Duration

	// freeAddr picks a free port's address (nil: child.FreeAddr); tests
	// hand out a taken one.
	freeAddr func() (string, error)
}

func (o Options) withDefaults() Options {
	if o.Root == "" {
		o.Root = Root()
	}
	if o.N <= 0 {
		o.N = 2
	}
	if o.Slots <= 0 {
		o.Slots = 4
	}
	if o.CtxPerSlot <= 0 {
		o.CtxPerSlot = 8192
	}
	if len(o.Cores) == 0 {
		for i := range runtime.NumCPU() {
			o.Cores = append(o.Cores, i)
		}
	}
	if o.Threads <= 0 {
		o.Threads = 1
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = time.Minute
	}
	return o
}

// Fleet is a set of running llama-server processes. Not safe for
// concurrent Stop and use; Addrs and Failure are read-only.
type Fleet struct {
	opts  Options
	addrs []string
	g     child.Group
}

// args is the command line Start runs for a server on port, pinned to core:
// chroot ROOT taskset -c CORE llama-server ... (the binary is "chroot").
func (o Options) args(port, core int) []string {
	o = o.withDefaults()
	a := []string{o.Root, "taskset", "-c", strconv.Itoa(core), "llama-server",
		"-m", Model, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-np", strconv.Itoa(o.Slots), "-c", strconv.Itoa(o.Slots * o.CtxPerSlot), "--no-kv-unified",
		"-t", strconv.Itoa(o.Threads), "-tb", strconv.Itoa(o.Threads),
		"--metrics", "--slots", "--no-webui"}
	if o.Alias != "" {
		a = append(a, "--alias", o.Alias)
	}
	return append(a, o.Args...)
}

// Start runs opts.N servers and returns once every one answers /health
// with 200 (model loaded). On error nothing is left running.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	o := opts.withDefaults()
	if _, err := os.Stat(filepath.Join(o.Root, strings.TrimPrefix(Model, "/"))); err != nil {
		return nil, fmt.Errorf("llamacpp: no model in %s (run Setup): %w", o.Root, err)
	}
	f := &Fleet{opts: o}
	free := o.freeAddr
	if free == nil {
		free = child.FreeAddr
	}
	// start runs server i (its port picked, unless Port fixes it) and
	// records it at index i.
	start := func(i int) error {
		port := 0
		if o.Port > 0 {
			port = o.Port + i
		} else {
			addr, err := free()
			if err != nil {
				return err
			}
			_, p, _ := strings.Cut(addr, ":")
			port, _ = strconv.Atoi(p)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := child.Start("llama-server "+addr, "chroot", o.args(port, o.Cores[i%len(o.Cores)])...)
		if err != nil {
			return fmt.Errorf("llamacpp: %w", err)
		}
		if i < len(f.addrs) {
			f.g.Procs[i], f.addrs[i] = p, addr
		} else {
			f.g.Add(p)
			f.addrs = append(f.addrs, addr)
		}
		return nil
	}
	for i := range o.N {
		if err := start(i); err != nil {
			f.Stop()
			return nil, err
		}
	}
	// Servers load in parallel; wait for each in turn. A free port can be
	// taken between FreeAddr releasing it and the server binding it (a
	// client's ephemeral port): the server exits at start-up saying so,
	// and starts again on another port, up to three times.
	for i := range o.N {
		for try := 1; ; try++ {
			err := child.WaitReady(ctx, f.g.Procs[i], "http://"+f.addrs[i]+"/health", o.ReadyTimeout)
			if err == nil {
				break
			}
			if o.Port > 0 || try == 3 || !child.BindLost(err) {
				f.Stop()
				return nil, fmt.Errorf("llamacpp: %w", err)
			}
			f.g.Procs[i].Stop(0) // exited already: reaped
			if err := start(i); err != nil {
				f.Stop()
				return nil, err
			}
		}
	}
	return f, nil
}

// Addrs are the servers' "127.0.0.1:port" addresses, in start order.
func (f *Fleet) Addrs() []string { return f.addrs }

// Options are the options the fleet runs with (defaults filled in).
func (f *Fleet) Options() Options { return f.opts }

// Pids are the servers' process ids (each its own process group).
func (f *Fleet) Pids() []int {
	out := make([]int, len(f.g.Procs))
	for i, p := range f.g.Procs {
		out[i] = p.Pid()
	}
	return out
}

// Failure reports the first server that exited, with its last output.
func (f *Fleet) Failure() error { return f.g.Failure() }

// Stop kills every server's process group and waits for them. Safe to call
// more than once.
func (f *Fleet) Stop() { f.g.Stop() }
