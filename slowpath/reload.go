package slowpath

import (
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// What a reload may change, and what /debug/config may show, is declared on
// the config structs:
//
//   - reload:"live" on a field: a reload applies it to the running server;
//     reload:"restart": a change is named in the reload warning and ignored
//     until a restart. A field without the tag takes its parent's; one with
//     neither is treated as restart, and TestEveryConfigFieldClassified
//     fails until it is tagged.
//   - secret:"true" on a string field: /debug/config shows "<redacted>"
//     instead of a set value; secret:"url": a URL list shown with its
//     passwords replaced. Fields named like a secret (token, password,
//     api_key, secret, credentials; not the *_file paths that name where
//     one is) are redacted even without the tag.
const (
	reloadLive    = "live"
	reloadRestart = "restart"
	redacted      = "<redacted>"
)

// conf is the running configuration: the one New was given with the live
// fields of every applied reload since. Restart-only fields keep their
// start values (s.cfg holds those too).
func (s *Server) conf() *Config { return s.live.Load() }

// reloadSignal returns a channel closed at the next applied reload (the
// replica loops re-read their intervals then).
func (s *Server) reloadSignal() <-chan struct{} { return *s.reloaded.Load() }

// publishConfig makes next the running configuration and wakes the loops.
func (s *Server) publishConfig(next *Config) {
	s.live.Store(next)
	ch := make(chan struct{})
	close(*s.reloaded.Swap(&ch))
}

// configLeaf is one configurable value: its YAML path and reload class.
type configLeaf struct {
	path, class string
}

// walkConfig calls fn for every leaf field of the Config type (slices,
// maps and scalars; structs are descended), with a and b the field's
// values in two configs (b may be invalid when only one is walked).
func walkConfig(a, b reflect.Value, path, class string, fn func(l configLeaf, a, b reflect.Value)) {
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		p := name
		if path != "" {
			p = path + "." + name
		}
		c := class
		if tc := f.Tag.Get("reload"); tc != "" {
			c = tc
		}
		fa := a.Field(i)
		var fb reflect.Value
		if b.IsValid() {
			fb = b.Field(i)
		}
		if f.Type.Kind() == reflect.Struct {
			walkConfig(fa, fb, p, c, fn)
			continue
		}
		fn(configLeaf{path: p, class: c}, fa, fb)
	}
}

var secretName = regexp.MustCompile(`(^|_)(token|tokens|password|passwd|secret|secrets|api_key|api_keys|apikey|credentials|bearer)$`)

func secretKind(f reflect.StructField, name string) string {
	if s := f.Tag.Get("secret"); s != "" {
		return s
	}
	if secretName.MatchString(name) {
		return "true"
	}
	return ""
}

// configChanges lists the leaf fields that differ between the running
// config and a newly loaded one, split by reload class.
func configChanges(cur, next *Config) (live, restart []string) {
	walkConfig(reflect.ValueOf(cur).Elem(), reflect.ValueOf(next).Elem(), "", "", func(l configLeaf, a, b reflect.Value) {
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			return
		}
		if l.class == reloadLive {
			live = append(live, l.path)
		} else {
			restart = append(restart, l.path)
		}
	})
	return live, restart
}

// applyLive copies every live field of src into dst.
func applyLive(dst, src *Config) {
	walkConfig(reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem(), "", "", func(l configLeaf, d, s reflect.Value) {
		if l.class == reloadLive {
			d.Set(s)
		}
	})
}

// Redacted returns a copy of c with every secret value replaced (see the
// secret tag above): what /debug/config shows. Lists of blocks (replicas,
// and any other) are copied and redacted element by element; c is not
// changed.
func Redacted(c Config) Config {
	redactStruct(reflect.ValueOf(&c).Elem())
	return c
}

// redactStruct redacts the secret fields of the struct v (addressable),
// descending into blocks and lists of blocks, which it replaces by copies
// first so the caller's slices are never written.
func redactStruct(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fv := v.Field(i)
		switch {
		case f.Type.Kind() == reflect.Struct:
			redactStruct(fv)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct && fv.Len() > 0:
			cp := reflect.MakeSlice(f.Type, fv.Len(), fv.Len())
			reflect.Copy(cp, fv)
			for j := range cp.Len() {
				redactStruct(cp.Index(j))
			}
			fv.Set(cp)
		default:
			redactValue(secretKind(f, name), fv)
		}
	}
}

func redactValue(kind string, f reflect.Value) {
	if kind == "" {
		return
	}
	switch f.Kind() {
	case reflect.String:
		if f.Len() > 0 {
			f.SetString(redacted)
		}
	case reflect.Slice:
		if f.Type().Elem().Kind() != reflect.String {
			return
		}
		out := reflect.MakeSlice(f.Type(), f.Len(), f.Len())
		for i := range f.Len() {
			s := f.Index(i).String()
			if kind == "url" {
				s = redactURL(s)
			} else if s != "" {
				s = redacted
			}
			out.Index(i).SetString(s)
		}
		f.Set(out)
	}
}

// redactURL hides a URL's password (and a bare user, which NATS takes as a
// token); a string that does not parse is hidden whole.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return redacted
	}
	if u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	} else {
		u.User = url.User("xxxxx")
	}
	return u.String()
}

// debugConfig serves GET /debug/config: the running configuration (live
// fields as last reloaded, the replica list as last applied) as YAML that
// `warmpath check` accepts, secrets redacted.
func (s *Server) debugConfig(w http.ResponseWriter, _ *http.Request) {
	b, err := yaml.Marshal(Redacted(*s.conf()))
	if err != nil {
		s.log.Error("debug/config: encode", "err", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write(AppendError(nil, "Could not encode the configuration: "+err.Error(), "internal_error", "", ""))
		return
	}
	w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
	_, _ = w.Write(b)
}
