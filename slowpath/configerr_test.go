package slowpath

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"
)

// TestValidationErrorFieldFromType: validationErrors takes each error's
// field from its type (fieldError, or a sub-config's error under
// addPrefixed), never from its text: a message whose text starts with
// another name keeps its typed field, and an untyped message that looks
// like "field: ..." has no field.
func TestValidationErrorFieldFromType(t *testing.T) {
	src := []byte("limits:\n" + // 1
		"  read_timeout: -1s\n" + // 2
		"tenants:\n" + // 3
		"  queue:\n" + // 4
		"    timeout: -1s\n" + // 5
		"routing:\n" + // 6
		"  load_factor: 0.5\n") // 7
	prefixed := func(prefix string, err error) error {
		var v fieldErrs
		v.addPrefixed(prefix, err)
		return v[0]
	}
	for _, tc := range []struct {
		name      string
		err       error
		field     string
		line      int
		text      string
		typeErrs  ConfigErrors
		wantDrops bool
	}{
		{name: "typed", err: fieldErrorf("limits.read_timeout", "must be > 0, got %s", -time.Second),
			field: "limits.read_timeout", line: 2, text: "line 2: limits.read_timeout: must be > 0, got -1s"},
		{name: "typed under another name", err: fmt.Errorf("reload: %w", fieldErrorf("limits.read_timeout", "must be > 0")),
			field: "limits.read_timeout", line: 2, text: "line 2: reload: limits.read_timeout: must be > 0"},
		{name: "untyped looks like a field", err: errors.New("limits.read_timeout: must be > 0"),
			field: "", line: 0, text: "limits.read_timeout: must be > 0"},
		{name: "typed empty field", err: fieldErrorf("", "no replicas"),
			field: "", line: 0, text: "no replicas"},
		{name: "prefixed typed", err: prefixed("tenants.", fieldErrorf("queue.timeout", "must be > 0")),
			field: "tenants.queue.timeout", line: 5, text: "line 5: tenants.queue.timeout: must be > 0"},
		{name: "prefixed typed under another name", err: prefixed("tenants.", fmt.Errorf("check: %w", fieldErrorf("queue.timeout", "must be > 0"))),
			field: "tenants.queue.timeout", line: 5, text: "line 5: tenants.check: queue.timeout: must be > 0"},
		{name: "prefixed foreign", err: prefixed("routing.", errors.New("load_factor 0.5: want >= 1")),
			field: "routing.load_factor", line: 7, text: "line 7: routing.load_factor 0.5: want >= 1"},
		{name: "already a decode error", err: fieldErrorf("limits.read_timeout", "must be > 0"),
			typeErrs: ConfigErrors{{Field: "limits.read_timeout", Line: 2, Err: errors.New("limits.read_timeout: want a duration")}}, wantDrops: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := validationErrors(src, errors.Join(tc.err), tc.typeErrs)
			if tc.wantDrops {
				if len(got) != 0 {
					t.Fatalf("got %v, want it dropped (its field has a decode error)", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("got %d errors (%v), want 1", len(got), got)
			}
			if got[0].Field != tc.field || got[0].Line != tc.line || got[0].Error() != tc.text {
				t.Errorf("got field %q line %d %q, want field %q line %d %q", got[0].Field, got[0].Line, got[0], tc.field, tc.line, tc.text)
			}
		})
	}
}

// TestFieldErrorText: a fieldError prints "field: message" and wraps what
// its format wraps.
func TestFieldErrorText(t *testing.T) {
	err := fieldErrorf("tls.cert_file", "%w", fs.ErrNotExist)
	if got, want := err.Error(), "tls.cert_file: "+fs.ErrNotExist.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is(err, fs.ErrNotExist) = false through fieldErrorf's %w")
	}
	if f, ok := errorField(fmt.Errorf("serve: %w", err)); !ok || f != "tls.cert_file" {
		t.Errorf("errorField = %q, %v, want tls.cert_file", f, ok)
	}
}
