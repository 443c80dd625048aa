package layout

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/warmpath/warmpath"

// pkg is the part of `go list -json` the rules read.
type pkg struct {
	ImportPath string
	Imports    []string // production (non-test) imports
	Deps       []string
}

// list runs `go list -json` on patterns from the module root.
func list(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("needs the go tool: %v", err)
	}
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps"}, patterns...)...)
	cmd.Dir = "../../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %v: %v\n%s", patterns, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", patterns, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %v: no packages", patterns)
	}
	return pkgs
}

// under reports whether path is the module's package dir or one below it.
func under(path, dir string) bool {
	p := module + "/" + dir
	return path == p || strings.HasPrefix(path, p+"/")
}

// within reports whether path is the standard or third-party package prefix
// or one below it.
func within(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// rule is one import boundary: no production package under from imports
// a package under any of the banned prefixes (module dirs, or standard
// and third-party import paths). Test files may import what they need
// (enginesim as a fake engine, for one).
type rule struct {
	name   string
	from   func(path string) bool
	banned []string // import path prefixes; "./dir" is a module dir
}

func (r rule) bans(imp string) bool {
	for _, b := range r.banned {
		if d, ok := strings.CutPrefix(b, "./"); ok {
			if under(imp, d) {
				return true
			}
		} else if within(imp, b) {
			return true
		}
	}
	return false
}

var rules = []rule{
	{
		// The brain is pure: the simulator drives it at millions of
		// decisions per second in virtual time (affinity/purity_test.go
		// also bans the wall clock).
		name: "affinity imports no I/O",
		from: func(p string) bool { return under(p, "affinity") },
		banned: []string{"net", "os", "syscall", "io/fs", "io/ioutil", "path/filepath", "log", "golang.org/x/sys",
			"github.com/valyala/fasthttp", "github.com/cilium/ebpf", "github.com/nats-io", "./bpf", "./fastpath", "./slowpath", "./bench", "./cmd"},
	},
	{
		name:   "bench is imported by nothing but cmd and bench",
		from:   func(p string) bool { return !under(p, "bench") && !under(p, "cmd") },
		banned: []string{"./bench"},
	},
	{
		name:   "fastpath imports no slowpath",
		from:   func(p string) bool { return under(p, "fastpath") },
		banned: []string{"./slowpath"},
	},
	{
		name:   "slowpath imports no fastpath",
		from:   func(p string) bool { return under(p, "slowpath") },
		banned: []string{"./fastpath"},
	},
}

// TestImportRules holds the tree's boundaries (depguard-style, on direct
// production imports): `make lint` runs it.
func TestImportRules(t *testing.T) {
	pkgs := list(t, "./...")
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for _, p := range pkgs {
				if !r.from(p.ImportPath) {
					continue
				}
				checked++
				for _, imp := range p.Imports {
					if r.bans(imp) {
						t.Errorf("%s imports %s", strings.TrimPrefix(p.ImportPath, module+"/"), imp)
					}
				}
			}
			if checked == 0 {
				t.Fatal("the rule matched no package")
			}
		})
	}
}

// TestRulesCatch: each rule flags an import it exists to stop.
func TestRulesCatch(t *testing.T) {
	for _, tc := range []struct {
		rule, from, imp string
		want            bool
	}{
		{"affinity imports no I/O", module + "/affinity", "net/http", true},
		{"affinity imports no I/O", module + "/affinity", "os", true},
		{"affinity imports no I/O", module + "/affinity", "github.com/valyala/fasthttp", true},
		{"affinity imports no I/O", module + "/affinity", "network", false},
		{"affinity imports no I/O", module + "/affinity", "math/bits", false},
		{"bench is imported by nothing but cmd and bench", module + "/slowpath", module + "/bench/enginesim", true},
		{"bench is imported by nothing but cmd and bench", module + "/cmd/warmpath", module + "/bench/enginesim", false},
		{"bench is imported by nothing but cmd and bench", module + "/bench/live", module + "/bench/suite", false},
		{"bench is imported by nothing but cmd and bench", module + "/slowpath", module + "/benchmarks", false},
		{"fastpath imports no slowpath", module + "/fastpath/steer", module + "/slowpath", true},
		{"slowpath imports no fastpath", module + "/slowpath/cluster", module + "/fastpath/steer", true},
		{"slowpath imports no fastpath", module + "/slowpath", module + "/fastpath", true},
		{"slowpath imports no fastpath", module + "/slowpath", module + "/fastpathological", false},
	} {
		i := slices.IndexFunc(rules, func(r rule) bool { return r.name == tc.rule })
		if i < 0 {
			t.Fatalf("no rule %q", tc.rule)
		}
		r := rules[i]
		if got := r.from(tc.from) && r.bans(tc.imp); got != tc.want {
			t.Errorf("%s: %s importing %s flagged %v, want %v", tc.rule, tc.from, tc.imp, got, tc.want)
		}
	}
}

// TestRouterLinksNoBench: the router binary links bench/enginesim (the
// engines of `serve --demo`) and no other bench package: the simulator,
// the suites and the nginx orchestration are warmpath-bench's.
func TestRouterLinksNoBench(t *testing.T) {
	p := list(t, "./cmd/warmpath")[0]
	var got []string
	for _, d := range p.Deps {
		if under(d, "bench") {
			got = append(got, strings.TrimPrefix(d, module+"/"))
		}
	}
	if want := []string{"bench/enginesim"}; !slices.Equal(got, want) {
		t.Errorf("cmd/warmpath links %v; want only %v", got, want)
	}
	// And the bench binary does link them (the check reads real deps).
	b := list(t, "./cmd/warmpath-bench")[0]
	for _, want := range []string{"bench/sim", "bench/live", "bench/suite", "bench/analyze"} {
		if !slices.Contains(b.Deps, module+"/"+want) {
			t.Errorf("cmd/warmpath-bench does not link %s", want)
		}
	}
}
