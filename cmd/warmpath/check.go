package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/warmpath/warmpath/slowpath"
)

// runCheck validates a config file without serving: every problem at once,
// one per line as FILE:LINE: FIELD: MESSAGE, then exit 1; a good file
// prints a one-line summary and exits 0. It checks what serve would refuse
// at start: the file's permissions, its YAML and values, an empty replica
// list and the hash key file.
func runCheck(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: warmpath check --config FILE\n\nValidate a config file without serving (exit 0: valid, 1: invalid, every problem listed).")
		fs.PrintDefaults()
	}
	path := fs.String("config", "", "YAML config `file` to validate")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	cfg, n, err := checkConfigFile(e.stderr, *path)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("check: %s: %d error%s", *path, n, plural(n))
	}
	models := map[string]bool{}
	for _, r := range cfg.Replicas {
		for _, m := range r.Models {
			models[m] = true
		}
	}
	fmt.Fprintf(e.stdout, "%s: ok (%d replica%s, %d model%s, fast path %s, cluster %s)\n", *path,
		len(cfg.Replicas), plural(len(cfg.Replicas)), len(models), plural(len(models)),
		onOff(cfg.Fastpath.Enabled()), onOff(cfg.Cluster.Enabled()))
	return nil
}

// checkConfigFile writes every problem of the file at path to w and
// returns the config and how many there were; err is for a file it could
// not read at all.
func checkConfigFile(w io.Writer, path string) (slowpath.Config, int, error) {
	n := 0
	report := func(line int, msg string) {
		n++
		if line > 0 {
			fmt.Fprintf(w, "%s:%d: %s\n", path, line, msg)
		} else {
			fmt.Fprintf(w, "%s: %s\n", path, msg)
		}
	}
	if err := slowpath.CheckConfigPerms(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return slowpath.Config{}, 0, fmt.Errorf("check: %w", err)
		}
		report(0, err.Error())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return slowpath.Config{}, 0, fmt.Errorf("check: %w", err)
	}
	cfg, err := slowpath.ParseConfig(b)
	var ces slowpath.ConfigErrors
	switch {
	case errors.As(err, &ces):
		for _, fe := range ces {
			report(fe.Line, fe.Err.Error())
		}
		return cfg, n, nil
	case err != nil:
		report(0, err.Error())
		return cfg, n, nil
	}
	if len(cfg.Replicas) == 0 {
		report(0, "replicas: at least one replica required (serve refuses an empty list unless --demo)")
	}
	if _, _, err := slowpath.LoadHashKey(cfg.HashKeyFile); err != nil {
		report(0, err.Error())
	}
	return cfg, n, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
