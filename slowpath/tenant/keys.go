package tenant

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Classes are the priority classes, served in this order.
var Classes = []string{"high", "normal", "low"}

// DefaultClass is the class of a request that names none.
const DefaultClass = 1

// ParseClass returns the class index of a class name.
func ParseClass(name string) (int, bool) {
	for i, c := range Classes {
		if strings.EqualFold(name, c) {
			return i, true
		}
	}
	return 0, false
}

// Key is one API key's entry.
type Key struct {
	// Tenant is the tenant the key belongs to.
	Tenant string
	// Class is the key's priority class: its requests' default and the
	// highest a request with it may ask for.
	Class int
	// Hash is SHA-256 of the key.
	Hash [32]byte
}

// Tenant is one tenant's entry.
type Tenant struct {
	Name   string
	Budget Budget
	Class  int
}

// Keys is a parsed keys file.
type Keys struct {
	byHash  map[[32]byte]*Key
	tenants map[string]*Tenant
}

type fileKey struct {
	SHA256   string `yaml:"sha256"`
	Tenant   string `yaml:"tenant"`
	Priority string `yaml:"priority"`
}

type fileTenant struct {
	Priority string `yaml:"priority"`
	Budget   `yaml:",inline"`
}

type file struct {
	Tenants map[string]yaml.Node `yaml:"tenants"`
	Keys    []yaml.Node          `yaml:"keys"`
}

// HashKey returns the hex SHA-256 of an API key, the form the keys file
// holds (`printf %s "$KEY" | sha256sum`).
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// ParseKeys strictly decodes a keys file:
//
//	tenants:
//	  acme:
//	    priority: normal              # default class of its keys
//	    input_tokens_per_minute: 200000
//	    output_tokens_per_minute: 40000
//	    max_concurrent: 16
//	keys:
//	  - sha256: 5e88...               # hex SHA-256 of the key
//	    tenant: acme
//	    priority: high                # optional, else the tenant's
//
// An error names the line and the field.
func ParseKeys(b []byte) (*Keys, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	k := &Keys{byHash: make(map[[32]byte]*Key), tenants: make(map[string]*Tenant)}
	for name, n := range f.Tenants {
		var ft fileTenant
		if err := known(&n, "priority", "input_tokens_per_minute", "output_tokens_per_minute", "max_concurrent"); err != nil {
			return nil, fmt.Errorf("keys file: line %d: tenants.%s: %w", n.Line, name, err)
		}
		if err := n.Decode(&ft); err != nil {
			return nil, fmt.Errorf("keys file: line %d: tenants.%s: %w", n.Line, name, err)
		}
		t := &Tenant{Name: name, Budget: ft.Budget, Class: DefaultClass}
		switch {
		case name == "":
			return nil, fmt.Errorf("keys file: line %d: tenants: a tenant name must not be empty", n.Line)
		case ft.InputTokensPerMinute < 0:
			return nil, fmt.Errorf("keys file: line %d: tenants.%s.input_tokens_per_minute: must be >= 0 (0 = no limit), got %d", n.Line, name, ft.InputTokensPerMinute)
		case ft.OutputTokensPerMinute < 0:
			return nil, fmt.Errorf("keys file: line %d: tenants.%s.output_tokens_per_minute: must be >= 0 (0 = no limit), got %d", n.Line, name, ft.OutputTokensPerMinute)
		case ft.MaxConcurrent < 0:
			return nil, fmt.Errorf("keys file: line %d: tenants.%s.max_concurrent: must be >= 0 (0 = no limit), got %d", n.Line, name, ft.MaxConcurrent)
		}
		if ft.Priority != "" {
			c, ok := ParseClass(ft.Priority)
			if !ok {
				return nil, fmt.Errorf("keys file: line %d: tenants.%s.priority: must be one of %s, got %q", n.Line, name, strings.Join(Classes, ", "), ft.Priority)
			}
			t.Class = c
		}
		k.tenants[name] = t
	}
	for i, n := range f.Keys {
		var fk fileKey
		if err := known(&n, "sha256", "tenant", "priority"); err != nil {
			return nil, fmt.Errorf("keys file: line %d: keys[%d]: %w", n.Line, i, err)
		}
		if err := n.Decode(&fk); err != nil {
			return nil, fmt.Errorf("keys file: line %d: keys[%d]: %w", n.Line, i, err)
		}
		h, err := hex.DecodeString(fk.SHA256)
		if err != nil || len(h) != 32 {
			return nil, fmt.Errorf("keys file: line %d: keys[%d].sha256: must be 64 hex digits (the SHA-256 of the key), got %q", n.Line, i, fk.SHA256)
		}
		if fk.Tenant == "" {
			return nil, fmt.Errorf("keys file: line %d: keys[%d].tenant: required", n.Line, i)
		}
		t := k.tenants[fk.Tenant]
		if t == nil {
			t = &Tenant{Name: fk.Tenant, Class: DefaultClass}
			k.tenants[fk.Tenant] = t
		}
		key := &Key{Tenant: fk.Tenant, Class: t.Class, Hash: [32]byte(h)}
		if fk.Priority != "" {
			c, ok := ParseClass(fk.Priority)
			if !ok {
				return nil, fmt.Errorf("keys file: line %d: keys[%d].priority: must be one of %s, got %q", n.Line, i, strings.Join(Classes, ", "), fk.Priority)
			}
			key.Class = c
		}
		if _, dup := k.byHash[key.Hash]; dup {
			return nil, fmt.Errorf("keys file: line %d: keys[%d].sha256: the same key twice", n.Line, i)
		}
		k.byHash[key.Hash] = key
	}
	return k, nil
}

// Lookup returns the entry of an API key (the bearer token itself).
func (k *Keys) Lookup(key []byte) (*Key, bool) {
	if k == nil || len(key) == 0 {
		return nil, false
	}
	e, ok := k.byHash[sha256.Sum256(key)]
	return e, ok
}

// Tenant returns a tenant's entry (nil when unknown).
func (k *Keys) Tenant(name string) *Tenant {
	if k == nil {
		return nil
	}
	return k.tenants[name]
}

// Len returns the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.byHash)
}

// Tenants returns the tenants' names (any order).
func (k *Keys) Tenants() []string {
	if k == nil {
		return nil
	}
	out := make([]string, 0, len(k.tenants))
	for n := range k.tenants {
		out = append(out, n)
	}
	return out
}

// known refuses a mapping field not in names (yaml.Node.Decode does not
// apply the decoder's KnownFields).
func known(n *yaml.Node, names ...string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("must be a mapping")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		ok := false
		for _, m := range names {
			ok = ok || k == m
		}
		if !ok {
			return fmt.Errorf("line %d: field %s not found (want %s)", n.Content[i].Line, k, strings.Join(names, ", "))
		}
	}
	return nil
}
