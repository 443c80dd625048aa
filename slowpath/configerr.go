package slowpath

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// FieldError is one problem in a config file: the field's path (limits.read_timeout,
// replicas[1].weight; empty for a YAML syntax error), its line in the file
// (0 when the file does not set it; then the line of its closest parent
// that it does set, if any) and what is wrong. Err's text starts with the
// field path.
type FieldError struct {
	Field string
	Line  int
	Err   error
}

func (e *FieldError) Error() string {
	if e.Line > 0 {
		return "line " + strconv.Itoa(e.Line) + ": " + e.Err.Error()
	}
	return e.Err.Error()
}

func (e *FieldError) Unwrap() error { return e.Err }

// ConfigErrors is every problem ParseConfig found in one file, in line
// order: type errors (a string where a duration belongs), unknown fields
// and validation errors together.
type ConfigErrors []*FieldError

func (es ConfigErrors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap exposes each FieldError to errors.Is and errors.As.
func (es ConfigErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// sort orders by line; errors without a line go last, in their order.
func (es ConfigErrors) sort() {
	slices.SortStableFunc(es, func(a, b *FieldError) int {
		la, lb := a.Line, b.Line
		if la == 0 {
			la = 1 << 30
		}
		if lb == 0 {
			lb = 1 << 30
		}
		return la - lb
	})
}

// fieldError is one validation problem with the path of the field it is
// about; validationErrors reads the path from here, never from the text.
// Error prints "field: message" (just the message when field is empty).
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string {
	if e.field == "" {
		return e.err.Error()
	}
	return e.field + ": " + e.err.Error()
}

func (e *fieldError) Unwrap() error { return e.err }
func (e *fieldError) Field() string { return e.field }

// fieldErrorf is fmt.Errorf for a problem with one field (%w wraps as
// usual); the error prints "field: " and the formatted message.
func fieldErrorf(field, format string, a ...any) error {
	return &fieldError{field: field, err: fmt.Errorf(format, a...)}
}

// errorField is the field path an error carries: that of the outermost
// error in its chain with a Field method (fieldError, prefixedErr); ok is
// false when none has one.
func errorField(err error) (field string, ok bool) {
	var f interface{ Field() string }
	if errors.As(err, &f) {
		return f.Field(), true
	}
	return "", false
}

// fieldErrs collects validation errors; Validate returns errors.Join of
// them.
type fieldErrs []error

func (v *fieldErrs) add(err error) {
	if err != nil {
		*v = append(*v, err)
	}
}

// addf adds a problem with field: fieldErrorf(field, format, a...).
func (v *fieldErrs) addf(field, format string, a ...any) {
	*v = append(*v, fieldErrorf(field, format, a...))
}

// addPrefixed adds a sub-config's errors (one or an errors.Join of many)
// with their field paths prefixed ("routing." + "load_factor"). The
// affinity and cluster packages' Validate errors are plain errors whose
// message starts with the field's name ("load_factor 0.5: want >= 1",
// "nkey_seed_file, creds_file: set at most one"); for those the name is
// that first word (their Validate docs say the messages name the field).
func (v *fieldErrs) addPrefixed(prefix string, err error) {
	for _, e := range flatten(err) {
		field, ok := errorField(e)
		if !ok {
			msg := e.Error()
			field = msg
			if end := strings.IndexAny(msg, " :,"); end > 0 {
				field = msg[:end]
			}
		}
		*v = append(*v, &prefixedErr{field: prefix + field, prefix: prefix, err: e})
	}
}

// prefixedErr is a sub-config's error under its parent's prefix: it
// prints the prefix and the sub-config's message, and carries the full
// field path.
type prefixedErr struct {
	field  string
	prefix string
	err    error
}

func (p *prefixedErr) Error() string { return p.prefix + p.err.Error() }
func (p *prefixedErr) Unwrap() error { return p.err }
func (p *prefixedErr) Field() string { return p.field }

// flatten undoes errors.Join, recursively; nil gives nil.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// validationErrors turns Validate's error into FieldErrors, each with the
// field its error carries (errorField; "" for an error without one) and
// that field's line in src. A field that already has a decode error (in
// typeErrs) is not reported again: it kept its default, and what
// validation says of it follows from that.
func validationErrors(src []byte, err error, typeErrs ConfigErrors) ConfigErrors {
	list := flatten(err)
	if len(list) == 0 {
		return nil
	}
	var root yaml.Node
	_ = yaml.Unmarshal(src, &root)
	out := make(ConfigErrors, 0, len(list))
	for _, e := range list {
		field, _ := errorField(e)
		if slices.ContainsFunc(typeErrs, func(t *FieldError) bool { return t.Field != "" && t.Field == field }) {
			continue
		}
		out = append(out, &FieldError{Field: field, Line: fieldLine(&root, field), Err: e})
	}
	return out
}

// syntaxError is a file the YAML parser refused: "yaml: line 3: did not
// find expected key". The parser names the line where the enclosing block
// starts; the line reported is the first one whose addition makes the
// file unparseable, which is where the mistake is.
func syntaxError(src []byte, err error) *FieldError {
	msg := err.Error()
	m := yamlLineRe.FindStringSubmatch(msg)
	if m == nil {
		return &FieldError{Err: err}
	}
	n, _ := strconv.Atoi(m[1])
	if lines := bytes.SplitAfter(src, []byte("\n")); len(lines) <= 5000 {
		var v any
		for k := n; k <= len(lines); k++ {
			if yaml.Unmarshal(bytes.Join(lines[:k], nil), &v) != nil {
				n = k
				break
			}
		}
	}
	return &FieldError{Line: n, Err: errors.New("yaml: " + m[2])}
}

var (
	yamlLineRe   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	unknownRe    = regexp.MustCompile(`^line (\d+): field (\S+) not found in type (\S+)$`)
	dupFieldRe   = regexp.MustCompile(`^line (\d+): field (\S+) already set in type (\S+)$`)
	unmarshalRe  = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `(.*)`)? into (\\S+)$")
	lineOnlyRe   = regexp.MustCompile(`^line (\d+): (.*)$`)
	goTypeWanted = map[string]string{
		"time.Duration": "a duration such as 30s or 1m30s",
		"int":           "an integer", "int64": "an integer", "uint32": "an integer", "uint64": "an integer",
		"float64": "a number", "bool": "true or false", "string": "a string",
	}
)

// decodeErrors gives each of the decoder's messages ("line 7: cannot
// unmarshal !!str `soon` into time.Duration") the path of the field it is
// about, found by position in the file's node tree.
func decodeErrors(src []byte, te *yaml.TypeError) ConfigErrors {
	var root yaml.Node
	_ = yaml.Unmarshal(src, &root)
	idx := map[int][]nodeRef{}
	indexNodes(&root, "", idx)
	out := make(ConfigErrors, 0, len(te.Errors))
	for _, msg := range te.Errors {
		out = append(out, decodeError(idx, msg))
	}
	return out
}

func decodeError(idx map[int][]nodeRef, msg string) *FieldError {
	if m := unknownRe.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		field := pickKey(idx[line], m[2])
		return &FieldError{Field: field, Line: line, Err: fmt.Errorf("%s: unknown field", field)}
	}
	if m := dupFieldRe.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		field := pickKey(idx[line], m[2])
		return &FieldError{Field: field, Line: line, Err: fmt.Errorf("%s: set twice", field)}
	}
	if m := unmarshalRe.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		ref, ok := pickValue(idx[line], m[2], m[3])
		want := goTypeWanted[m[4]]
		switch {
		case want != "":
		case strings.HasPrefix(m[4], "[]"):
			want = "a list"
		default:
			want = "a mapping" // structs and maps
		}
		if !ok {
			return &FieldError{Line: line, Err: fmt.Errorf("want %s, got %s", want, m[2])}
		}
		got := m[2]
		if ref.n.Kind == yaml.ScalarNode {
			got = strconv.Quote(ref.n.Value)
		} else if ref.n.Kind == yaml.SequenceNode {
			got = "a list"
		} else if ref.n.Kind == yaml.MappingNode {
			got = "a mapping"
		}
		if ref.path == "" {
			return &FieldError{Line: line, Err: fmt.Errorf("the file must be a mapping of config fields, got %s", got)}
		}
		return &FieldError{Field: ref.path, Line: line, Err: fmt.Errorf("%s: want %s, got %s", ref.path, want, got)}
	}
	if m := lineOnlyRe.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		// A field's own unmarshaler (cluster.nats_url): the node is the
		// value on that line.
		if refs := values(idx[line]); len(refs) > 0 {
			r := refs[len(refs)-1]
			return &FieldError{Field: r.path, Line: line, Err: fmt.Errorf("%s: %s", r.path, m[2])}
		}
		return &FieldError{Line: line, Err: errors.New(m[2])}
	}
	return &FieldError{Err: errors.New(msg)}
}

// nodeRef is one node of the file with its field path; key marks a mapping
// key (the node an unknown-field message points at).
type nodeRef struct {
	path string
	n    *yaml.Node
	key  bool
}

// indexNodes records every node of the tree by line, in document order.
func indexNodes(n *yaml.Node, path string, idx map[int][]nodeRef) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			indexNodes(c, path, idx)
		}
	case yaml.MappingNode:
		idx[n.Line] = append(idx[n.Line], nodeRef{path: path, n: n})
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			kp := k.Value
			if path != "" {
				kp = path + "." + k.Value
			}
			idx[k.Line] = append(idx[k.Line], nodeRef{path: kp, n: k, key: true})
			indexNodes(v, kp, idx)
		}
	case yaml.SequenceNode:
		idx[n.Line] = append(idx[n.Line], nodeRef{path: path, n: n})
		for i, c := range n.Content {
			indexNodes(c, path+"["+strconv.Itoa(i)+"]", idx)
		}
	default:
		idx[n.Line] = append(idx[n.Line], nodeRef{path: path, n: n})
	}
}

func pickKey(refs []nodeRef, name string) string {
	for _, r := range refs {
		if r.key && r.n.Value == name {
			return r.path
		}
	}
	return name
}

func values(refs []nodeRef) []nodeRef {
	var out []nodeRef
	for _, r := range refs {
		if !r.key {
			out = append(out, r)
		}
	}
	return out
}

// pickValue finds the value node a type error is about: on its line, of
// its kind, and with its (possibly truncated: "abcdefg...") text.
func pickValue(refs []nodeRef, tag, text string) (nodeRef, bool) {
	var cands []nodeRef
	for _, r := range values(refs) {
		switch tag {
		case "!!seq":
			if r.n.Kind == yaml.SequenceNode {
				cands = append(cands, r)
			}
		case "!!map":
			if r.n.Kind == yaml.MappingNode {
				cands = append(cands, r)
			}
		default:
			if r.n.Kind == yaml.ScalarNode {
				cands = append(cands, r)
			}
		}
	}
	if len(cands) <= 1 || text == "" {
		if len(cands) == 0 {
			return nodeRef{}, false
		}
		return cands[0], true
	}
	prefix, truncated := strings.CutSuffix(text, "...")
	for _, r := range cands {
		if r.n.Value == text || (truncated && strings.HasPrefix(r.n.Value, prefix)) {
			return r, true
		}
	}
	return cands[0], true
}

// fieldLine finds the line of a field path ("routing.load_factor",
// "replicas[1].weight") in the file's node tree: the deepest part of the
// path the file sets; 0 when it sets none of it.
func fieldLine(root *yaml.Node, field string) int {
	if root == nil || len(root.Content) == 0 {
		return 0
	}
	n, line := root.Content[0], 0
	for seg := range strings.SplitSeq(field, ".") {
		name, idx, hasIdx := seg, 0, false
		if i := strings.IndexByte(seg, '['); i > 0 && strings.HasSuffix(seg, "]") {
			v, err := strconv.Atoi(seg[i+1 : len(seg)-1])
			if err != nil {
				return line
			}
			name, idx, hasIdx = seg[:i], v, true
		}
		if n.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for k := 0; k+1 < len(n.Content); k += 2 {
			if n.Content[k].Value == name {
				line, next = n.Content[k].Line, n.Content[k+1]
				break
			}
		}
		if next == nil {
			return line
		}
		if hasIdx {
			if next.Kind != yaml.SequenceNode || idx >= len(next.Content) {
				return line
			}
			next = next.Content[idx]
			line = next.Line
		}
		n = next
	}
	return line
}
