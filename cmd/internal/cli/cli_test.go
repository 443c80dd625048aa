package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseFlagsAndExitCode(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("n", 0, "")
	if err := ParseFlags(fs, []string{"-n", "3"}); err != nil {
		t.Fatal(err)
	}
	err := ParseFlags(fs, []string{"--nope"})
	var fe FlagError
	if !errors.As(err, &fe) || !errors.Is(err, ErrUsage) {
		t.Fatalf("bad flag: %T %v, want a FlagError that is ErrUsage", err, err)
	}
	if err := ParseFlags(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	var b bytes.Buffer
	for _, tc := range []struct {
		err  error
		code int
		out  string
	}{{nil, 0, ""}, {err, 2, ""}, {ErrUsage, 2, ""}, {errors.New("boom"), 1, "prog: boom\n"}} {
		b.Reset()
		if got := ExitCode("prog", tc.err, &b); got != tc.code || b.String() != tc.out {
			t.Errorf("ExitCode(%v) = %d, printed %q; want %d, %q", tc.err, got, b.String(), tc.code, tc.out)
		}
	}
}

func TestUsageAndRun(t *testing.T) {
	var ran []string
	cmds := []Command[string]{
		{"one", "the first", func(_ context.Context, args []string, e string) error {
			ran = append(ran, e+":"+strings.Join(args, ","))
			return nil
		}},
		{"help", "asks for help", func(context.Context, []string, string) error { return flag.ErrHelp }},
	}
	var b bytes.Buffer
	Usage(&b, "prog", cmds, "more: elsewhere")
	for _, want := range []string{"usage: prog <command> [flags]\n", "\n  one      the first\n", "`prog <command> -h`", "\nmore: elsewhere\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, b.String())
		}
	}
	if found, err := Run(context.Background(), cmds, []string{"one", "a", "b"}, "env"); !found || err != nil || strings.Join(ran, ";") != "env:a,b" {
		t.Fatalf("Run one: %v %v, ran %v", found, err, ran)
	}
	if found, err := Run(context.Background(), cmds, []string{"help"}, ""); !found || err != nil {
		t.Fatalf("Run help: %v %v; want found and nil (flag.ErrHelp is success)", found, err)
	}
	if found, _ := Run(context.Background(), cmds, []string{"two"}, ""); found {
		t.Fatal("Run two: found")
	}
}
