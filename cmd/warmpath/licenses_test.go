package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// licensesDoc lists every module of go.mod with its licence. `make
// licenses` regenerates it (this test with -update); without -update the
// test fails when go.mod names a module, or a version, the file does not
// list, and when a listed licence no longer matches the module's licence
// file in the module cache.
const licensesDoc = "../../docs/licenses.md"

type modReq struct{ path, version string }

// goModRequires reads the require lines of go.mod (direct and indirect).
func goModRequires(t *testing.T) []modReq {
	t.Helper()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var out []modReq
	block := false
	for line := range strings.SplitSeq(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			block = true
			continue
		case block && line == ")":
			block = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimPrefix(line, "require ")
		case !block:
			continue
		}
		f := strings.Fields(line)
		if len(f) >= 2 {
			out = append(out, modReq{f[0], f[1]})
		}
	}
	if len(out) == 0 {
		t.Fatal("no require lines in go.mod")
	}
	slices.SortFunc(out, func(a, b modReq) int { return strings.Compare(a.path, b.path) })
	return out
}

// moduleDir is where the go command keeps a downloaded module
// (upper-case letters escaped as '!' + lower case).
func moduleDir(cache string, m modReq) string {
	var b strings.Builder
	for _, r := range m.path {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return filepath.Join(cache, filepath.FromSlash(b.String())+"@"+m.version)
}

// licenceOf names the licence of the module in dir by its licence file's
// text, and that file's name.
func licenceOf(dir string) (id, file string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", ""
	}
	for _, e := range ents {
		n := strings.ToUpper(e.Name())
		if e.IsDir() || !(strings.HasPrefix(n, "LICENSE") || strings.HasPrefix(n, "LICENCE") || strings.HasPrefix(n, "COPYING")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		return classify(string(b)), e.Name()
	}
	return "", ""
}

var spaces = regexp.MustCompile(`\s+`)

// classify names the licences a licence file's text holds, joined with
// AND when it holds several (go.yaml.in/yaml: Apache-2.0 and libyaml's MIT).
func classify(text string) string {
	t := spaces.ReplaceAllString(text, " ")
	var ids []string
	if strings.Contains(t, "Apache License") && strings.Contains(t, "Version 2.0") {
		ids = append(ids, "Apache-2.0")
	}
	if strings.Contains(t, "Redistribution and use in source and binary forms") {
		if strings.Contains(t, "Neither the name") || strings.Contains(t, "names of its contributors") {
			ids = append(ids, "BSD-3-Clause")
		} else {
			ids = append(ids, "BSD-2-Clause")
		}
	}
	if strings.Contains(t, "Permission to use, copy, modify, and distribute this software for any purpose") ||
		strings.Contains(t, "Permission to use, copy, modify, and/or distribute this software for any purpose") {
		ids = append(ids, "ISC")
	}
	if strings.Contains(t, "Permission is hereby granted, free of charge") {
		ids = append(ids, "MIT")
	}
	if strings.Contains(t, "Mozilla Public License") && strings.Contains(t, "2.0") {
		ids = append(ids, "MPL-2.0")
	}
	if len(ids) == 0 {
		return "unknown"
	}
	return strings.Join(ids, " AND ")
}

var docRow = regexp.MustCompile("^\\| `([^`]+)` \\| `([^`]+)` \\| ([^|]+?) \\| ([^|]+?) \\|")

func TestThirdPartyLicenses(t *testing.T) {
	reqs := goModRequires(t)
	cache := goEnv(t, "GOMODCACHE")
	if *updateGolden {
		writeLicensesDoc(t, reqs, cache)
	}
	b, err := os.ReadFile(licensesDoc)
	if err != nil {
		t.Fatalf("%v (make licenses writes it)", err)
	}
	for _, p := range licenseProblems(reqs, b, cache) {
		t.Error(p)
	}
}

// TestLicenseProblemsCaught: the check names a module go.mod gains, a
// changed version and a module go.mod dropped.
func TestLicenseProblemsCaught(t *testing.T) {
	doc := []byte("| `a.example/x` | `v1.0.0` | MIT | yes | `LICENSE` |\n| `a.example/gone` | `v1.0.0` | MIT | no | `LICENSE` |\n")
	reqs := []modReq{{"a.example/x", "v1.1.0"}, {"a.example/new", "v0.1.0"}}
	got := strings.Join(licenseProblems(reqs, doc, t.TempDir()), "\n")
	for _, want := range []string{"a.example/x is v1.1.0 in go.mod, v1.0.0 in", "go.mod requires a.example/new, not in", "lists a.example/gone, which go.mod no longer requires"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems:\n%s\nwant %q", got, want)
		}
	}
	if p := licenseProblems([]modReq{{"a.example/x", "v1.0.0"}, {"a.example/gone", "v1.0.0"}}, doc, t.TempDir()); len(p) != 0 {
		t.Errorf("a matching list has problems: %q", p)
	}
}

// licenseProblems compares go.mod's modules with the licences document.
func licenseProblems(reqs []modReq, doc []byte, cache string) []string {
	var out []string
	listed := map[string][]string{}
	for line := range strings.SplitSeq(string(doc), "\n") {
		if m := docRow.FindStringSubmatch(line); m != nil {
			listed[m[1]] = m[2:]
		}
	}
	for _, m := range reqs {
		row, ok := listed[m.path]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("go.mod requires %s, not in %s: run make licenses and review its licence", m.path, licensesDoc))
			continue
		case row[0] != m.version:
			out = append(out, fmt.Sprintf("%s is %s in go.mod, %s in %s: run make licenses", m.path, m.version, row[0], licensesDoc))
		}
		if id, _ := licenceOf(moduleDir(cache, m)); id != "" && id != row[1] {
			out = append(out, fmt.Sprintf("%s@%s: licence file reads %s, %s says %s", m.path, m.version, id, licensesDoc, row[1]))
		}
		if row[1] == "unknown" {
			out = append(out, fmt.Sprintf("%s: licence unknown: read its licence file and fix the classifier", m.path))
		}
		delete(listed, m.path)
	}
	for p := range listed {
		out = append(out, fmt.Sprintf("%s lists %s, which go.mod no longer requires: run make licenses", licensesDoc, p))
	}
	slices.Sort(out)
	return out
}

func goEnv(t *testing.T, key string) string {
	t.Helper()
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", key, err)
	}
	return strings.TrimSpace(string(out))
}

// writeLicensesDoc regenerates docs/licenses.md from go.mod, the module
// cache and the binaries' import graph.
func writeLicensesDoc(t *testing.T, reqs []modReq, cache string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./cmd/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	shipped := map[string]bool{}
	for p := range strings.SplitSeq(string(out), "\n") {
		shipped[p] = true
	}
	var b bytes.Buffer
	b.WriteString(`# Third-party licences

Every module go.mod requires, with the licence its licence file states.
Generated by ` + "`make licenses`" + ` from go.mod, the module cache and the import
graph of ` + "`./cmd/...`" + `; ` + "`make licenses-check`" + ` (part of ` + "`make test`" + `) fails when go.mod
gains a module or a version this file does not list, or a licence changes.
"In the binaries" says whether the module's code is linked into ` + "`warmpath`" + ` or
` + "`enginesim`" + ` (so ships with them); the others are used only by tests and tools.

warmpath's own licences: the Go code is Apache-2.0, the eBPF programs in
` + "`bpf/`" + ` are GPL-2.0-only OR MIT ([LICENSE](../LICENSE); why: [licensing](#why-apache-20-for-the-go-code)).

| module | version | licence | in the binaries | licence file |
|---|---|---|---|---|
`)
	for _, m := range reqs {
		id, file := licenceOf(moduleDir(cache, m))
		if id == "" {
			t.Fatalf("%s@%s: no licence file in the module cache (go mod download %s)", m.path, m.version, m.path)
		}
		in := "no"
		if shipped[m.path] {
			in = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | `%s` |\n", m.path, m.version, id, in, file)
	}
	b.WriteString(`
## Why Apache-2.0 for the Go code

Apache-2.0 rather than MIT: it carries an explicit patent grant (and a
patent-retaliation clause), which matters for routing and caching techniques
that others may patent; and it is the licence of the projects warmpath sits
between: vLLM, SGLang, llm-d, the Gateway API inference extension and
Prometheus' client libraries are all Apache-2.0, so a user vetting warmpath
reviews nothing new. Every licence above is permissive (Apache-2.0, MIT,
BSD, ISC) and compatible with shipping the binaries under Apache-2.0; their
notices go with a redistribution of the binaries.

The eBPF programs are dual MIT / GPL-2.0: the kernel lets only GPL-compatible
programs call GPL-only helpers, hence "Dual MIT/GPL" in the object's license
section, and MIT lets the same C be reused in non-GPL loaders (the usual
choice of cilium/ebpf's examples and Katran-style datapaths).
`)
	if err := os.WriteFile(licensesDoc, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
