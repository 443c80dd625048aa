package slowpath

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

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

// WatchConfigFile makes Reload re-read path, and with reload_interval > 0
// polls its content and reloads on change. loaded is the content the
// running config came from (nil: read it now). Call it once, before Serve.
func (s *Server) WatchConfigFile(path string, loaded []byte) error {
	if s.cfgPath != "" {
		return errors.New("watch config: already watching " + s.cfgPath)
	}
	if loaded == nil {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("watch config: %w", err)
		}
		loaded = b
	}
	s.reloadMu.Lock()
	s.cfgPath = path
	s.lastFile = loaded
	s.reloadMu.Unlock()
	if s.cfg.ReloadInterval > 0 {
		s.wg.Add(1)
		go s.watchFile()
	}
	return nil
}

// Reload re-reads the config file and applies its replica list and every
// other field tagged reload:"live" (routing knobs, limits, timeouts,
// health, scrape; see reload.go). A change to any other field is named in
// a warning and ignored until a restart. An invalid file changes nothing.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	path := s.cfgPath
	s.reloadMu.Unlock()
	if path == "" {
		return errors.New("reload: no config file (started without --config)")
	}
	_ = s.ReloadTLS() // logged and counted; the replica list reloads either way
	if err := CheckConfigPerms(path); err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("reload: %w", err)
	}
	b, err := readStable(path, os.ReadFile, settleTime)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("reload: %w", err)
	}
	return s.reloadBytes(b)
}

// errNoReplicas refuses a config file without replicas: an empty,
// comment-only or truncated file (`: > warmpath.yaml`) would otherwise
// remove every replica.
var errNoReplicas = errors.New("replicas: at least one replica required (an empty, comment-only or half-written file?)")

// settleTime is how long a config file's content must stay the same
// before it is applied (an editor or a script may be writing it in place).
const settleTime = 50 * time.Millisecond

// readStable reads the file with read until two reads settle apart return
// the same bytes (up to 20 reads), so a file being written in place is not
// applied half-written.
func readStable(path string, read func(string) ([]byte, error), settle time.Duration) ([]byte, error) {
	b, err := read(path)
	for range 20 {
		if err != nil {
			return nil, err
		}
		time.Sleep(settle)
		var again []byte
		again, err = read(path)
		if err == nil && bytes.Equal(again, b) {
			return b, nil
		}
		b = again
	}
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("config %s kept changing while being read; not applied", path)
}

func (s *Server) reloadBytes(b []byte) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg, err := ParseConfig(b)
	if err == nil && len(cfg.Replicas) == 0 {
		err = errNoReplicas
	}
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		s.log.Error("config reload rejected; keeping the running replica set", "err", err)
		return fmt.Errorf("reload: %w", err)
	}
	s.lastFile = b
	cur := s.conf()
	cfg.Listen, cfg.Admin = cur.Listen, cur.Admin // flags may override these
	live, restart := configChanges(cur, &cfg)
	next := *cur
	applyLive(&next, &cfg)
	if !reflect.DeepEqual(next.Routing, cur.Routing) {
		if err := s.brain.Retune(next.Routing); err != nil {
			s.m.reloads.WithLabelValues("error").Inc()
			return fmt.Errorf("reload: %w", err)
		}
	}
	s.publishConfig(&next)
	if len(restart) > 0 {
		s.log.Warn("config reload: these changes need a restart and are not applied", "fields", strings.Join(restart, ","))
	}
	if len(live) > 0 {
		s.log.Info("config reload applied", "fields", strings.Join(live, ","))
	}
	if err := s.applyReplicas(cfg.Replicas); err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("reload: %w", err)
	}
	s.m.reloads.WithLabelValues("ok").Inc()
	return nil
}

// ApplyReplicas replaces the replica list (what a reload does), for callers
// that manage replicas themselves.
func (s *Server) ApplyReplicas(list []ReplicaConfig) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	c := *s.conf()
	c.Replicas = slices.Clone(list)
	if err := c.Validate(); err != nil {
		return err
	}
	s.publishConfig(&c)
	return s.applyReplicas(list)
}

// watchFile polls the config file and reloads when its content changes.
func (s *Server) watchFile() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReloadInterval)
	defer t.Stop()
	missing := false
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		b, err := os.ReadFile(s.cfgPath)
		if err != nil {
			// Gone (or mid-rename): keep what runs, say so once.
			if !missing {
				missing = true
				s.log.Warn("config file unreadable; keeping the running replica set", "path", s.cfgPath, "err", err)
			}
			continue
		}
		if missing {
			missing = false
			s.log.Info("config file readable again", "path", s.cfgPath)
		}
		s.reloadMu.Lock()
		same := bytes.Equal(b, s.lastFile)
		s.reloadMu.Unlock()
		if same {
			continue
		}
		if b, err = readStable(s.cfgPath, os.ReadFile, settleTime); err != nil {
			s.m.reloads.WithLabelValues("error").Inc()
			s.log.Error("config reload rejected; keeping the running replica set", "err", err)
			continue // the next tick reads it again
		}
		if err := CheckConfigPerms(s.cfgPath); err != nil {
			s.m.reloads.WithLabelValues("error").Inc()
			s.log.Error("config reload rejected; keeping the running replica set", "err", err)
			s.reloadMu.Lock()
			s.lastFile = b
			s.reloadMu.Unlock()
			continue
		}
		s.log.Info("config file changed, reloading", "path", s.cfgPath)
		_ = s.reloadBytes(b)
		s.reloadMu.Lock()
		s.lastFile = b // do not retry a bad file until it changes again
		s.reloadMu.Unlock()
	}
}
